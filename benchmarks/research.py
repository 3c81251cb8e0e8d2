"""Does the built-in researcher find real gains? Three proposers side by side, same budgets, same seeds, in the
same minutes of the machine (BENCHMARKS.md: The built-in researcher):

- builtin: the researcher (ideas.py's catalog and the constants, researcher.Researcher);
- random: moves drawn uniformly from the same space (researcher.RandomSearch);
- tpe: the constants-only TPE proposer that came before (proposer.TPEProposer).

An arm may name a git revision of the harness, `ARM@REV` (e.g. `builtin@0dccac2`: the researcher as it was
there), to measure a change of a proposer before and after in one sitting: that lane runs REV's harness (its
tree exported once into --work) and REV's fixed files, from the same start.

Two measurements (--modes), each arm of each a *lane*: a repository and tag of its own, running the real
`autoresearch loop` (default decision rule):

- recovery: the loop starts from the default train.py with PLANTED regressions (a detuned learning rate, a worse
  activation, a broken initialisation, a schedule without warmdown, a removed normalisation, none of them written
  by the catalog): recovered = (detuned - champion) / (detuned - default), the fraction of the planted gap won
  back;
- night: the loop starts from the default: gain = default - champion.

The lanes run **interleaved**, one experiment at a time (`autoresearch loop --max-experiments 1` on the lane's tag;
the proposers keep no state outside the ledger), so every arm runs in the same minutes of the machine, whose speed
drifts by a third for tens of minutes at a time (56-64 steps per 30 s run, then 89-95, on 2026-12-01). Arms run one
after another made issue 21's table impossible to measure in one sitting. **A night is wall time, not a count of
experiments:** each lane gets an equal share of --minutes, and the lane that has spent the least of its share runs
the next experiment. A proposer whose moves are decided in one run makes more experiments in its share than one
whose moves need four (on 2026-12-02, in rounds of one experiment each, the researcher's night took 12 runs and 8.7
minutes for 6 experiments, random search's 27 runs and 27.2 minutes). At the
end the default, the detuned start and every lane's champion are re-measured by hand on the same fresh seeds (never
used in a loop), interleaved per seed, and the table is computed from those alone. The noise of the table is the
spread of a configuration's re-measurements (its pooled standard deviation, and the standard error of a mean).

**The transfer: does the night's gain hold at the real budget?** A night at 15 s rewards what is short (a smaller
model); what counts is the longer run. After the re-measurement, the default and each night lane's champion (that
kept something) are trained at --transfer-budget (300 s, the real one) on --transfer-seeds fresh seeds (4, from
2001: never a loop's, never the re-measurement's), interleaved per seed; the table gives each champion's gain at
the night's budget beside its gain at the longer one, both paired by seed with their standard errors, and says
whether it held (beyond two standard errors), reversed, or is within the noise.

**Under two hours, by construction, at the default** (the night of the built-in researcher and of random search,
30 minutes of loops, then the transfer): a lane starts no experiment once its share of --minutes is spent, nor
beyond --experiments; its last experiment may overrun its share by one experiment (1-4 minutes at 15 s). The
re-measurement then takes about 3 minutes, the transfer about 5.3 minutes a run: (1 + lanes that kept) x 4 runs,
at most 64 minutes. Larger sittings (every mode and arm: --modes recovery night --arms builtin random tpe
--minutes 85 --transfer-seeds 0 was the default before the transfer, 111 minutes) are chosen with the flags.

**Resumable.** Everything lives in --work (by default a directory named by the settings under
~/.cache/autoresearch-research): run the same command again after an interruption (Ctrl-C, a reboot) and it goes on
where it stopped. A lane's progress is its ledger (experiments begun, counted from its rows) and its loop seconds
(work/<lane>/loop_seconds.json); a re-measurement is a
JSON line in work/measurements.jsonl once done. A loop killed mid-run is recovered by the next `autoresearch loop`
(the run in flight recorded as interrupted; its series finishes).

    python benchmarks/research.py                                   # the default: a night, then 300 s: < 2 hours
    python benchmarks/research.py --modes night --seeds 8 --minutes 70    # the night alone, resolved finer
    python benchmarks/research.py --budget 5 --experiments 1 --arms builtin --seeds 1   # a smoke test
    python benchmarks/research.py --arms builtin builtin@0dccac2 random    # a researcher's change, before and after

torch.compile is off (USE_COMPILE = False in every lane's train.py, --compile keeps it): at budgets of 15-60 s a
compile phase per new configuration (about a minute for a change of shape on 2 cores) would be most of the wall
time and measure the compiler, not the proposer. Results (one JSON line per lane and one for the table) are
appended to --out (default benchmarks/results/research-<date>.jsonl).
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
import time
from pathlib import Path

from parallel import ROOT, fresh_repo

from autoresearch import decide, descriptions, ledger, machine  # noqa: E402
from autoresearch.sites import set_constants  # noqa: E402
from autoresearch.state import FIXED  # noqa: E402

# (what it breaks, the text of the default it replaces, what it writes instead): each must match exactly once
PLANTED = [
    ("constant: MATRIX_LR 8x too low", "MATRIX_LR = 0.04 ", "MATRIX_LR = 0.005"),
    ("activation: GELU for ReLU squared", "F.relu(self.c_fc(x)).square()", "F.gelu(self.c_fc(x))"),
    ("initialisation: attention output projections random, not zero",
     "nn.init.zeros_(block.attn.c_proj.weight)  # every block starts as the identity",
     "nn.init.normal_(block.attn.c_proj.weight, std=0.1)"),
    ("schedule: no warmdown", "    cooldown = (1 - progress) / WARMDOWN_RATIO\n"
     "    return cooldown + (1 - cooldown) * FINAL_LR_FRAC\n", "    return 1.0\n"),
    ("normalisation: none before the head", "logits = self.lm_head(rms_norm(x)).float()",
     "logits = self.lm_head(x).float()"),
]
FRESH_SEEDS = [1001, 1002, 1003]  # re-measurements only: the loop's seeds start at 42
TRANSFER_SEEDS = 2001             # the transfer's fresh seeds: 2001, 2002, ... (never a loop's, never the above)
TRANSFER_BUDGET = 300.0           # the real budget: what a night's keep must hold at
# The default setting: 6 lanes sharing 85 minutes of loops at 15 s budgets, then 8 configurations x 3 seeds
# re-measured (11 minutes on 2026-12-02). A run costs its budget plus ~10-15 s outside it, and one that may be kept
# ~40 s more (its audit, issue 31); an experiment took 1-4 minutes (a clear loss one run, a close call four), so
# each lane may overrun its share by that much: 85 + 6 x ~2 + 11 minutes is under two hours.
DEFAULT_BUDGET = 15.0
DEFAULT_EXPERIMENTS = 30  # a cap per lane: the minutes end a lane first at the default
DEFAULT_MINUTES = 30.0


def default_source(compile_: bool) -> str:
    from autoresearch import untrusted  # the reviewed train.py, never the work tree's (docs/integrity.md)
    return set_constants(untrusted.source(ROOT), {"USE_COMPILE": compile_}, "cpu")


def detuned_source(compile_: bool) -> str:
    source = default_source(compile_)
    for what, old, new in PLANTED:
        if source.count(old) != 1:
            raise SystemExit(f"planted regression '{what}' no longer matches train.py: update PLANTED")
        source = source.replace(old, new)
    return source


def measure(source: str, budget: float, seed: int, work: Path) -> float:
    """val_bpb of `source` trained by hand (the validation split visible) on one seed; the run's output is kept as
    work/seed<N>/train.log."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "train.py").write_text(source)
    for name in FIXED:
        (work / name).write_text((ROOT / name).read_text())
    run_dir = work / f"seed{seed}"
    env = dict(os.environ, AUTORESEARCH_TIME_BUDGET=str(budget), AUTORESEARCH_SEED=str(seed),
               AUTORESEARCH_RUN_DIR=str(run_dir))
    proc = subprocess.run([sys.executable, "train.py"], cwd=work, env=env, capture_output=True, text=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "train.log").write_text(proc.stdout + proc.stderr)
    result = run_dir / "result.json"
    if proc.returncode or not result.exists():
        raise RuntimeError(f"re-measuring failed (seed {seed}): {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return json.loads(result.read_text())["val_bpb"]


def commit_of(rev: str) -> str:
    """The short commit `rev` names in this repository (a bad revision: a clear error)."""
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "--verify", "--end-of-options",
                            f"{rev}^{{commit}}"], capture_output=True, text=True)
    if found.returncode:
        raise SystemExit(f"arm @{rev}: not a revision of {ROOT} ({found.stderr.strip()})")
    return found.stdout.strip()


def harness_tree(work: Path, commit: str) -> Path:
    """This repository's tree at `commit`, exported once into work/harness-<commit>."""
    tree = work / f"harness-{commit}"
    if not tree.exists():
        partial = work / f"harness-{commit}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit], capture_output=True,
                                 check=True)
        subprocess.run(["tar", "-x", "-C", str(partial)], input=archive.stdout, check=True)
        os.replace(partial, tree)
    return tree


class Lane:
    """One arm in one mode: its repository (made on first use) and tag under work/<mode>-<arm>."""

    def __init__(self, work: Path, mode: str, arm: str, start: str):
        self.mode, self.arm, self.start = mode, arm, start
        self.agent, _, rev = arm.partition("@")
        self.rev = commit_of(rev) if rev else ""  # keyed by its commit: `@main` resumes as what it was
        self.harness = harness_tree(work, self.rev) if self.rev else ROOT
        self.name = f"{mode}-{self.agent}" + (f"-{self.rev}" if self.rev else "")
        self.dir = work / self.name
        self.tag = f"research-{self.name}"
        self.repo = self.dir / "repo"
        self.spent = Spent(self.dir / "loop_seconds.json")  # its loops' wall time, over every sitting
        self.stuck = 0  # calls in a row that began no experiment (a proposer with no move left, say)

    def rows(self) -> list[ledger.Row]:
        results = self.repo / "results.tsv"
        return ledger.read(results, self.tag) if results.exists() else []

    def experiments(self) -> int:
        """Experiments begun, the baseline not counted: the configurations the ledger holds beyond the first."""
        keys = list(dict.fromkeys(r.key for r in self.rows()))
        return max(0, len(keys) - 1)

    def started(self) -> bool:
        return bool(self.rows())

    def step(self, budget: float) -> None:
        """One more experiment (the first call: the baseline) through the real loop."""
        if not self.repo.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            fresh_repo(self.dir, self.start, fixed_from=self.harness)
        env = dict(os.environ, AUTORESEARCH_TIME_BUDGET=str(budget), PYTHONPATH=str(self.harness))
        argv = [sys.executable, "-m", "autoresearch.cli", "loop", "--agent", self.agent, "--tag", self.tag,
                "--max-experiments", "1"]
        t0, before = time.time(), (self.started(), self.experiments())
        with open(self.dir / "loop.log", "a") as f:
            proc = subprocess.run(argv, cwd=self.repo, env=env, stdout=f, stderr=subprocess.STDOUT)
        self.spent.add(time.time() - t0)
        if proc.returncode != 0 and not self.rows():
            raise RuntimeError(f"the {self.name} loop failed (exit {proc.returncode}): see {self.dir / 'loop.log'}")
        self.stuck = 0 if (self.started(), self.experiments()) != before else self.stuck + 1

    def champion(self) -> str:
        return subprocess.run(["git", "show", f"autoresearch/{self.tag}:train.py"], cwd=self.repo,
                              capture_output=True, text=True, check=True).stdout

    def summary(self) -> dict:
        done = [r for r in self.rows() if r.status != "refused" and not decide.is_interruption(r)]
        kept = [descriptions.base_description(r.description) for r in done
                if r.status == "keep" and not r.decision.startswith("baseline")]
        return {"mode": self.mode, "arm": self.arm, "harness": self.rev or "this checkout", "experiments": self.experiments(), "runs": len(done),
                "crashes": sum(r.status == "crash" for r in done), "pruned": sum(r.status == "pruned" for r in done),
                "kept": sorted(set(kept)), "loop_minutes": round(self.spent.seconds / 60, 1)}


class Spent:
    """Seconds a lane's loops have run, over every sitting (a JSON number in a file)."""

    def __init__(self, path: Path):
        self.path = path
        self.seconds = json.loads(path.read_text()) if path.exists() else 0.0

    def add(self, seconds: float) -> None:
        self.seconds += seconds
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.seconds))
        os.replace(tmp, self.path)


class Measurements:
    """The re-measurements at the end, one JSON line each in work/measurements.jsonl: done ones are skipped."""

    def __init__(self, path: Path):
        self.path = path
        self.done: dict[tuple[str, int], float] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    m = json.loads(line)
                    self.done[m["name"], m["seed"]] = m["val_bpb"]

    def get(self, name: str, seed: int, source: str, budget: float, work: Path) -> float:
        if (name, seed) not in self.done:
            value = measure(source, budget, seed, work / f"final-{name}")
            with open(self.path, "a") as f:
                f.write(json.dumps({"name": name, "seed": seed, "val_bpb": value}) + "\n")
            self.done[name, seed] = value
        return self.done[name, seed]


def next_lane(lanes: list, share: float, cap: int):
    """The lane to run next, or None when every lane is done: a lane without its baseline first, then the one that
    has spent the fewest seconds, among those under `share` seconds and `cap` experiments that still begin
    experiments (three calls in a row that began none: its proposer has no move left)."""
    open_ = [lane for lane in lanes if lane.stuck < 3
             and (not lane.started() or (lane.experiments() < cap and lane.spent.seconds < share))]
    return min(open_, key=lambda lane: (lane.started(), lane.spent.seconds), default=None)


def noise(values: dict[str, list[float]]) -> float | None:
    """Pooled standard deviation of one re-measurement, over every configuration measured more than once."""
    ss = sum(sum((v - statistics.fmean(vs)) ** 2 for v in vs) for vs in values.values() if len(vs) > 1)
    df = sum(len(vs) - 1 for vs in values.values() if len(vs) > 1)
    return (ss / df) ** 0.5 if df else None


def table(lanes: list[Lane], final: dict[str, list[float]]) -> list[str]:
    sigma = noise(final)
    n = min(len(vs) for vs in final.values())
    mean = {k: statistics.fmean(vs) for k, vs in final.items()}
    lines = ["| mode | arm | experiments | runs | loop minutes | kept | champion (fresh seeds) | result |",
             "|---|---|---|---|---|---|---|---|"]
    for lane in lanes:
        s = lane.summary()
        champ = mean[lane.name]
        if lane.mode == "night":
            result = f"gain {mean['default'] - champ:+.4f}"
        else:
            gap = mean["detuned"] - mean["default"]
            result = f"recovered {100 * (mean['detuned'] - champ) / gap:.0f}%" if gap else "no planted gap"
        lines.append(f"| {lane.mode} | {lane.arm} | {s['experiments']} | {s['runs']} | {s['loop_minutes']} | "
                     f"{len(s['kept'])} | "
                     f"{champ:.4f} | {result} |")
    if sigma is not None:
        lines.append(f"\nNoise: one re-measurement's sigma {sigma:.4f} (pooled over {len(final)} configurations); "
                     f"a mean of {n} seeds {sigma / n ** 0.5:.4f}, a difference of two such means "
                     f"{sigma * (2 / n) ** 0.5:.4f}.")
    return lines


def paired_gain(base: list[float], champ: list[float]) -> tuple[float, float | None]:
    """The champion's gain over the default on paired seeds (positive: better), and its standard error."""
    diffs = [b - c for b, c in zip(base, champ)]
    sem = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None
    return statistics.fmean(diffs), sem


def transfer_table(lanes: list, final: dict, transfer: dict, budget: float, longer: float) -> list[str]:
    """Each night lane's gain at the night's budget beside its gain at the longer one, both on paired fresh seeds:
    whether the night's gain held (beyond two standard errors at the longer budget), reversed, or is undecided."""
    lines = [f"| arm | gain at {budget:g} s (paired, {len(final['default'])} seeds) | gain at {longer:g} s (paired, "
             f"{len(transfer['default'])} seeds) | held? |", "|---|---|---|---|"]
    for lane in (lane for lane in lanes if lane.mode == "night"):
        short, short_se = paired_gain(final["default"], final[lane.name])
        long_, long_se = paired_gain(transfer["default"], transfer.get(lane.name, transfer["default"]))
        verdict = ("no keep to transfer" if lane.champion() == lane.start else
                   "undecided (one seed)" if long_se is None else
                   "held" if long_ > 2 * long_se else "reversed" if long_ < -2 * long_se else "not beyond the noise")
        fmt = lambda g, se: f"{g:+.4f}" + (f" +- {se:.4f}" if se is not None else "")  # noqa: E731
        lines.append(f"| {lane.arm} | {fmt(short, short_se)} | {fmt(long_, long_se)} | {verdict} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET,
                        help=f"training seconds per run (default {DEFAULT_BUDGET:g})")
    parser.add_argument("--experiments", type=int, default=DEFAULT_EXPERIMENTS,
                        help=f"at most this many experiments per lane, the baseline not counted "
                             f"(default {DEFAULT_EXPERIMENTS})")
    parser.add_argument("--modes", nargs="+", choices=["recovery", "night"], default=["night"])
    parser.add_argument("--arms", nargs="+", default=["builtin", "random"])
    parser.add_argument("--minutes", type=float, default=DEFAULT_MINUTES,
                        help=f"minutes of loops, over every sitting, shared equally by the lanes (default "
                             f"{DEFAULT_MINUTES:g}: with the re-measurement, under 2 hours on 2 cores)")
    parser.add_argument("--seeds", type=int, default=len(FRESH_SEEDS), help="fresh seeds in the re-measurement")
    parser.add_argument("--compile", action="store_true", help="keep torch.compile on (see above)")
    parser.add_argument("--transfer-budget", type=float, default=TRANSFER_BUDGET,
                        help="the night lanes' champions and the default, re-measured at this budget too (default "
                             f"{TRANSFER_BUDGET:g}: the real one): does the night's gain hold at it?")
    parser.add_argument("--transfer-seeds", type=int, default=4,
                        help="fresh paired seeds at --transfer-budget (default 4; 0: no transfer)")
    parser.add_argument("--work", help="where the lanes live; the same command resumes there (default: named by "
                                       "the settings, under ~/.cache/autoresearch-research)")
    parser.add_argument("--out", help="JSON lines file (default benchmarks/results/research-<date>.jsonl)")
    args = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    seeds = [1001 + i for i in range(args.seeds)]
    name = (f"{'-'.join(args.modes)}_{'-'.join(args.arms)}_b{args.budget:g}_e{args.experiments}"
            f"{'_compile' if args.compile else ''}")
    work = Path(args.work or Path.home() / ".cache" / "autoresearch-research" / name)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"research-{time.strftime('%Y-%m-%d')}.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    hw = machine.hardware()
    default, detuned = default_source(args.compile), detuned_source(args.compile)
    lanes = [Lane(work, mode, arm, detuned if mode == "recovery" else default)
             for mode in args.modes for arm in args.arms]
    t_start = time.time()
    print(f"{machine.describe(hw)}; {', '.join(args.modes)}; arms {', '.join(args.arms)}; budget {args.budget:g} s, "
          f"{args.minutes:g} minutes of loops shared by {len(lanes)} lanes, interleaved; work in {work} "
          f"(run again to resume)", flush=True)
    share = 60 * args.minutes / len(lanes)
    while (lane := next_lane(lanes, share, args.experiments)) is not None:
        t0 = time.time()
        lane.step(args.budget)
        print(f"{time.strftime('%H:%M:%S')} {lane.name}: experiment {lane.experiments()} ({time.time() - t0:.0f} s; "
              f"{lane.spent.seconds / 60:.1f} of its {share / 60:.1f} min; {(time.time() - t_start) / 60:.0f} min "
              f"this sitting)" + (" (it began nothing: see its loop.log)" if lane.stuck else ""), flush=True)
    # the end: the default, the detuned start and every champion on the same fresh seeds, interleaved per seed
    sources = {"default": default, **({"detuned": detuned} if "recovery" in args.modes else {}),
               **{lane.name: lane.champion() for lane in lanes}}
    done = Measurements(work / "measurements.jsonl")
    final = {k: [] for k in sources}
    for seed in seeds:
        for k, source in sources.items():
            final[k].append(done.get(k, seed, source, args.budget, work))
        print(f"{time.strftime('%H:%M:%S')} re-measured seed {seed}", flush=True)
    # the transfer: the default and each night lane's champion at the longer budget, on other fresh seeds, paired
    night_lanes = [lane for lane in lanes if lane.mode == "night"]
    kept = [lane.name for lane in night_lanes if lane.champion() != lane.start]  # nothing kept: nothing to transfer
    transfer = {k: [] for k in ["default"] + kept} if night_lanes else {}
    for seed in range(TRANSFER_SEEDS, TRANSFER_SEEDS + (args.transfer_seeds if night_lanes else 0)):
        for k in transfer:
            transfer[k].append(done.get(f"{k}@{args.transfer_budget:g}s", seed, sources[k], args.transfer_budget,
                                        work))
        print(f"{time.strftime('%H:%M:%S')} transfer: seed {seed} at {args.transfer_budget:g} s", flush=True)
    record = {"lanes": [lane.summary() for lane in lanes],
              "transfer": {"budget_s": args.transfer_budget,
                           "values": {k: [round(v, 6) for v in vs] for k, vs in transfer.items()}},
              "final": {k: [round(v, 6) for v in vs] for k, vs in final.items()}, "seeds": seeds,
              "budget_s": args.budget, "experiments": args.experiments, "compile": args.compile,
              "minutes_this_sitting": round((time.time() - t_start) / 60, 1),
              "loop_minutes": round(sum(lane.spent.seconds for lane in lanes) / 60, 1), "work": str(work),
              "cpu": hw["name"], "cores": hw["cores"], "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)
    print("\n".join(table(lanes, final)))
    if transfer and transfer["default"]:
        print("\n".join(transfer_table(lanes, final, transfer, args.budget, args.transfer_budget)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
