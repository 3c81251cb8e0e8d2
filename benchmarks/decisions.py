"""Does the decision rule beat the noise? An A/A loop and a planted gain, through the real harness.

    python benchmarks/decisions.py --budget 10 --aa 20 --naive 20 --tries 10 --out decisions.jsonl
    python benchmarks/decisions.py --report decisions.jsonl

Everything runs in a scratch repository (this checkout's train.py, prepare.py and runtime.py, the harness from this
checkout) on the prepared data in AUTORESEARCH_CACHE, with `autoresearch run` exactly as an agent calls it:
- A/A: a tag whose baseline runs as usual, then --aa experiments that each make a change that cannot matter.
  Every keep is a false keep. --aa-change init (the default) draws i random numbers right after
  torch.manual_seed: the model starts from other weights of the same distribution (the data order is the
  harness's seed), so the change is a fresh sample of the same quality, as a real change's run is on the
  champion's seed (study.seed pairs them). --aa-change comment only adds a comment: with paired seeds that is
  the same computation as the champion's, which any rule should find trivially. The naive rule (one run, kept when below the best single
  run) is measured twice: replayed on the first runs of the same experiments, and run for real (--naive N, a
  tag with `--decision naive`).
- Planted gain: a base with one constant detuned (--detune, default UNEMBEDDING_LR=0.001: the cpu default
  0.004, 4x too small). First the gain is measured (3 runs of each, by hand); then each of --tries tries is a
  fresh tag on the detuned base (its baseline: 3 runs) and the fix (the default value back) as the candidate,
  on the try's seeds (its k-th run on its baseline's k-th: paired). The fix should be kept.
Each experiment is a JSON line (--out); the report gives false keeps, kept fixes and the runs each rule spent.
Run it alone (2 cores): it trains all the time. With --keep DIR and --out, a measurement stopped midway (a
session's end, Ctrl-C) resumes when the same command is run again: the experiments with a record are not run again,
the one in flight goes on where its tag's ledger stands.

    python benchmarks/decisions.py --budget 30 --rules control:20,stat:10 --tries 0 --drift 0.33:180 \
        --keep /tmp/dec --out dec.jsonl    # (again, to resume)

--rules control:20,stat:10 gives each rule its number of A/A experiments (the first ten of each interleaved, then
control's alone); --set NAME=VALUE changes a constant of every base's train.py (cpu profile), e.g.
USE_COMPILE=False for an eager model at a short budget.

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
from autoresearch import ledger, processes, untrusted  # noqa: E402
from autoresearch.state import FIXED  # noqa: E402
from autoresearch.sites import read_constants, set_constants  # noqa: E402

RECORDS: list[dict] = []
DRIFT: drift.Drift | None = None  # the drift switched on by --drift, if any
BUDGET: str | None = None  # --budget


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


BASE_SETTINGS: dict[str, object] = {}  # --set: constants of this checkout's train.py changed for every base


def base_source() -> str:
    """This checkout's train.py with --set's constants: the base of every A/A tag and of the planted gain."""
    source = untrusted.source(ROOT)
    return set_constants(source, BASE_SETTINGS, "cpu") if BASE_SETTINGS else source


def scratch(tmp: Path, name: str, detune: str | None) -> Path:
    repo = tmp / name
    repo.mkdir()
    for name in (*FIXED, ".gitignore"):
        shutil.copy(ROOT / name, repo / name)
    source = base_source()
    (repo / "train.py").write_text(detuned_and_fixed(source, detune)[0] if detune else source)
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
    record["budget"] = BUDGET
    record["settings"] = BASE_SETTINGS
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


def done(kind: str, rule: str, **match) -> list[dict]:
    """The records of this kind and rule so far (those of --out read back on resume, then this run's)."""
    return [r for r in RECORDS if r["kind"] == kind and r["rule"] == rule
            and all(r.get(k) == v for k, v in match.items())]


def aa(tmp: Path, env: dict, counts: dict[str, int], out, change: str = "init") -> None:
    """counts[rule] A/A experiments under each rule, each rule in its own repository and tag, interleaved (the
    first experiment under every rule, then the second, ...) so the rules share the same minutes of the machine.
    Resumes: an experiment with a record is not run again; one that was interrupted goes on (its train.py is
    still in the repository, and `autoresearch run` continues an open series)."""
    repos = {}
    for rule in counts:
        repo = tmp / f"aa-{rule}"
        if not done("aa-baseline", rule):
            shutil.rmtree(repo, ignore_errors=True)  # a baseline that did not finish: the rule starts over
            repo = scratch(tmp, f"aa-{rule}", detune=None)
            cli(repo, env, "setup", "--tag", f"aa-{rule}", "--decision", rule)
            started = time.time()
            cli(repo, env, "run", "-m", "baseline")
            emit(out, experiment_record("aa-baseline", rule, tag_rows(repo, f"aa-{rule}"), 0), started)
        repos[rule] = repo
    for i in range(1, max(counts.values(), default=0) + 1):
        for rule, repo in repos.items():
            finished = done("aa", rule)
            if i > counts[rule] or i <= len(finished):
                continue
            source = (repo / "train.py").read_text()
            if f"# A/A change {i}:" not in source:  # (there already when experiment i was interrupted)
                (repo / "train.py").write_text(aa_change(source, i, change))
            before = done("aa-baseline", rule)[0]["runs"] + sum(r["runs"] for r in finished)
            started = time.time()
            cli(repo, env, "run", "-m", f"A/A {i}")
            emit(out, experiment_record("aa", rule, tag_rows(repo, f"aa-{rule}"), before), started)


def measure_gain(repo: Path, env: dict, seeds: int, fixed: str, detune: str, out) -> None:
    """val_bpb of the detuned base and of the fix, by hand (train.py sees the validation split then)."""
    for name, source in (("detuned", (repo / "train.py").read_text()), ("fixed", fixed)):
        work = repo.parent / f"gain-{name}"
        work.mkdir(exist_ok=True)
        for f in FIXED:
            shutil.copy(repo / f, work / f)
        (work / "train.py").write_text(source)
        for seed in range(1, seeds + 1):
            if any(r["kind"] == "gain" and r.get("detune") == detune and r["config"] == name and r["seed"] == seed
                   for r in RECORDS):
                continue  # measured before an interruption
            started = time.time()
            with tempfile.TemporaryDirectory() as run_dir:
                run_env = dict(env, AUTORESEARCH_SEED=str(seed), AUTORESEARCH_RUN_DIR=run_dir)
                subprocess.run([sys.executable, "train.py"], cwd=work, env=run_env, capture_output=True, check=True)
                result = json.loads((Path(run_dir) / "result.json").read_text())
            emit(out, {"kind": "gain", "detune": detune, "config": name, "seed": seed, "val_bpb": result["val_bpb"],
                       "steps": result["num_steps"]}, started)


def planted(tmp: Path, env: dict, tries: int, gain_seeds: int, detune: str, rules: list[str], out) -> None:
    """Each try: under every rule in turn (the same minutes), a fresh tag on the detuned base (its baseline's
    three runs) and the fix as its candidate, on the try's seeds. Resumes: a try with a record is not run again;
    an interrupted one starts over in a tag of its own."""
    repo = tmp / "planted"
    if not repo.exists():
        repo = scratch(tmp, "planted", detune=detune)
    _, fixed, fix_description = detuned_and_fixed(base_source(), detune)
    if gain_seeds:
        measure_gain(repo, env, gain_seeds, fixed, detune, out)
    for k in range(1, tries + 1):
        for rule in rules:
            if done("planted", rule, detune=detune, **{"try": k}):
                continue
            sh(repo, "git", "checkout", "-q", "-f", "main")
            tag = f"try{k}" if rule == "stat" else f"try{k}-{rule}"
            taken = set(sh(repo, "git", "branch", "--format=%(refname:short)").split())
            tag = next(f"{tag}{suffix}" for suffix in ("", "b", "c", "d", "e", "f") if f"autoresearch/{tag}{suffix}"
                       not in taken)  # an interrupted try's tag stays as it was
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
                     f"{runs} runs ({runs / len(exps):.2f} per experiment) plus {base['runs']} for the baseline; "
                     f"{sum(r['runs'] > 1 for r in exps)} past the first run")
        if rule == "stat" and base["values"]:
            replay = naive_replay([base["values"][0]] + [r["first_val_bpb"] for r in exps])
            lines.append(f"A/A, naive rule replayed on the same experiments' first runs: {replay} false keeps in "
                         f"{len(exps)} ({100 * replay / len(exps):.0f}%), 1 run per experiment")
            values = [v for r in exps for v in r["values"] if v > 0] + base["values"]  # (a pruned run has none)
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
    global BUDGET, DRIFT
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", default="10", help="seconds of training per run (AUTORESEARCH_TIME_BUDGET)")
    parser.add_argument("--aa", type=int, default=20, help="A/A experiments under each of --rules (a rule's own count: "
                        "RULE:N in --rules)")
    parser.add_argument("--rules", default="stat", help="the decision rules measured side by side (A/A and planted "
                        "gain), comma-separated: stat, control (issue 33: a drifting machine); control:20,stat:10 "
                        "gives each its number of A/A experiments")
    parser.add_argument("--aa-change", choices=("init", "comment"), default="init",
                        help="what each A/A experiment changes (see above)")
    parser.add_argument("--naive", type=int, default=0, help="A/A experiments under the naive rule, run for real")
    parser.add_argument("--tries", type=int, default=10, help="planted-gain tries")
    parser.add_argument("--gain-seeds", type=int, default=3, help="runs of each side to measure the planted gain")
    parser.add_argument("--detune", default="UNEMBEDDING_LR=0.001", help="the planted gain's detuned constant")
    parser.add_argument("--out", help="append every experiment as a JSON line here")
    parser.add_argument("--report", help="only print the report of this JSON-lines file")
    parser.add_argument("--keep", metavar="DIR", help="keep the scratch repositories in DIR; with --out, a "
                        "measurement stopped midway resumes where it stopped when run again with the same arguments")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a constant of train.py's cpu profile changed in every base (e.g. USE_COMPILE=False)")
    parser.add_argument("--drift", metavar="SLOW:PERIOD", help="a drifting machine (benchmarks/drift.py) for the "
                        "whole measurement: trainings at 1 - SLOW of their speed for PERIOD s, then PERIOD s normal")
    args = parser.parse_args()
    if args.report:
        print(report([json.loads(l) for l in Path(args.report).read_text().splitlines() if l.strip()]))
        return
    counts = {}
    for item in args.rules.split(","):
        rule, _, n = item.partition(":")
        if rule not in ("stat", "control") or (n and not n.isdigit()):
            raise SystemExit(f"--rules {args.rules!r}: a comma-separated list of stat and control, each optionally "
                             "with its number of A/A experiments (control:20,stat:10)")
        counts[rule] = int(n) if n else args.aa
    rules = list(counts)
    defaults = read_constants(untrusted.source(ROOT), "cpu")
    for item in args.set:
        name, eq, value = item.partition("=")
        if not eq or name not in defaults:
            raise SystemExit(f"--set {item!r}: NAME=VALUE with NAME a constant of train.py ({', '.join(defaults)})")
        BASE_SETTINGS[name] = value == "True" if isinstance(defaults[name], bool) else type(defaults[name])(value)
    BUDGET = str(args.budget)
    env = dict(os.environ, AUTORESEARCH_TIME_BUDGET=BUDGET, PYTHONPATH=str(ROOT))
    setting = drift.parse_setting(args.drift) if args.drift else None
    tmp = Path(args.keep or tempfile.mkdtemp(prefix="decisions-"))
    tmp.mkdir(parents=True, exist_ok=True)
    out = args.out
    if out and Path(out).exists():
        if not args.keep:
            raise SystemExit(f"{out} holds a measurement: give --keep DIR (its scratch repositories) to resume it, "
                             "or another --out")
        RECORDS.extend(json.loads(l) for l in Path(out).read_text().splitlines() if l.strip())
        for r in RECORDS[-1:]:
            asked = {"budget": str(args.budget), "drift": drift.Drift(tmp, *setting).setting if setting else None,
                       "settings": BASE_SETTINGS}
            differs = [k for k, v in asked.items() if k in r and r[k] != v
                       and not (k == "budget" and r[k] is None)]  # (not recorded before 2026-12-02 08:40)
            if differs:
                raise SystemExit(f"{out} was measured with other settings ({', '.join(f'{k}={r[k]!r}' for k in differs)}):"
                                 " resume it with the same arguments, or give another --out")
        print(f"resuming {out}: {len(RECORDS)} records", flush=True)
    start = time.time()
    try:
        if setting:
            log = open(out + ".drift.log", "a") if out else sys.stderr
            DRIFT = drift.Drift(tmp, *setting, log=lambda line: print(line, file=log, flush=True)).start()
        if any(counts.values()):
            aa(tmp, env, counts, out, args.aa_change)
        if args.tries:
            planted(tmp, env, args.tries, args.gain_seeds, args.detune, rules, out)
        if args.naive:
            aa(tmp, env, {"naive": args.naive}, out, args.aa_change)
    finally:
        if DRIFT:
            DRIFT.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(report(RECORDS))
    print(f"took {(time.time() - start) / 60:.1f} min")


if __name__ == "__main__":
    main()
