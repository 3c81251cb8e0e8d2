"""Does the decision rule beat the noise? An A/A loop and a planted gain, through the real harness.

    python benchmarks/decisions.py --budget 10 --aa 20 --naive 20 --tries 10 --out decisions.jsonl
    python benchmarks/decisions.py --report decisions.jsonl

Everything runs in a scratch repository (this checkout's train.py, prepare.py and runtime.py, the harness from this
checkout) on the prepared data in AUTORESEARCH_CACHE, with `autoresearch run` exactly as an agent calls it:
- A/A: a tag whose baseline runs as usual, then --aa experiments that each make a change that cannot matter.
  Every keep is a false keep. --aa-change init (the default) draws i random numbers right after
  torch.manual_seed: the model starts from other weights of the same distribution (the data order is the
  harness's seed), so the change is a fresh sample of the same quality, as a real change's run is on the
  champion's seed (schedule.seed pairs them). --aa-change comment only adds a comment: with paired seeds that is
  the same computation as the champion's, which any rule should find trivially. The naive rule (one run, kept when below the best single
  run) is measured twice: replayed on the first runs of the same experiments, and run for real (--naive N, a
  tag with `--decision naive`).
- Planted gain: a base with one constant detuned (--detune, default UNEMBEDDING_LR=0.001: the cpu default
  0.004, 4x too small). First the gain is measured (3 runs of each, by hand); then each of --tries tries is a
  fresh tag on the detuned base (its baseline: 3 runs) and the fix (the default value back) as the candidate,
  on the try's seeds (its k-th run on its baseline's k-th: paired). The fix should be kept.
Each experiment is a JSON line (--out); the report gives false keeps, kept fixes and the runs each rule spent.
Run it alone (2 cores): it trains all the time.

--drift SLOW:PERIOD (e.g. 0.33:180) switches on a drifting machine for the whole measurement: benchmarks/drift.py
slows every training in the scratch directory to 1 - SLOW of its speed for PERIOD seconds, then leaves it alone
for PERIOD seconds, in turn (the phase changes go to --out's name + .drift.log, or stderr). Each JSON line records
the setting (`drift`) and, for an experiment, the share of its time spent in slow periods (`slow_share`).
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
sys.path.insert(0, str(ROOT))

import drift  # noqa: E402  (benchmarks/drift.py)
from autoresearch import ledger, processes  # noqa: E402
from autoresearch.state import FIXED  # noqa: E402
from autoresearch.edit import read_constants, set_constants  # noqa: E402

RECORDS: list[dict] = []
DRIFT: drift.Drift | None = None  # the drift switched on by --drift, if any


def sh(repo: Path, *args: str) -> str:
    return subprocess.run(args, cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def cli(repo: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    # dies with this script: a benchmark stopped midway left its `autoresearch run` training on, orphaned
    proc = subprocess.run(processes.tied_to_parent([sys.executable, "-m", "autoresearch.cli", *args]), cwd=repo,
                          env=env, capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"autoresearch {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc


def detuned_and_fixed(source: str, detune: str) -> tuple[str, str, str]:
    """(detuned train.py, fixed train.py, the fix's description) for NAME=VALUE on the cpu profile."""
    name, value = detune.split("=", 1)
    value = type(read_constants(source, "cpu")[name])(value)
    default = read_constants(source, "cpu")[name]
    return set_constants(source, {name: value}, "cpu"), source, f"fix {name} {value!r} -> {default!r}"


def scratch(tmp: Path, name: str, detune: str | None) -> Path:
    repo = tmp / name
    repo.mkdir()
    for name in ("train.py", *FIXED, ".gitignore"):
        shutil.copy(ROOT / name, repo / name)
    if detune:
        (repo / "train.py").write_text(detuned_and_fixed((repo / "train.py").read_text(), detune)[0])
    sh(repo, "git", "init", "-q", "-b", "main")
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", "base")
    return repo


def tag_rows(repo: Path, tag: str) -> list[ledger.Row]:
    return ledger.read(repo / "results.tsv", tag)


def emit(out, record: dict, started: float | None = None) -> None:
    """Print and append one record; started: the epoch second its experiment began (for its slow_share)."""
    record["time"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    record["drift"] = DRIFT.setting if DRIFT else None
    if DRIFT and started is not None:
        record["slow_share"] = round(DRIFT.slow_share(started, time.time()), 3)
    RECORDS.append(record)
    print(json.dumps(record), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")


def experiment_record(kind: str, rule: str, rows_after: list, rows_before: int) -> dict:
    mine = rows_after[rows_before:]
    last = mine[-1]
    return {"kind": kind, "rule": rule, "status": last.status, "runs": len(mine),
            "first_val_bpb": mine[0].val_bpb, "values": [r.val_bpb for r in mine], "decision": last.decision,
            "p_better": last.p_better, "mean": last.mean, "description": last.description}


SEEDED = ("    torch.manual_seed(seed)", "    run = setup(")  # the line after which torch is seeded: before and
                                                             # after runtime.setup() took over the seeding


def aa_change(source: str, i: int, kind: str) -> str:
    """train.py with the i-th change that cannot matter (see --aa-change)."""
    if kind == "comment":
        return source + f"# A/A change {i}: a comment, which cannot matter\n"
    lines = source.splitlines(keepends=True)
    at = next((n for n, line in enumerate(lines) if line.startswith(SEEDED)), None)
    if at is None:
        raise SystemExit(f"train.py has no line starting {' or '.join(repr(s.strip()) for s in SEEDED)} to draw "
                         "after: use --aa-change comment")
    lines.insert(at + 1, f"    torch.rand({i})  # A/A change {i}: other initial weights, same distribution\n")
    return "".join(lines)


def aa(tmp: Path, env: dict, n: int, rules: list[str], out, change: str = "init") -> None:
    """n A/A experiments under each rule, each in its own repository and tag, interleaved (the first experiment
    under every rule, then the second, ...) so the rules share the same minutes of the machine."""
    repos = {rule: scratch(tmp, f"aa-{rule}", detune=None) for rule in rules}
    for rule, repo in repos.items():
        cli(repo, env, "setup", "--tag", f"aa-{rule}", "--decision", rule)
        started = time.time()
        cli(repo, env, "run", "-m", "baseline")
        emit(out, experiment_record("aa-baseline", rule, tag_rows(repo, f"aa-{rule}"), 0), started)
    for i in range(1, n + 1):
        for rule, repo in repos.items():
            (repo / "train.py").write_text(aa_change((repo / "train.py").read_text(), i, change))
            before = len(tag_rows(repo, f"aa-{rule}"))
            started = time.time()
            cli(repo, env, "run", "-m", f"A/A {i}")
            emit(out, experiment_record("aa", rule, tag_rows(repo, f"aa-{rule}"), before), started)


def measure_gain(repo: Path, env: dict, seeds: int, fixed: str, detune: str, out) -> None:
    """val_bpb of the detuned base and of the fix, by hand (train.py sees the validation split then)."""
    for name, source in (("detuned", (repo / "train.py").read_text()), ("fixed", fixed)):
        work = repo.parent / f"gain-{name}"
        work.mkdir()
        for f in FIXED:
            shutil.copy(repo / f, work / f)
        (work / "train.py").write_text(source)
        for seed in range(1, seeds + 1):
            started = time.time()
            with tempfile.TemporaryDirectory() as run_dir:
                run_env = dict(env, AUTORESEARCH_SEED=str(seed), AUTORESEARCH_RUN_DIR=run_dir)
                subprocess.run([sys.executable, "train.py"], cwd=work, env=run_env, capture_output=True, check=True)
                result = json.loads((Path(run_dir) / "result.json").read_text())
            emit(out, {"kind": "gain", "detune": detune, "config": name, "seed": seed, "val_bpb": result["val_bpb"],
                       "steps": result["num_steps"]}, started)


def planted(tmp: Path, env: dict, tries: int, gain_seeds: int, detune: str, rules: list[str], out) -> None:
    """Each try: under every rule in turn (the same minutes), a fresh tag on the detuned base (its baseline's
    three runs) and the fix as its candidate, on the try's seeds."""
    repo = scratch(tmp, "planted", detune=detune)
    _, fixed, fix_description = detuned_and_fixed((ROOT / "train.py").read_text(), detune)
    if gain_seeds:
        measure_gain(repo, env, gain_seeds, fixed, detune, out)
    for k in range(1, tries + 1):
        for rule in rules:
            sh(repo, "git", "checkout", "-q", "main")
            tag = f"try{k}" if rule == "stat" else f"try{k}-{rule}"
            cli(repo, env, "setup", "--tag", tag, "--decision", rule)
            seed = str(1000 * k)
            started = time.time()
            cli(repo, env, "run", "-m", "baseline (detuned)", "--seed", seed)
            before = len(tag_rows(repo, tag))
            (repo / "train.py").write_text(fixed)
            cli(repo, env, "run", "-m", fix_description, "--seed", seed)
            emit(out, experiment_record("planted", rule, tag_rows(repo, tag), before) | {"try": k, "detune": detune},
                 started)


def naive_replay(first_values: list[float]) -> int:
    """Keeps the naive rule makes on this sequence of single runs (the first is the baseline)."""
    best, keeps = first_values[0], 0
    for v in first_values[1:]:
        if v < best:
            best, keeps = v, keeps + 1
    return keeps


def report(records: list[dict]) -> str:
    lines = []
    settings = sorted({r.get("drift") or "none" for r in records})
    if settings != ["none"]:
        lines.append(f"drift (slow share : period s): {', '.join(settings)}")
    for rule in ("stat", "control", "naive"):
        exps = [r for r in records if r["kind"] == "aa" and r["rule"] == rule]
        if not exps:
            continue
        base = next(r for r in records if r["kind"] == "aa-baseline" and r["rule"] == rule)
        keeps = sum(r["status"] == "keep" for r in exps)
        runs = sum(r["runs"] for r in exps)
        lines.append(f"A/A, {rule} rule: {keeps} false keeps in {len(exps)} experiments ({100 * keeps / len(exps):.0f}%), "
                     f"{runs} runs ({runs / len(exps):.2f} per experiment) plus {base['runs']} for the baseline")
        if rule == "stat" and base["values"]:
            replay = naive_replay([base["values"][0]] + [r["first_val_bpb"] for r in exps])
            lines.append(f"A/A, naive rule replayed on the same experiments' first runs: {replay} false keeps in "
                         f"{len(exps)} ({100 * replay / len(exps):.0f}%), 1 run per experiment")
            values = [v for r in exps for v in r["values"]] + base["values"]
            lines.append(f"A/A runs: {len(values)}, val_bpb mean {statistics.mean(values):.4f}, std "
                         f"{statistics.stdev(values):.4f} (one run's noise at this budget)")
    for detune in dict.fromkeys(r.get("detune") for r in records if r["kind"] in ("gain", "planted")):
        gain = [r for r in records if r["kind"] == "gain" and r.get("detune") == detune]
        if gain:
            means = {}
            for name in ("detuned", "fixed"):
                vs = [r["val_bpb"] for r in gain if r["config"] == name]
                means[name] = statistics.mean(vs)
                sem = statistics.stdev(vs) / len(vs) ** 0.5 if len(vs) > 1 else float("nan")
                lines.append(f"planted gain ({detune}), {name}: val_bpb {means[name]:.4f} +- {sem:.4f} "
                             f"(mean +- sem of {len(vs)} runs: {', '.join(f'{v:.4f}' for v in vs)})")
            lines.append(f"planted gain ({detune}): {means['detuned'] - means['fixed']:+.4f} val_bpb")
        for rule in ("stat", "control"):
            tries = [r for r in records if r["kind"] == "planted" and r.get("detune") == detune
                     and r["rule"] == rule]
            if tries:
                kept = sum(r["status"] == "keep" for r in tries)
                runs = sum(r["runs"] for r in tries)
                lines.append(f"planted gain ({detune}), {rule} rule: kept in {kept} of {len(tries)} tries "
                             f"({100 * kept / len(tries):.0f}%), {runs / len(tries):.2f} runs per candidate, controls "
                             "included (plus 3 for each try's baseline); decisions: "
                             + "; ".join(f"{r['status']} ({r['decision']})" for r in tries))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", default="10", help="seconds of training per run (AUTORESEARCH_TIME_BUDGET)")
    parser.add_argument("--aa", type=int, default=20, help="A/A experiments under each of --rules")
    parser.add_argument("--rules", default="stat", help="the decision rules measured side by side (A/A and planted "
                        "gain), comma-separated: stat, control (issue 33: a drifting machine)")
    parser.add_argument("--aa-change", choices=("init", "comment"), default="init",
                        help="what each A/A experiment changes (see above)")
    parser.add_argument("--naive", type=int, default=0, help="A/A experiments under the naive rule, run for real")
    parser.add_argument("--tries", type=int, default=10, help="planted-gain tries")
    parser.add_argument("--gain-seeds", type=int, default=3, help="runs of each side to measure the planted gain")
    parser.add_argument("--detune", default="UNEMBEDDING_LR=0.001", help="the planted gain's detuned constant")
    parser.add_argument("--out", help="append every experiment as a JSON line here")
    parser.add_argument("--report", help="only print the report of this JSON-lines file")
    parser.add_argument("--keep", help="keep the scratch repositories in this directory")
    parser.add_argument("--drift", metavar="SLOW:PERIOD", help="a drifting machine (benchmarks/drift.py) for the "
                        "whole measurement: trainings at 1 - SLOW of their speed for PERIOD s, then PERIOD s normal")
    args = parser.parse_args()
    if args.report:
        print(report([json.loads(l) for l in Path(args.report).read_text().splitlines() if l.strip()]))
        return
    rules = args.rules.split(",")
    if not set(rules) <= {"stat", "control"}:
        raise SystemExit(f"--rules {args.rules!r}: a comma-separated list of stat and control")
    env = dict(os.environ, AUTORESEARCH_TIME_BUDGET=str(args.budget), PYTHONPATH=str(ROOT))
    setting = drift.parse_setting(args.drift) if args.drift else None
    tmp = Path(args.keep or tempfile.mkdtemp(prefix="decisions-"))
    tmp.mkdir(parents=True, exist_ok=True)
    out = args.out
    start = time.time()
    global DRIFT
    try:
        if setting:
            log = open(out + ".drift.log", "a") if out else sys.stderr
            DRIFT = drift.Drift(tmp, *setting, log=lambda line: print(line, file=log, flush=True)).start()
        if args.aa:
            aa(tmp, env, args.aa, rules, out, args.aa_change)
        if args.tries:
            planted(tmp, env, args.tries, args.gain_seeds, args.detune, rules, out)
        if args.naive:
            aa(tmp, env, args.naive, ["naive"], out, args.aa_change)
    finally:
        if DRIFT:
            DRIFT.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(report(RECORDS))
    print(f"took {(time.time() - start) / 60:.1f} min")


if __name__ == "__main__":
    main()
