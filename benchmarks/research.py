"""Does the built-in researcher find real gains? Three proposers side by side, same budgets, same seeds
(BENCHMARKS.md: The built-in researcher):

- builtin: the researcher (ideas.py's catalog and the constants, proposer.Researcher);
- random: moves drawn uniformly from the same space (proposer.RandomSearch);
- tpe: the constants-only TPE proposer that came before (tpe.py).

Two measurements, each arm a fresh repository and tag running the real `autoresearch loop` (default decision
rule), one arm after another, alone on the machine:

- recovery: the loop starts from the default train.py with PLANTED regressions (a detuned learning rate, a worse
  activation, a broken initialisation, a schedule without warmdown, a removed normalisation, none of them written
  by the catalog) and runs --experiments experiments. The champion it ends with, the detuned start and the
  default are then re-measured by hand on the same fresh seeds (never used in the loop):
  recovered = (detuned - champion) / (detuned - default), the fraction of the planted gap won back;
- night (--night): the loop starts from the default and runs --hours; gain = default - champion, on fresh seeds.
Each champion is re-measured right after its arm, and at the end the default (and the detuned start), and every
champion again, interleaved per seed: the table is computed from the end, where a drift of the machine's speed
(a third, for half an hour at a time, on 2026-12-01) hits every configuration alike.

    python benchmarks/research.py --budget 60 --experiments 30                 # recovery, the issue's setting
    python benchmarks/research.py --budget 60 --hours 1 --night                # a compressed night
    python benchmarks/research.py --budget 15 --experiments 12 --arms builtin  # a quick look

torch.compile is off (USE_COMPILE = False in every arm's train.py, --compile keeps it): a code change compiles
cold, 25-80 s on 2 cores, which at a budget of 15-60 s would be most of the run and would measure the compiler,
not the proposer. Results are appended as JSON lines to --out (default benchmarks/results/research-<date>.jsonl).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
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


def default_source(compile_: bool) -> str:
    return set_constants((ROOT / "train.py").read_text(), {"USE_COMPILE": compile_}, "cpu")


def detuned_source(compile_: bool) -> str:
    source = default_source(compile_)
    for what, old, new in PLANTED:
        if source.count(old) != 1:
            raise SystemExit(f"planted regression '{what}' no longer matches train.py: update PLANTED")
        source = source.replace(old, new)
    return source


def measure(source: str, budget: float, seeds: list[int], work: Path) -> list[float]:
    """val_bpb of `source` trained by hand (the validation split visible) once per seed; each run's output is
    kept as work/seed<N>/train.log."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "train.py").write_text(source)
    for name in FIXED:
        (work / name).write_text((ROOT / name).read_text())
    out = []
    for seed in seeds:
        run_dir = work / f"seed{seed}"
        env = dict(os.environ, AUTORESEARCH_TIME_BUDGET=str(budget), AUTORESEARCH_SEED=str(seed),
                   AUTORESEARCH_RUN_DIR=str(run_dir))
        proc = subprocess.run([sys.executable, "train.py"], cwd=work, env=env, capture_output=True, text=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "train.log").write_text(proc.stdout + proc.stderr)
        result = run_dir / "result.json"
        if proc.returncode or not result.exists():
            raise RuntimeError(f"re-measuring failed (seed {seed}): {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        out.append(json.loads(result.read_text())["val_bpb"])
    return out


def loop(arm: str, start: str, budget: float, experiments: int | None, hours: float | None, log: Path,
         where: Path) -> tuple[str, list]:
    """Run `autoresearch loop` with proposer `arm` from train.py `start`; the champion's train.py and the rows."""
    repo = fresh_repo(where, start)
    tag = f"research-{arm}"
    env = dict(os.environ, AUTORESEARCH_TIME_BUDGET=str(budget), PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "autoresearch.cli", "loop", "--agent", arm, "--tag", tag]
    # the baseline counts as one experiment of --max-experiments
    argv += ["--max-experiments", str(experiments + 1)] if experiments else ["--hours", str(hours)]
    with open(log, "w") as f:
        proc = subprocess.run(argv, cwd=repo, env=env, stdout=f, stderr=subprocess.STDOUT)
    rows = ledger.read(repo / "results.tsv", tag)
    if proc.returncode not in (0,) and not rows:
        raise RuntimeError(f"the {arm} loop failed (exit {proc.returncode}): see {log}")
    champion = subprocess.run(["git", "show", f"autoresearch/{tag}:train.py"], cwd=repo, capture_output=True,
                              text=True, check=True).stdout
    return champion, rows


def mean(xs):
    return statistics.fmean(xs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=60, help="training seconds per run (default 60)")
    parser.add_argument("--experiments", type=int, default=30, help="experiments per arm (recovery; default 30)")
    parser.add_argument("--hours", type=float, default=1.0, help="hours per arm (--night; default 1)")
    parser.add_argument("--night", action="store_true", help="from the default, for --hours, instead of recovery")
    parser.add_argument("--arms", nargs="+", default=["builtin", "random", "tpe"])
    parser.add_argument("--compile", action="store_true", help="keep torch.compile on (see above)")
    parser.add_argument("--out", help="JSON lines file (default benchmarks/results/research-<date>.jsonl)")
    args = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    out = Path(args.out or ROOT / "benchmarks" / "results" / f"research-{time.strftime('%Y-%m-%d')}.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="autoresearch-research-"))
    hw = machine.hardware()
    mode = "night" if args.night else "recovery"
    print(f"{machine.describe(hw)}; {mode}, budget {args.budget:g} s, "
          + (f"{args.hours:g} h" if args.night else f"{args.experiments} experiments") + f" per arm; work in {work}",
          flush=True)
    default, detuned = default_source(args.compile), detuned_source(args.compile)
    start = default if args.night else detuned
    t0 = time.time()
    reference = {"default": measure(default, args.budget, FRESH_SEEDS, work / "default")}
    if not args.night:
        reference["detuned"] = measure(detuned, args.budget, FRESH_SEEDS, work / "detuned")
    print(json.dumps({k: [round(v, 4) for v in vs] for k, vs in reference.items()}),
          f"({time.time() - t0:.0f} s)", flush=True)
    results, champions = [], {}
    for arm in args.arms:
        t0 = time.time()
        champion, rows = loop(arm, start, args.budget, None if args.night else args.experiments,
                              args.hours if args.night else None, work / f"{arm}.log", work / arm)
        loop_s = time.time() - t0
        champions[arm] = champion
        again = measure(champion, args.budget, FRESH_SEEDS, work / f"{arm}-champion")
        done = [r for r in rows if r.status != "refused" and not decide.is_interruption(r)]
        kept = [descriptions.base_description(r.description) for r in done
                if r.status == "keep" and not r.decision.startswith("baseline")]
        # what early pruning saved: each pruned run's wall time against a candidate run that trained its budget
        full = [r.wall_s for r in done if r.status in ("discard", "confirm", "keep") and r.repeat == 1
                and not r.decision.startswith("baseline")]
        pruned = [r.wall_s for r in done if r.status == "pruned"]
        saved = sum(statistics.median(full) - w for w in pruned) if full and pruned else 0.0
        result = {
            "mode": mode, "arm": arm, "budget_s": args.budget, "experiments": len({r.key for r in done}) - 1,
            "runs": len(done), "crashes": sum(r.status == "crash" for r in done), "kept": sorted(set(kept)),
            "pruned": len(pruned), "pruning_saved_minutes": round(saved / 60, 1),
            "loop_minutes": round(loop_s / 60, 1), "champion": [round(v, 6) for v in again],
            "default": [round(v, 6) for v in reference["default"]], "cpu": hw["name"], "cores": hw["cores"],
            "compile": args.compile, "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "log": str(work / f"{arm}.log"),
        }
        if args.night:
            result["gain"] = round(mean(reference["default"]) - mean(again), 6)
        else:
            result["detuned"] = [round(v, 6) for v in reference["detuned"]]
            gap = mean(reference["detuned"]) - mean(reference["default"])
            result["recovered"] = round((mean(reference["detuned"]) - mean(again)) / gap, 3)
        results.append(result)
        with open(out, "a") as f:
            f.write(json.dumps(result) + "\n")
        print(json.dumps(result), flush=True)
    # The end, drift-proof: the default and every champion again on the same fresh seeds, interleaved per seed.
    # A machine's speed drifts by a third for half an hour at a time (2026-12-01: 122-140 steps, then 169-191),
    # and a champion measured after its arm would carry that arm's period against a default measured before all.
    sources = {"default": default, **({} if args.night else {"detuned": detuned}), **champions}
    final = {name: [] for name in sources}
    for seed in FRESH_SEEDS:
        for name in final:
            final[name] += measure(sources[name], args.budget, [seed], work / f"final-{name}")
    record = {"mode": mode, "final": {k: [round(v, 6) for v in vs] for k, vs in final.items()},
              "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "cpu": hw["name"]}
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)
    for r in results:
        r["final"] = mean(final[r["arm"]])
    print("\n| arm | experiments | runs | kept | champion (fresh seeds, at the end) | "
          + ("gain over the default |" if args.night else "recovered |") + " loop minutes |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        reference = mean(final["default"])
        value = (f"{reference - r['final']:.4f}" if args.night else
                 f"{100 * (mean(final['detuned']) - r['final']) / (mean(final['detuned']) - reference):.0f}%")
        print(f"| {r['arm']} | {r['experiments']} | {r['runs']} | {len(r['kept'])} | {r['final']:.4f} | "
              f"{value} | {r['loop_minutes']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
