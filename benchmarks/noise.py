"""How noisy is one run's val_bpb, and how much of it is throughput? Repeated runs of the same train.py.

    python benchmarks/noise.py --runs 5 --out noise.jsonl                 # 5 runs, seed 42 each
    python benchmarks/noise.py --runs 5 --vary-seed --out noise.jsonl     # 5 runs, seeds 0..4
    python benchmarks/noise.py --report noise.jsonl                       # the table and the split
    python benchmarks/noise.py --runs 6 --compete odd --clock cpu         # a shared machine, on the cpu clock

Each run is `python train.py` by hand (the full budget unless AUTORESEARCH_TIME_BUDGET is set) on the prepared
data in AUTORESEARCH_CACHE; by hand train.py sees the validation split and reports the same val_bpb the harness
would measure (to 1e-6, tests/test_train.py). Every run records val_bpb, steps, tokens/s, and the machine's
load average before it started. The report gives, per group, how much of the variance a linear fit on steps
explains (throughput), and splits one run's variance into throughput (the same-seed group) and seed (what the
varied-seed group adds). --compete odd|all starts a competing CPU-bound process (one busy core) during every
other run or every run, as a shared machine would; --clock cpu runs train.py on the cpu budget clock with the
environment the harness gives it (autoresearch/machine.py). Run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def reviewed_dir() -> Path:
    """A scratch directory with the reviewed train.py (never the work tree's: docs/integrity.md) and the fixed
    files, made once."""
    global REVIEWED
    if REVIEWED is None:
        sys.path.insert(0, str(ROOT))
        from autoresearch import untrusted
        from autoresearch.state import FIXED
        REVIEWED = Path(tempfile.mkdtemp(prefix="autoresearch-noise-"))
        for name in FIXED:
            shutil.copy(ROOT / name, REVIEWED / name)
        untrusted.write(ROOT, REVIEWED)
    return REVIEWED


REVIEWED = None


def one_run(seed: int, extra_env: dict, compete: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, AUTORESEARCH_SEED=str(seed), AUTORESEARCH_RUN_DIR=tmp, **extra_env)
        load = os.getloadavg()[0]
        rival = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if compete else None
        t0 = time.time()
        try:
            proc = subprocess.run([sys.executable, "train.py"], cwd=reviewed_dir(), env=env, capture_output=True,
                                  text=True)
        finally:
            if rival:
                rival.kill()
                rival.wait()
        if proc.returncode != 0:
            raise SystemExit(f"train.py failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        result = json.loads((Path(tmp) / "result.json").read_text())
    return {"seed": seed, "val_bpb": result["val_bpb"], "steps": result["num_steps"],
            "tok_s": result["tokens_per_second"], "wall": time.time() - t0, "load_before": load,
            "env": extra_env, "compete": compete, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}


def report(rows: list[dict]) -> str:
    lines = [f"{'group':>12} {'n':>3} {'mean val_bpb':>13} {'std':>8} {'min':>8} {'max':>8} {'steps':>13} {'tok/s':>13}"]
    groups = {}
    for r in rows:
        groups.setdefault(r["group"], []).append(r)
    for name, rs in groups.items():
        v = [r["val_bpb"] for r in rs]
        s = [r["steps"] for r in rs]
        t = [r["tok_s"] for r in rs]
        sd = statistics.stdev(v) if len(v) > 1 else float("nan")
        lines.append(f"{name:>12} {len(v):3d} {statistics.mean(v):13.4f} {sd:8.4f} {min(v):8.4f} {max(v):8.4f} "
                     f"{min(s):6d}-{max(s):<6d} {min(t):6.0f}-{max(t):<6.0f}")
    # the split, within each group: a linear fit of val_bpb on steps (throughput) and what is left
    for name, rs in groups.items():
        v, st = [r["val_bpb"] for r in rs], [r["steps"] for r in rs]
        if len(rs) >= 3 and statistics.variance(st) > 0 and statistics.variance(v) > 0:
            b = statistics.covariance(st, v) / statistics.variance(st)
            left = statistics.variance([vi - b * (si - statistics.mean(st)) for vi, si in zip(v, st)])
            lines.append(f"{name}: a linear fit on steps (slope {b * 100:+.5f} per 100 steps) explains "
                         f"{100 * (1 - left / statistics.variance(v)):.0f}% of the variance; the rest has std "
                         f"{left ** 0.5:.4f}")
    if "same-seed" in groups and "seeds" in groups:
        same = statistics.variance([r["val_bpb"] for r in groups["same-seed"]])
        seeds = statistics.variance([r["val_bpb"] for r in groups["seeds"]])
        lines.append(f"split: one run's std {seeds ** 0.5:.4f} = throughput {same ** 0.5:.4f} (same seed, same code) "
                     f"and seed {max(seeds - same, 0) ** 0.5:.4f} (sqrt of the difference of the variances)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--vary-seed", action="store_true", help="seeds 0..runs-1 instead of 42 each time")
    parser.add_argument("--group", help="a name for this set of runs in the report (default: same-seed/seeds)")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for train.py (repeatable)")
    parser.add_argument("--out", help="append every run as a JSON line here")
    parser.add_argument("--compete", choices=["none", "odd", "all"], default="none",
                        help="a competing busy process during every other run (odd) or every run (all)")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="the budget clock")
    parser.add_argument("--report", help="only print the report of this JSON-lines file")
    args = parser.parse_args()
    if args.report:
        print(report([json.loads(l) for l in Path(args.report).read_text().splitlines() if l.strip()]))
        return
    sys.path.insert(0, str(ROOT))
    from autoresearch import machine
    extra = machine.clock_env(args.clock, machine.hardware()["cores"]) | dict(kv.split("=", 1) for kv in args.env)
    group = args.group or ("seeds" if args.vary_seed else "same-seed")
    rows = []
    for i in range(args.runs):
        compete = args.compete == "all" or (args.compete == "odd" and i % 2 == 1)
        r = one_run(i if args.vary_seed else 42, extra, compete) | {"group": group}
        rows.append(r)
        print(json.dumps(r), flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")
    print(report(rows))


if __name__ == "__main__":
    main()
