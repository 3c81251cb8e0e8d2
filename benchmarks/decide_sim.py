"""The decision rule's error rates by simulation: how often it keeps a change that does nothing, how often it
keeps a real gain, and the runs it spends, for gains in units of one run's noise, unpaired and paired.

    python benchmarks/decide_sim.py --trials 2000 --rho 0 0.3 0.72 --extra 6
    python benchmarks/decide_sim.py --trials 2000 --rho 0.72 --cand-rho 0.3 0 --extra 6

Each trial: a champion with BASELINE_RUNS runs, `--extra` other configurations the tag has repeated (two runs
each), and a candidate whose true val_bpb is `gain` sigmas lower; autoresearch/decide.py's own code (the code the
harness runs) is applied after every candidate run. A run's noise has sigma 1, of which a share rho is the seed's
effect on every configuration alike (rho: how correlated two configurations' runs on one seed are; measured 0.72
for two nearby configurations, BENCHMARKS.md). Two schedules side by side, on the same draws:
- unpaired: every run its own seed, decide.decide with the pooled noise (the rule before paired seeds);
- paired: a configuration's k-th run on seed k (schedule.seed), decide.compare + decide.rule (the rule now).
--p-keep shows what another threshold would do. A model, not a measurement: BENCHMARKS.md has the measured A/A
and planted-gain rates (benchmarks/decisions.py).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoresearch import decide  # noqa: E402


def trial(rng: random.Random, gain: float, rho: float, extra: int, cand_rho: float) -> dict[str, tuple[bool, int]]:
    """One candidate under both schedules: {schedule: (kept, runs)}."""
    seed_effect = [rng.gauss(0, 1) for _ in range(decide.MAX_RUNS + 2)]  # paired: seed k for every configuration

    def run(mean: float, k: int, paired: bool, share: float = rho) -> float:
        common = seed_effect[k] if paired else rng.gauss(0, 1)
        return mean + math.sqrt(share) * common + math.sqrt(1 - share) * rng.gauss(0, 1)

    out = {}
    for paired in (False, True):
        runs = [("champion", k, run(0.0, k, paired)) for k in range(decide.BASELINE_RUNS)]
        runs += [(f"o{i}", k, run(0.0, k, paired)) for i in range(extra) for k in range(2)]
        if not paired:  # own seeds: no two runs share one
            runs = [(c, 1000 + i, v) for i, (c, _, v) in enumerate(runs)]
        n = 0
        while True:
            n += 1
            runs.append(("candidate", n - 1 if paired else 2000 + n, run(-gain, n - 1, paired, cand_rho)))
            values: dict[str, list[float]] = {}
            for c, _, v in runs:
                values.setdefault(c, []).append(v)
            if paired:
                verdict = decide.rule(n, decide.compare(runs, "candidate", "champion"))
            else:
                verdict = decide.decide(values["candidate"], values["champion"], decide.pooled_noise(values))
            if verdict.status != "confirm":
                out["paired" if paired else "unpaired"] = (verdict.status == "keep", n)
                break
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--rho", type=float, nargs="+", default=[0.0, 0.3, 0.72],
                        help="shares of the noise that a seed causes in every configuration alike")
    parser.add_argument("--cand-rho", type=float, nargs="+",
                        help="the candidate's share of the common seed effect, if not rho: a change that redraws "
                             "the random numbers (new shapes, another initialisation) shares only the data order")
    parser.add_argument("--extra", type=int, default=6, help="other configurations with two runs each in the tag")
    parser.add_argument("--p-keep", type=float, help="simulate another keep threshold")
    args = parser.parse_args()
    if args.p_keep:
        decide.P_KEEP = args.p_keep
    rng = random.Random(0)
    print(f"P_KEEP {decide.P_KEEP}, P_CONTINUE {decide.P_CONTINUE}, DISCARD_MARGIN {decide.DISCARD_MARGIN}, "
          f"MAX_RUNS {decide.MAX_RUNS}, baseline {decide.BASELINE_RUNS} runs, {args.extra} other configurations "
          f"with 2 runs, {args.trials} trials per cell")
    print("| rho (candidate's) | true gain (sigmas) | kept, unpaired | kept, paired | runs, unpaired | runs, paired |")
    print("|---|---|---|---|---|---|")
    for rho, cand in [(rho, cand) for rho in args.rho for cand in (args.cand_rho or [rho])]:
        for gain in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0):
            results = [trial(rng, gain, rho, args.extra, cand) for _ in range(args.trials)]
            cells = []
            for key in ("unpaired", "paired"):
                cells.append(100 * sum(r[key][0] for r in results) / len(results))
            runs = [sum(r[key][1] for r in results) / len(results) for key in ("unpaired", "paired")]
            print(f"| {rho:g} ({cand:g}) | {gain:.1f} | {cells[0]:.1f}% | {cells[1]:.1f}% | {runs[0]:.2f} | {runs[1]:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
