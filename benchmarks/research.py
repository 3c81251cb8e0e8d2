"""Does the built-in researcher find real gains? Three proposers side by side, same budgets, same seeds, in the
same minutes of the machine (BENCHMARKS.md: The built-in researcher):

- builtin: the researcher (ideas.py's catalog and the constants, proposer.Researcher);
- random: moves drawn uniformly from the same space (proposer.RandomSearch);
- tpe: the constants-only TPE proposer that came before (tpe.py).

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

The lanes run **interleaved**: each lane's next experiment in turn, round-robin (`autoresearch loop
--max-experiments 1` on the lane's tag; the proposers keep no state outside the ledger), so every arm gets the same
minutes of the machine, whose speed drifts by a third for tens of minutes at a time (56-64 steps per 30 s run, then
89-95, on 2026-12-01). Arms run one after another made issue 21's table impossible to measure in one sitting. At the
end the default, the detuned start and every lane's champion are re-measured by hand on the same fresh seeds (never
used in a loop), interleaved per seed, and the table is computed from those alone. The noise of the table is the
spread of a configuration's re-measurements (its pooled standard deviation, and the standard error of a mean).

**Under two hours, by construction.** No new round of experiments starts after --minutes of loops (95 by
default, over every sitting), so the lanes end with as many experiments each, at most --experiments; the
re-measurement then takes about 10 minutes at the default.

**Resumable.** Everything lives in --work (by default a directory named by the settings under
~/.cache/autoresearch-research): run the same command again after an interruption (Ctrl-C, a reboot) and it goes on
where it stopped. A lane's progress is its ledger (experiments begun, counted from its rows); a re-measurement is a
JSON line in work/measurements.jsonl once done. A loop killed mid-run is recovered by the next `autoresearch loop`
(the run in flight recorded as interrupted; its series finishes).

    python benchmarks/research.py                                   # the default: under 2 hours on 2 cores
    python benchmarks/research.py --budget 30 --experiments 12 --modes recovery
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
from autoresearch.edit import set_constants  # noqa: E402
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
# The default setting: 6 lanes x (a baseline of 3 runs + up to 8 experiments) at 15 s, then 8 configurations x 3
# seeds re-measured (about 10 minutes). A run costs its budget plus ~10-15 s outside it, and one that may be kept
# ~40 s more (its audit, issue 31): a baseline of 3 runs at 4 s took 145 s, one experiment of 4 runs 198 s. So
# the loops stop starting rounds after DEFAULT_MINUTES, at a round's end (every lane has as many experiments).
DEFAULT_BUDGET = 15.0
DEFAULT_EXPERIMENTS = 8
DEFAULT_MINUTES = 95.0


def default_source(compile_: bool) -> str:
    return set_constants((ROOT / "train.py").read_text(), {"USE_COMPILE": compile_}, "cpu")


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
        self.seconds = 0.0  # loop wall time this sitting (a resumed lane's earlier sittings are in its log)

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
        t0 = time.time()
        with open(self.dir / "loop.log", "a") as f:
            proc = subprocess.run(argv, cwd=self.repo, env=env, stdout=f, stderr=subprocess.STDOUT)
        self.seconds += time.time() - t0
        if proc.returncode != 0 and not self.rows():
            raise RuntimeError(f"the {self.name} loop failed (exit {proc.returncode}): see {self.dir / 'loop.log'}")

    def champion(self) -> str:
        return subprocess.run(["git", "show", f"autoresearch/{self.tag}:train.py"], cwd=self.repo,
                              capture_output=True, text=True, check=True).stdout

    def summary(self) -> dict:
        done = [r for r in self.rows() if r.status != "refused" and not decide.is_interruption(r)]
        kept = [descriptions.base_description(r.description) for r in done
                if r.status == "keep" and not r.decision.startswith("baseline")]
        return {"mode": self.mode, "arm": self.arm, "harness": self.rev or "this checkout", "experiments": self.experiments(), "runs": len(done),
                "crashes": sum(r.status == "crash" for r in done), "pruned": sum(r.status == "pruned" for r in done),
                "kept": sorted(set(kept)), "loop_minutes_this_sitting": round(self.seconds / 60, 1)}


class Spent:
    """Seconds the loops have run, over every sitting (a JSON number in work/loop_seconds.json)."""

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


def noise(values: dict[str, list[float]]) -> float | None:
    """Pooled standard deviation of one re-measurement, over every configuration measured more than once."""
    ss = sum(sum((v - statistics.fmean(vs)) ** 2 for v in vs) for vs in values.values() if len(vs) > 1)
    df = sum(len(vs) - 1 for vs in values.values() if len(vs) > 1)
    return (ss / df) ** 0.5 if df else None


def table(lanes: list[Lane], final: dict[str, list[float]]) -> list[str]:
    sigma = noise(final)
    n = min(len(vs) for vs in final.values())
    mean = {k: statistics.fmean(vs) for k, vs in final.items()}
    lines = ["| mode | arm | experiments | runs | kept | champion (fresh seeds) | result |",
             "|---|---|---|---|---|---|---|"]
    for lane in lanes:
        s = lane.summary()
        champ = mean[lane.name]
        if lane.mode == "night":
            result = f"gain {mean['default'] - champ:+.4f}"
        else:
            gap = mean["detuned"] - mean["default"]
            result = f"recovered {100 * (mean['detuned'] - champ) / gap:.0f}%" if gap else "no planted gap"
        lines.append(f"| {lane.mode} | {lane.arm} | {s['experiments']} | {s['runs']} | {len(s['kept'])} | "
                     f"{champ:.4f} | {result} |")
    if sigma is not None:
        lines.append(f"\nNoise: one re-measurement's sigma {sigma:.4f} (pooled over {len(final)} configurations); "
                     f"a mean of {n} seeds {sigma / n ** 0.5:.4f}, a difference of two such means "
                     f"{sigma * (2 / n) ** 0.5:.4f}.")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET,
                        help=f"training seconds per run (default {DEFAULT_BUDGET:g})")
    parser.add_argument("--experiments", type=int, default=DEFAULT_EXPERIMENTS,
                        help=f"experiments per lane, the baseline not counted (default {DEFAULT_EXPERIMENTS})")
    parser.add_argument("--modes", nargs="+", choices=["recovery", "night"], default=["recovery", "night"])
    parser.add_argument("--arms", nargs="+", default=["builtin", "random", "tpe"])
    parser.add_argument("--minutes", type=float, default=DEFAULT_MINUTES,
                        help=f"no new round of experiments after this many minutes of loops, over every sitting "
                             f"(default {DEFAULT_MINUTES:g}: with the re-measurement, under 2 hours on 2 cores)")
    parser.add_argument("--seeds", type=int, default=len(FRESH_SEEDS), help="fresh seeds in the re-measurement")
    parser.add_argument("--compile", action="store_true", help="keep torch.compile on (see above)")
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
          f"{args.experiments} experiments a lane, interleaved; work in {work} (run again to resume)", flush=True)
    # round-robin: each lane's next experiment in turn, until every lane has its experiments
    stuck: dict[str, int] = {}  # calls in a row that began no experiment (a proposer with no move left, say)
    spent = Spent(work / "loop_seconds.json")  # the loops' wall time over every sitting
    while True:
        behind = [lane for lane in lanes if (not lane.started() or lane.experiments() < args.experiments)
                  and stuck.get(lane.name, 0) < 3]
        if not behind or (spent.seconds > 60 * args.minutes and all(lane.started() for lane in lanes)):
            break  # done, or out of time (checked between rounds: every lane has as many experiments)
        for lane in behind:
            t0, before = time.time(), (lane.started(), lane.experiments())
            lane.step(args.budget)
            spent.add(time.time() - t0)
            stuck[lane.name] = 0 if (lane.started(), lane.experiments()) != before else stuck.get(lane.name, 0) + 1
            print(f"{time.strftime('%H:%M:%S')} {lane.name}: experiment {lane.experiments()}/{args.experiments} "
                  f"({time.time() - t0:.0f} s; {(time.time() - t_start) / 60:.0f} min this sitting)"
                  + (" (it began nothing: see its loop.log)" if stuck[lane.name] else ""), flush=True)
    # the end: the default, the detuned start and every champion on the same fresh seeds, interleaved per seed
    sources = {"default": default, **({"detuned": detuned} if "recovery" in args.modes else {}),
               **{lane.name: lane.champion() for lane in lanes}}
    done = Measurements(work / "measurements.jsonl")
    final = {k: [] for k in sources}
    for seed in seeds:
        for k, source in sources.items():
            final[k].append(done.get(k, seed, source, args.budget, work))
        print(f"{time.strftime('%H:%M:%S')} re-measured seed {seed}", flush=True)
    record = {"lanes": [lane.summary() for lane in lanes],
              "final": {k: [round(v, 6) for v in vs] for k, vs in final.items()}, "seeds": seeds,
              "budget_s": args.budget, "experiments": args.experiments, "compile": args.compile,
              "minutes_this_sitting": round((time.time() - t_start) / 60, 1),
              "loop_minutes": round(spent.seconds / 60, 1), "work": str(work),
              "cpu": hw["name"], "cores": hw["cores"], "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)
    print("\n".join(table(lanes, final)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
