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
- paired: a configuration's k-th run on seed k (study.seed), decide.compare + decide.rule (the rule now).
--p-keep shows what another threshold would do. A model, not a measurement: BENCHMARKS.md has the measured A/A
and planted-gain rates (benchmarks/decisions.py).

    python benchmarks/decide_sim.py --drift --trials 1000 --rho 0.5 --cand-rho 0.24 --extra 0   # a drifting machine
    python benchmarks/decide_sim.py --drift --delta 4 --gains 0 --period 80 --shape recovering    # one corner

--drift: a machine whose speed drifts (issue 33). Every run takes --run-s seconds of the machine (budget and
overhead), experiments are --gap s apart, and the machine is slow for --period s, then normal for --period s, in
turn, from a random phase (--shape: or a steady recovery, or a steady slowdown, over each cycle). A run's val_bpb
is worse by delta sigmas times its mean slowness (a third slower cost ~4 sigmas at 10 steps; --delta takes
several). The tag's history is as above (the champion's
BASELINE_RUNS runs, --extra configurations of 2 runs each, in that order, then the candidate). On the same draws
(the same machine, seed effects and per-run noise), the rules:
- today: paired seeds against the champion's runs, wherever in time they were made (decide.compare + rule);
- control: each candidate run k is preceded by a run of the champion on the same seed (its control), and the
  decision uses only the time-adjacent differences d_k = candidate_k - control_k (baseline.in_time: a paired t on the
  d's, their noise pooled over the tag's configurations that have two or more, decide.rule's thresholds);
- control-alt: the same, the order alternating (candidate-control, control-candidate, ...), so a drift that is
  linear over two pairs cancels in their mean;
- control-random: the same, each pair's order drawn at random: no drift, periodic or not, can line up with the
  order. Any fixed order meets some periodic drift in step, every candidate run in one phase and every control
  in the other (try --period 45 or 80 with 40 s runs);
- screen-random: the candidate's first run is screened as today (decide.compare against all the champion's
  runs, discard beyond DISCARD_MARGIN), and only a survivor gets controls: its first run's control right after
  it, then pairs in random order; the decision from the second pair on uses the d's only;
- screen-fixed: the same, the later pairs always control first: the candidate's run completes every pair that
  decides, so its row can carry the verdict, as it does today (a pair completed by a control would need a row
  of its own for the verdict).
In the control rules the tag's other configurations had controls too (their d's feed the pooled noise), and the
champion's runs include every control. Runs per decision count the controls.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoresearch import baseline, decide  # noqa: E402


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


# --- a drifting machine -----------------------------------------------------------------------------------------
DRIFT_RULES = ("today", "control", "control-alt", "control-random", "screen-random", "screen-fixed")
RUN_S = 40.0     # seconds of the machine per run: a 10 s budget took 22 s per run on 2 cores, 30 s about 50 s
GAP_S = 10.0     # seconds between two experiments (the agent's edit and commit)
PERIOD_S = 180.0 # seconds of each slow and each normal period (the 2-core VM drifted for minutes at a time)


SHAPES = ("square", "recovering", "slowing")  # the drift's shape over one cycle of 2 * period (see Machine)


class Machine:
    """The machine's slowness over time, from a random phase, repeating every 2 * period s: `square` is slow for
    period s, then normal for period s (what drift.py makes); `recovering` turns slow at once, then speeds up
    steadily back to normal over the cycle; `slowing` slows down steadily, then is normal again at once. A run's
    shift in sigmas is delta times its mean slowness (0: normal, 1: slow)."""

    def __init__(self, rng: random.Random, delta: float, period: float, run_s: float, shape: str = "square"):
        self.delta, self.period, self.run_s, self.shape = delta, period, run_s, shape
        self.offset = rng.uniform(0, 2 * period)

    def _slow_time(self, t: float) -> float:
        """Seconds of slowness in [0, t) of the phase (square)."""
        cycles, into = divmod(t + self.offset, 2 * self.period)
        return cycles * self.period + min(into, self.period)

    def _level(self, t: float) -> float:
        into = (t + self.offset) % (2 * self.period) / (2 * self.period)
        return 1 - into if self.shape == "recovering" else into

    def shift(self, t: float) -> float:
        """How much worse a run made from t to t + run_s is."""
        if self.shape == "square":
            return self.delta * (self._slow_time(t + self.run_s) - self._slow_time(t)) / self.run_s
        points = 16
        return self.delta * statistics.fmean(self._level(t + (i + 0.5) * self.run_s / points) for i in range(points))


def drift_trial(rng: random.Random, gain: float, delta: float, rho: float, cand_rho: float, extra: int,
                run_s: float, gap_s: float, period: float, shape: str = "square") -> dict[str, tuple[bool, int]]:
    """One candidate under every rule, on the same draws: {rule: (kept, runs including controls)}."""
    machine = Machine(rng, delta, period, run_s, shape)
    seeds = max(decide.BASELINE_RUNS, decide.MAX_RUNS)
    seed_effect = [rng.gauss(0, 1) for _ in range(seeds)]
    noise = {}  # (configuration, seed, which run of it on that seed) -> its own noise, drawn once for every rule
    coins = {}  # (configuration, pair) -> a random order, the same for every rule

    def control_first(rule: str, config: str, k: int) -> bool:
        """Whether a configuration's k-th pair (from 0) runs the control first."""
        if rule.endswith("random"):
            return coins.setdefault((config, k), rng.random() < 0.5)
        if rule == "screen-fixed":
            return k > 0
        return rule == "control" or k % 2 == 1

    out = {}
    for rule in DRIFT_RULES:
        seen: dict[tuple[str, int], int] = {}

        def run(config: str, k: int, t: float, mean: float = 0.0, share: float = rho) -> float:
            which = seen.get((config, k), 0)
            seen[(config, k)] = which + 1
            if (config, k, which) not in noise:
                noise[(config, k, which)] = rng.gauss(0, 1)
            own = noise[(config, k, which)]
            return mean + machine.shift(t) + math.sqrt(share) * seed_effect[k] + math.sqrt(1 - share) * own

        t = 0.0
        runs = []       # (configuration, seed, val_bpb) of the tag
        diffs = {}      # configuration -> its d's (control rules)
        for k in range(decide.BASELINE_RUNS):
            runs.append(("champion", k, run("champion", k, t)))
            t += run_s
        controlled = rule != "today"
        for i in range(extra):
            t += gap_s
            for k in range(2):
                pair = [("o%d" % i, k), ("champion", k)] if controlled else [("o%d" % i, k)]
                if controlled and control_first(rule, "o%d" % i, k):
                    pair.reverse()
                vals = {}
                for config, seed in pair:
                    vals[config] = run(config, seed, t)
                    runs.append((config, seed, vals[config]))
                    t += run_s
                if controlled:
                    diffs.setdefault("o%d" % i, []).append(vals["o%d" % i] - vals["champion"])
        t += gap_s
        n = spent = 0
        while True:
            if rule == "today":
                runs.append(("candidate", n, run("candidate", n, t, -gain, cand_rho)))
                t += run_s
                n += 1
                spent += 1
                verdict = decide.rule(n, decide.compare(runs, "candidate", "champion"))
            else:
                screening = rule.startswith("screen") and n == 0 and spent == 0
                if screening:
                    v = run("candidate", 0, t, -gain, cand_rho)
                    runs.append(("candidate", 0, v))
                    t += run_s
                    spent += 1
                    verdict = decide.rule(1, decide.compare(runs, "candidate", "champion"))
                    if verdict.status == "discard":
                        break
                    c = run("champion", 0, t)
                    runs.append(("champion", 0, c))
                    t += run_s
                    spent += 1
                    diffs["candidate"] = [v - c]
                    n = 1
                    continue
                vals = {}
                for config in (("champion", "candidate") if control_first(rule, "candidate", n) else ("candidate", "champion")):
                    if config == "candidate":
                        vals[config] = run("candidate", n, t, -gain, cand_rho)
                    else:
                        vals[config] = run("champion", n, t)
                    runs.append((config, n, vals[config]))
                    t += run_s
                    spent += 1
                diffs.setdefault("candidate", []).append(vals["candidate"] - vals["champion"])
                n += 1
                values: dict[str, list[float]] = {}
                for c, _, v in runs:
                    values.setdefault(c, []).append(v)
                verdict = decide.rule(n, baseline.in_time(diffs, "candidate", decide.pooled_noise(values)))
            if verdict.status != "confirm":
                break
        out[rule] = (verdict.status == "keep", spent)
    return out


def drift_table(args) -> None:
    rng = random.Random(0)
    print(f"drift: {args.shape}, slow {args.period:g} s / normal {args.period:g} s, {args.run_s:g} s per run, {args.gap_s:g} s "
          f"between experiments; rho {args.rho[0]:g} (candidate's {args.cand_rho[0] if args.cand_rho else args.rho[0]:g}), "
          f"{args.extra} other configurations; P_KEEP {decide.P_KEEP}, MAX_RUNS {decide.MAX_RUNS}; "
          f"{args.trials} trials per row; kept % (runs per decision)")
    print("| delta (sigmas) | gain (sigmas) | " + " | ".join(DRIFT_RULES) + " |")
    print("|---|---|" + "---|" * len(DRIFT_RULES))
    rho = args.rho[0]
    cand = args.cand_rho[0] if args.cand_rho else rho
    for delta in args.delta:
        for gain in args.gains:
            results = [drift_trial(rng, gain, delta, rho, cand, args.extra, args.run_s, args.gap_s, args.period,
                                   args.shape)
                       for _ in range(args.trials)]
            cells = []
            for rule in DRIFT_RULES:
                kept = 100 * sum(r[rule][0] for r in results) / len(results)
                runs = sum(r[rule][1] for r in results) / len(results)
                cells.append(f"{kept:.1f}% ({runs:.2f})")
            print(f"| {delta:g} | {gain:g} | " + " | ".join(cells) + " |", flush=True)


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
    parser.add_argument("--drift", action="store_true", help="a drifting machine: today's rule against controls")
    parser.add_argument("--delta", type=float, nargs="+", default=[0.0, 1.0, 2.0, 4.0],
                        help="--drift: how much worse a run made wholly in a slow period is, in sigmas")
    parser.add_argument("--gains", type=float, nargs="+", default=[-2.0, 0.0, 1.0, 2.0, 4.0],
                        help="--drift: true gains (negative: a change that hurts, what most proposals are)")
    parser.add_argument("--run-s", type=float, default=RUN_S, help="--drift: seconds of the machine per run")
    parser.add_argument("--gap-s", type=float, default=GAP_S, help="--drift: seconds between experiments")
    parser.add_argument("--period", type=float, default=PERIOD_S, help="--drift: seconds of each slow/normal period")
    parser.add_argument("--shape", choices=SHAPES, default="square", help="--drift: the drift's shape (Machine)")
    args = parser.parse_args()
    if args.p_keep:
        decide.P_KEEP = args.p_keep
    if args.drift:
        drift_table(args)
        return
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
