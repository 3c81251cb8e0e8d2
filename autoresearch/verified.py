"""A verification's table (verify.py), from the ledger alone: each keep's contribution and the transfer's gains,
each the mean of paired differences over seeds +- its standard error. Read by `verify`, `report`, `status` and
the dashboard (facts.py); it only reads.

A paired difference is one seed's val_bpb of one arm minus the other's. Over n seeds: the mean, its standard error
(the differences' standard deviation / sqrt(n), none for one seed), and "not distinguishable from zero" when
|mean| <= DISTINCT_SEMS standard errors (or there is no standard error): docs/verify.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import fmean, stdev

from autoresearch import baseline, decide, descriptions, ledger, state

DISTINCT_SEMS = 2.0  # |mean| <= this many standard errors: not distinguishable from zero


def state_file(repo: Path, tag: str) -> Path:
    """The verification's progress and notes (what could not be verified), written by verify.py."""
    return state.state_dir(repo) / "verify" / f"{tag}.json"


def read_state(repo: Path | None, tag: str) -> dict:
    try:
        return json.loads(state_file(repo, tag).read_text()) if repo is not None else {}
    except (OSError, ValueError):
        return {}


def paired(one: dict[int, float], other: dict[int, float]) -> dict:
    """one - other on their common seeds (seed -> val_bpb): n, mean, sem and whether it is distinguishable."""
    seeds = sorted(one.keys() & other.keys())
    diffs = [one[s] - other[s] for s in seeds]
    mean = fmean(diffs) if diffs else None
    sem = stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) >= 2 else None
    distinct = mean is not None and sem is not None and abs(mean) > DISTINCT_SEMS * sem
    return {"n": len(diffs), "seeds": seeds, "mean": mean, "sem": sem, "distinguishable": distinct}


def _values(pairs, kind: str, arm: str, budget: float | None = None, scale: str = "") -> dict[int, float]:
    return {r.seed: r.val_bpb for r, v in pairs if r.val_bpb > 0 and v["kind"] == kind and v["arm"] == arm
            and (budget is None or r.budget_s == budget) and v["scale"] == scale}


def table(rows: list[ledger.Row], notes: list[str] | None = None) -> dict | None:
    """The latest verified champion's table, or None before any verification. rows: the tag's."""
    found = [(r, descriptions.parse_verification(r.description)) for r in rows if r.status == "verify"]
    found = [(r, v) for r, v in found if v]
    if not found:
        return None
    champ7 = found[-1][1]["champion"]
    mine = [(r, v) for r, v in found if v["champion"] == champ7]
    kept = next((r for r in rows if r.status == "keep" and r.commit[:7] == champ7), None)
    night = kept.budget_s if kept else None
    champion = _values(mine, "champion", "champion")  # beside the ablations, on their seeds
    moves = {r.commit[:7]: descriptions.base_description(r.description) for r in rows if r.status == "keep"}
    ablation = []
    for keep in dict.fromkeys(v["arm"] for _, v in mine if v["kind"] == "ablate"):
        failed = sum(1 for r, v in mine if v["kind"] == "ablate" and v["arm"] == keep and r.val_bpb <= 0
                     and r.decision != "interrupted")
        ablation.append(dict(keep=keep, move=moves.get(keep, ""), failed=failed,
                             **paired(_values(mine, "ablate", keep), champion)))
    transfer = []
    base_row = baseline.base_row(rows)
    transferred = any(v["kind"] == "transfer" for _, v in mine)
    if transferred and base_row is not None and kept is not None and kept.key != base_row.key:  # the night's, beside
        night_runs = {key: {r.seed: r.val_bpb for r in decide.finished(rows) if r.key == key}
                      for key in (base_row.key, kept.key)}
        transfer.append(dict(budget_s=night, scale="", recorded=True, **paired(*night_runs.values())))
    for budget, scale in dict.fromkeys((r.budget_s, v["scale"]) for r, v in mine if v["kind"] == "transfer"):
        transfer.append(dict(budget_s=budget, scale=scale, recorded=False, **paired(
            _values(mine, "transfer", "base", budget, scale), _values(mine, "transfer", "champion", budget, scale))))
    return {"champion": champ7, "budget_s": night, "runs": len(mine), "ablation": ablation, "transfer": transfer,
            "notes": list(notes or [])}


def _estimate(entry: dict) -> str:
    if entry["mean"] is None:
        return "no paired seeds yet"
    sem = f" +- {entry['sem']:.6f}" if entry["sem"] is not None else " (one seed: no standard error)"
    verdict = "" if entry["distinguishable"] else ", not distinguishable from zero"
    return f"{entry['mean']:+.6f}{sem} over {entry['n']} seed(s){verdict}"


def text(data: dict | None) -> str:
    """The table as `verify`, `report` and `status` print it."""
    if data is None:
        return "verification: none yet (`autoresearch verify`)"
    lines = [f"verification of champion {data['champion']} ({data['runs']} verification runs recorded; rule: "
             f"|mean| <= {DISTINCT_SEMS:g} sem is not distinguishable from zero)"]
    if data["ablation"]:
        lines.append("ablation, each keep's contribution: val_bpb without it - the champion's, paired on seeds "
                     "(positive: the keep helps)")
        for a in data["ablation"]:
            failed = f" ({a['failed']} run(s) failed)" if a["failed"] else ""
            lines.append(f"  {a['keep']}  {_estimate(a)}{failed}  {a['move']}")
    if data["transfer"]:
        lines.append("transfer, the champion's gain over the tag's base: base's val_bpb - the champion's, paired on "
                     "seeds (positive: the champion is better)")
        for t in data["transfer"]:
            where = f"at {t['budget_s']:g} s" + (f" scaled {t['scale']}" if t["scale"] else "")
            how = "the night's own runs (selected on these seeds: biased up)" if t["recorded"] else "fresh seeds"
            lines.append(f"  {where}, {how}: {_estimate(t)}")
    lines += [f"  note: {n}" for n in data["notes"]]
    return "\n".join(lines)
