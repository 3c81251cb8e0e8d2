"""Two nearby configurations, each trained by hand on the same seeds, and what their repeats say
(BENCHMARKS.md: Paired seeds and early pruning, measured on repeats):

- paired seeds: how correlated the two configurations' seed effects are. A candidate's k-th run could use the
  champion's k-th seed, so that seed effects cancel in the difference; with correlation rho, the paired
  difference's variance is (1 - rho) times the unpaired one, and a decision needs about that fraction of the runs;
- early pruning (autoresearch/baseline.py): its false-prune rate on no-op changes. Each run is replayed as a
  candidate against the other runs of its own configuration as the champion, the noise pooled from every other
  run: any verdict is a false prune. Also each run of B against A's runs (a nearby change, never hopeless).

    python benchmarks/repeats.py --budget 60 --seeds 6
    python benchmarks/repeats.py --budget 20 --seeds 6 --change "WARMDOWN_RATIO=0.6"
    python benchmarks/repeats.py --budget 10 --seeds 8 --change init   # what a redrawn initialisation shares

torch.compile is off, as in benchmarks/research.py. Results are appended as JSON lines to --out (default
benchmarks/results/repeats-<date>.jsonl).
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from decisions import aa_change
from research import ROOT, default_source, measure

import runtime  # noqa: E402
from autoresearch import baseline, machine  # noqa: E402
from autoresearch.sites import set_constants  # noqa: E402


def pearson(xs, ys) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    return sxy / (sum((x - mx) ** 2 for x in xs) * sum((y - my) ** 2 for y in ys)) ** 0.5


def curves(work: Path, seeds) -> list:
    return [baseline.curve((work / f"seed{s}" / "train.log").read_text(), runtime.STEP_RE) for s in seeds]


def false_prunes(mine: list, budget: float) -> tuple[int, int]:
    """(pruned, tried): each of `mine` against the rest of `mine` as the tag's base (curves and noise)."""
    pruned = 0
    for i, run in enumerate(mine):
        rest = mine[:i] + mine[i + 1:]
        ref = baseline.Reference(budget, rest)
        pruned += any(ref.verdict(t, loss) for t, loss in run)
    return pruned, len(mine)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=60, help="training seconds per run (default 60)")
    parser.add_argument("--seeds", type=int, default=6, help="runs per configuration (default 6)")
    parser.add_argument("--change", default="MATRIX_LR=0.05",
                        help="B: A (the default) with this constant set, or `init`: other initial weights of the same "
                             "distribution, the same data order (benchmarks/decisions.py's A/A change)")
    parser.add_argument("--out", help="JSON lines file (default benchmarks/results/repeats-<date>.jsonl)")
    args = parser.parse_args()
    name, _, value = args.change.partition("=")
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"repeats-{time.strftime('%Y-%m-%d')}.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="autoresearch-repeats-"))
    hw = machine.hardware()
    seeds = [2001 + i for i in range(args.seeds)]
    print(f"{machine.describe(hw)}; budget {args.budget:g} s, seeds {seeds}; A: the default, B: {args.change}; "
          f"work in {work}", flush=True)
    a_source = default_source(False)
    b_source = (aa_change(a_source, 1, "init") if args.change == "init"
                else set_constants(a_source, {name: ast.literal_eval(value)}, "cpu"))
    t0 = time.time()
    # interleaved, A then B per seed, so that a drift of the machine's speed hits both alike
    a, b = [], []
    for s in seeds:
        a += measure(a_source, args.budget, [s], work / "A")
        b += measure(b_source, args.budget, [s], work / "B")
        print(f"seed {s}: A {a[-1]:.4f}  B {b[-1]:.4f}", flush=True)
    rho = pearson(a, b)
    diffs = [y - x for x, y in zip(a, b)]
    ca, cb = curves(work / "A", seeds), curves(work / "B", seeds)
    fa, fb = false_prunes(ca, args.budget), false_prunes(cb, args.budget)
    cross = sum(any(baseline.Reference(args.budget, ca).verdict(t, loss) for t, loss in run) for run in cb)
    result = {
        "budget_s": args.budget, "change": args.change, "seeds": seeds, "A": [round(x, 6) for x in a],
        "B": [round(x, 6) for x in b], "rho": round(rho, 3), "sd_A": round(statistics.stdev(a), 5),
        "sd_B": round(statistics.stdev(b), 5), "sd_paired_diff": round(statistics.stdev(diffs), 5),
        "sd_unpaired_diff": round((statistics.variance(a) + statistics.variance(b)) ** 0.5, 5),
        "mean_diff": round(statistics.fmean(diffs), 5), "step_lines": statistics.median(len(c) for c in ca + cb),
        "false_prunes": [fa[0] + fb[0], fa[1] + fb[1]], "B_pruned_against_A": [cross, len(cb)],
        "prune_rule": {"from_fraction": baseline.FROM_FRACTION, "z": baseline.Z, "min_gap": baseline.MIN_GAP},
        "minutes": round((time.time() - t0) / 60, 1), "cpu": hw["name"], "cores": hw["cores"],
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "work": str(work),
    }
    with open(out, "a") as f:
        f.write(json.dumps(result) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
