"""Fault injection: SIGKILL the harness at random moments across the loop, restart it, check that nothing was lost.

    python benchmarks/faults.py --kills 50 --budget 2

A clone of this repository runs `autoresearch loop` (built-in proposer, sandbox off so that orphans are
possible) on the prepared data in AUTORESEARCH_CACHE. Each round kills the harness with SIGKILL, either at a
named moment (AUTORESEARCH_KILL_AT: right after pending.json is written, after the commit, while evaluating,
before and after the row is written, after the reset, while evaluating the second run of a series) or after a random delay (during the proposal,
training, export or evaluation), then restarts it (`autoresearch loop --max-experiments 0`: recovery only)
and checks:
- no row lost: every experiment that started (a run directory or a pending.json) has exactly one row;
- no row written twice, no torn row: every line of results.tsv parses, run ids are unique;
- the branch is on the last kept commit (on the candidate while its confirmation series is open), and every
  kept commit is on the branch;
- no run counted twice: each row's n is the number of finished runs of its configuration up to it;
- no orphaned process is left: no training, and no evaluator.
Run it alone (2 cores): it trains all the time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
PHASES = ["pending-written", "committed", "evaluating", "recording", "recorded", "reset", "evaluating-run-2"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def loop(repo: Path, env: dict, n: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "autoresearch.cli", "loop", "--tag", "faults", "--sandbox", "off",
                             "--max-experiments", str(n)], cwd=repo, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def orphans(repo: Path) -> list[int]:
    """Training processes (train.py run in the clone) and evaluators (a private copy of the evaluator, started by
    the clone's harness) still alive. Only this clone's: the test suite runs two tests at a time."""
    found = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        try:
            cmd = p.info["cmdline"] or []
            mine = p.info["cwd"] == str(repo)  # the harness runs in the clone (sandbox off): so do its children
            training = mine and cmd and "train.py" in cmd[-1]
            evaluator = mine and any("autoresearch-eval-" in c and c.endswith("__main__.py") for c in cmd)
            if training or evaluator:
                found.append(p.pid)
        except (psutil.Error, TypeError):
            continue
    return found


def check(repo: Path) -> list[str]:
    """Violations of the invariants, after recovery."""
    sys.path.insert(0, str(ROOT))
    from autoresearch import decide, ledger

    problems = []
    path = repo / "results.tsv"
    text = path.read_text()
    if not text.endswith("\n"):
        problems.append("results.tsv ends in a torn line")
    lines = text.splitlines()[1:]
    rows = []
    for n, line in enumerate(lines, 2):
        try:
            rows.append(ledger.Row.from_line(line + "\n"))
        except (ValueError, TypeError) as e:
            problems.append(f"line {n} torn or damaged: {e}")
    ids = [r.run_id for r in rows]
    if len(ids) != len(set(ids)):
        problems.append(f"a row written twice: {sorted(i for i in ids if ids.count(i) > 1)}")
    started = {p.name for p in (repo / ".autoresearch" / "runs").iterdir()} if (repo / ".autoresearch" / "runs").exists() else set()
    lost = sorted(started - set(ids))
    if lost:
        problems.append(f"rows lost for runs {lost}")
    if (repo / ".autoresearch" / "pending.json").exists():
        problems.append("pending.json left after recovery")
    config = json.loads((repo / ".autoresearch" / "tags" / "faults.json").read_text())
    kept = [r for r in rows if r.status == "keep"]
    series = decide.latest_unfinished(rows)
    if series is not None and series.kind == "candidate":
        expected = git(repo, "rev-parse", series.commit)
    else:
        expected = git(repo, "rev-parse", kept[-1].commit) if kept else config["base_commit"]
    if git(repo, "rev-parse", "HEAD") != expected:
        problems.append(f"HEAD {git(repo, 'rev-parse', '--short', 'HEAD')} is not where it belongs {expected[:7]}")
    finished: dict[str, int] = {}
    for r in decide.finished(rows):
        finished[r.config] = finished.get(r.config, 0) + 1
        if r.n != finished[r.config]:
            problems.append(f"run {r.run_id} says n={r.n}, but it is run {finished[r.config]} of its configuration")
    for r in kept:
        if subprocess.run(["git", "merge-base", "--is-ancestor", r.commit, "HEAD"], cwd=repo).returncode != 0:
            problems.append(f"kept commit {r.commit} is not on the branch")
    left = orphans(repo)
    if left:
        problems.append(f"orphaned training processes {left}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--budget", type=float, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--phases-only", action="store_true", help="only kills at named moments (fast)")
    parser.add_argument("--keep", help="keep the clone here instead of a temporary directory")
    parser.add_argument("--eager", action="store_true", help="train.py without torch.compile and no compile cache: "
                        "the faults are the same, a 2-core machine saves the cold compile (the test's setting)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    env = dict(os.environ, AUTORESEARCH_TIME_BUDGET=f"{args.budget:g}")
    env.pop("AUTORESEARCH_KILL_AT", None)
    tmp = tempfile.mkdtemp(prefix="autoresearch-faults-")
    repo = Path(args.keep or tmp) / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
    sys.path.insert(0, str(ROOT))
    from autoresearch import untrusted  # the reviewed train.py, never an experiment branch's (docs/integrity.md)
    subprocess.run(["git", "-C", str(repo), "checkout", "-q", "-B", "work", untrusted.commit(ROOT)], check=True)
    if args.eager:
        sys.path.insert(0, str(ROOT))
        from autoresearch.sites import set_constants
        (repo / "train.py").write_text(set_constants((repo / "train.py").read_text(), {"USE_COMPILE": False}, "cpu"))
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=faults", "-c", "user.email=f@f", "commit", "-qam",
                        "eager"], check=True)
        env["AUTORESEARCH_COMPILE_CACHE"] = "off"
    counts, violations, t0 = {}, [], time.time()
    for i in range(args.kills):
        if args.phases_only:
            phase = PHASES[i % len(PHASES)]
        else:  # every other round a named moment, each in turn; the rest at random
            phase = PHASES[(i // 2) % len(PHASES)] if i % 2 == 0 else "random"
        run_env = dict(env, AUTORESEARCH_KILL_AT=phase) if phase != "random" else env
        proc = loop(repo, run_env, 3)
        if phase == "random":
            deadline = time.time() + rng.uniform(0.5, args.budget + 12)
            while time.time() < deadline and proc.poll() is None:
                time.sleep(0.05)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        try:
            proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        killed = proc.returncode == -signal.SIGKILL
        counts[phase] = counts.get(phase, 0) + killed
        restart = loop(repo, env, 0)  # the restart: recovery, no new experiment
        restart.wait(timeout=600)
        found = check(repo)
        violations += [f"round {i + 1} ({phase}): {v}" for v in found]
        print(f"round {i + 1:3d}: kill at {phase:16s} {'killed' if killed else 'ended before the kill'}; "
              f"{len(found)} violations", flush=True)
    text = (repo / "results.tsv").read_text().splitlines()[1:]
    statuses = {}
    for line in text:
        status = line.split("\t")[3]
        statuses[status] = statuses.get(status, 0) + 1
    print(f"\n{sum(counts.values())} SIGKILLs in {args.kills} rounds ({time.time() - t0:.0f} s): " +
          ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    print(f"{len(text)} rows: " + ", ".join(f"{v} {k}" for k, v in sorted(statuses.items())))
    print(f"violations: {len(violations)}")
    for v in violations:
        print("  " + v)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
