"""How many causality audits a night paid, and how many it would pay with the audit made at the keep (issue 54):
read from a repository's ledger and its runs' evaluation.json, nothing run.

    python benchmarks/audits.py REPO [REPO ...]     # a repository an `autoresearch loop` ran in

When scored: every run that may be kept (its test split scored) is audited as it is scored (the harness before
issue 54). At the keep: a candidate's run only if its configuration's series ends in a keep; a baseline's run, or
any run under the naive rule, as before (study.Study.audit_at_keep). Seconds: the audits' median (causal_seconds of
the audited evaluations, or audit.json's), times the count; the audit at the keep also pays a fresh evaluator's
start and the val and test passes again (its `seconds` less its `causal_seconds`).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def night(repo: Path) -> dict:
    from autoresearch import audit, descriptions, ledger, state
    rows = [r for r in ledger.read(state.results(repo)) if r.run_id]
    kept = {r.config for r in rows if r.status == "keep"}
    when_scored, at_keep, audit_s, extra_s = 0, 0, [], []
    for r in rows:
        run_dir = state.run_dir(repo, r.run_id)
        try:
            scored = json.loads((run_dir / state.EVALUATION).read_text())
        except (OSError, ValueError):
            continue
        done = json.loads((run_dir / audit.AUDIT).read_text()) if (run_dir / audit.AUDIT).exists() else {}
        if scored.get("audited"):
            audit_s.append(scored["causal_seconds"])
        if done.get("audited"):
            audit_s.append(done["causal_seconds"])
            extra_s.append(done["seconds"] - done["causal_seconds"])
        if scored.get("test_bpb") is None:
            continue  # never a run that may be kept: audited under neither
        when_scored += 1
        at_keep += descriptions.is_baseline(r.description) or r.config in kept
    per = statistics.median(audit_s) if audit_s else None
    return {"repo": str(repo), "runs": len(rows), "audited_when_scored": when_scored, "audited_at_keep": at_keep,
            "audit_s_median": per, "extra_s_at_keep_median": statistics.median(extra_s) if extra_s else None,
            "seconds_when_scored": per and round(per * when_scored, 1),
            "seconds_at_keep": per and round(per * at_keep, 1)}


def main(argv=None) -> int:
    repos = [Path(p) for p in (argv if argv is not None else sys.argv[1:])]
    if not repos:
        print(__doc__)
        return 2
    for repo in repos:
        print(json.dumps(night(repo)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
