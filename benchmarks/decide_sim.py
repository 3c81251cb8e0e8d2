"""The decision rule's error rates by simulation: how often it keeps a change that does nothing, how often it
keeps a real gain, and the runs it spends, for gains in units of one run's noise.

    python benchmarks/decide_sim.py --trials 20000

Each trial: a champion with BASELINE_RUNS runs, a candidate whose true val_bpb is `gain` sigmas lower, runs
drawn from a normal distribution, and autoresearch/decide.py's own decide() (the code the harness runs) applied
after every candidate run with the noise pooled over both, as in the harness. --p-keep shows what another
threshold would do. A model, not a measurement: BENCHMARKS.md has the measured A/A and planted-gain rates.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoresearch import decide  # noqa: E402


def trial(rng: random.Random, gain: float, extra_df: int) -> tuple[bool, int]:
    champion = [rng.gauss(0, 1) for _ in range(decide.BASELINE_RUNS)]
    # other configurations' repeats the tag has pooled already: extra_df degrees of freedom of pure noise
    others = {f"o{i}": [rng.gauss(0, 1), rng.gauss(0, 1)] for i in range(extra_df)}
    runs = []
    while True:
        runs.append(rng.gauss(-gain, 1))
        noise = decide.pooled_noise({"champion": champion, "candidate": runs, **others})
        verdict = decide.decide(runs, champion, noise)
        if verdict.status != "confirm":
            return verdict.status == "keep", len(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20000)
    parser.add_argument("--p-keep", type=float, help="simulate another keep threshold")
    parser.add_argument("--extra-df", type=int, default=0, help="repeats of other configurations already pooled")
    args = parser.parse_args()
    if args.p_keep:
        decide.P_KEEP = args.p_keep
    rng = random.Random(0)
    print(f"P_KEEP {decide.P_KEEP}, P_CONTINUE {decide.P_CONTINUE}, DISCARD_MARGIN {decide.DISCARD_MARGIN}, "
          f"MAX_RUNS {decide.MAX_RUNS}, baseline {decide.BASELINE_RUNS} runs, {args.extra_df} pooled extra repeats")
    print("| true gain (noise sigmas) | kept | runs per candidate |")
    print("|---|---|---|")
    for gain in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0):
        results = [trial(rng, gain, args.extra_df) for _ in range(args.trials)]
        kept = sum(k for k, _ in results) / len(results)
        runs = sum(n for _, n in results) / len(results)
        print(f"| {gain:.1f} | {100 * kept:.1f}% | {runs:.2f} |")


if __name__ == "__main__":
    main()
