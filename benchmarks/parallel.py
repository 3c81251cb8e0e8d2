"""Experiments per hour with `autoresearch loop --workers N`, for several N at the same per-experiment budget and
the same threads per worker, in one run (BENCHMARKS.md: Many experiments at once).

Each arm is a fresh repository (this checkout's train.py, prepare.py, runtime.py, program.md) and a fresh tag, looping with
the built-in proposer and the default decision rule on the prepared data for `window` seconds of wall clock, then
stopped with Ctrl-C (the runs in flight are recorded as interrupted and not counted). Counted: runs finished
inside the window (rows other than refused and interrupted), experiments begun (configurations), and the
median training steps per run, which shows what workers sharing one machine cost each other.

    python benchmarks/parallel.py --budget 30 --window 480 --workers 1 2
    python benchmarks/parallel.py --budget 300 --window 3600 --workers 1 4 8 16   # a 16-core host

Results are appended as JSON lines to --out (default benchmarks/results/parallel-<date>.jsonl).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoresearch import decide, ledger, machine  # noqa: E402
from autoresearch.state import FIXED  # noqa: E402
from autoresearch.worker import workers_dir  # noqa: E402


def fresh_repo(where: Path, train_source: str | None = None, fixed_from: Path = ROOT) -> Path:
    """A new git repository holding this checkout's fixed files (or those of the tree `fixed_from`) and train.py
    (or `train_source`)."""
    repo = where / "repo"
    repo.mkdir(parents=True)
    for name in (*FIXED, ".gitignore", "program.md"):
        shutil.copy(fixed_from / name, repo / name)
    from autoresearch import untrusted  # the reviewed train.py, never the work tree's (docs/integrity.md)
    (repo / "train.py").write_text(train_source if train_source is not None else untrusted.source(ROOT))
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", "bench"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    return repo


def arm(workers: int, threads: int, budget: float, window: float, log_dir: Path) -> dict:
    tag = f"bench-w{workers}"
    with tempfile.TemporaryDirectory(prefix="autoresearch-parallel-") as tmp:
        repo = fresh_repo(Path(tmp))
        env = dict(os.environ, AUTORESEARCH_TIME_BUDGET=str(budget), PYTHONPATH=str(ROOT))
        log = log_dir / f"{tag}.log"
        start = time.time()
        proc = subprocess.Popen([sys.executable, "-m", "autoresearch.cli", "loop", "--workers", str(workers),
                                 "--threads", str(threads), "--tag", tag], cwd=repo, env=env,
                                stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=window)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the runs in flight are recorded as interrupted
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        rows = ledger.read(repo / "results.tsv", tag)
        shutil.rmtree(workers_dir(tag, repo), ignore_errors=True)
    end = start + window
    done = [r for r in rows if r.status != "refused" and not decide.is_interruption(r)
            and time.mktime(time.strptime(r.time, "%Y-%m-%dT%H:%M:%S")) <= end]
    finished = [r for r in done if r.val_bpb > 0]
    baseline = [r.val_bpb for r in finished if r.decision.startswith("baseline")]
    return {
        "workers": workers, "threads": threads, "budget_s": budget, "window_s": window,
        "runs": len(done), "crashes": sum(r.status == "crash" for r in done),
        "experiments": len({r.key for r in done}),
        "runs_per_hour": round(len(done) * 3600 / window, 1),
        "median_steps": statistics.median(r.steps for r in finished) if finished else None,
        "median_wall_s": statistics.median(r.wall_s for r in finished) if finished else None,
        "baseline_mean": round(statistics.fmean(baseline), 6) if baseline else None,
        "best_mean": min((r.mean for r in finished if r.status == "keep" and r.mean), default=None),
        "log": str(log),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=30, help="training seconds per run (default 30)")
    parser.add_argument("--window", type=float, default=480, help="wall seconds each arm loops (default 480)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="the arms (default 1 2)")
    parser.add_argument("--threads", type=int, default=1, help="threads per worker, the same in every arm")
    parser.add_argument("--out", help="JSON lines file (default benchmarks/results/parallel-<date>.jsonl)")
    args = parser.parse_args()
    # Started in the background by a shell without job control, this process inherits SIGINT ignored, and so
    # would each loop, which then cannot be stopped with Ctrl-C at the window's end. A handler here makes the
    # loops start with the default again.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"parallel-{time.strftime('%Y-%m-%d')}.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    log_dir = Path(tempfile.mkdtemp(prefix="autoresearch-parallel-logs-"))
    hw = machine.hardware()
    print(f"{machine.describe(hw)}; budget {args.budget:g} s, window {args.window:g} s, {args.threads} thread(s) "
          f"per worker; logs in {log_dir}")
    results = []
    for workers in args.workers:
        result = dict(arm(workers, args.threads, args.budget, args.window, log_dir), cpu=hw["name"],
                      cores=hw["cores"], date=time.strftime("%Y-%m-%dT%H:%M:%S"))
        results.append(result)
        with open(out, "a") as f:
            f.write(json.dumps(result) + "\n")
        print(json.dumps(result), flush=True)
    base = results[0]["runs_per_hour"] or float("nan")
    print("\n| workers | runs in window | runs/hour | x workers=%d | experiments | median steps | median wall s |"
          % results[0]["workers"])
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['workers']} | {r['runs']} | {r['runs_per_hour']} | {r['runs_per_hour'] / base:.2f} | "
              f"{r['experiments']} | {r['median_steps']} | {r['median_wall_s']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
