"""Full-budget training runs of train.py with some constants changed, over several seeds, side by side.

    python benchmarks/sweep.py --seeds 0 1 2 --out sweep.jsonl @d6ebd4d baseline 'DEPTH=6,MODEL_DIM=192'
    python benchmarks/sweep.py --seeds 0 1 2 --out sweep.jsonl baseline 'mlp_ratio.ratio=2' 'mlp_ratio.ratio=2,DEPTH=3'
    python benchmarks/sweep.py --report sweep.jsonl

Each argument is one configuration: comma-separated NAME=VALUE (Python literals) applied to the active
profile's constants of this checkout's train.py, or IDEA.PARAM=VALUE, an idea of the built-in researcher's
catalog set to a variant (autoresearch/ideas.py, e.g. 'mlp_ratio.ratio=2'); 'baseline' changes nothing; a
leading '@REV' takes train.py from that git revision instead (e.g. '@d6ebd4d' for an old default,
'@d6ebd4d,DEPTH=6'). Runs go seed by seed and, within a seed, configuration by configuration, so a slow hour of
the machine hits every configuration. Every run writes one JSON line (its result.json, the configuration and
the seed) to --out and prints a row; the same command again resumes: a (configuration, seed) already in --out
is not run again. At the end, and with --report, a table of mean +- sem over seeds per configuration, with the median seconds
outside the budget (the process's wall clock minus its training, which by hand includes the validation pass). train.py runs by hand (it
evaluates val_bpb itself on the validation split, which the harness reproduces to 1e-5 in float32), with the
prepared data, AUTORESEARCH_TIME_BUDGET (300 s by default), and the harness's compile cache. Run it alone.
"""

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoresearch.sites import set_constants  # noqa: E402
from autoresearch import compiled, ideas  # noqa: E402


def parse_config(text: str) -> tuple[str | None, dict]:
    """(git revision or None, changes: a constant's NAME or an idea's (IDEA, PARAM) to its value)."""
    rev = None
    if text.startswith("@"):
        rev, _, text = text[1:].partition(",")
    if text in ("", "baseline"):
        return rev, {}
    changes = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        name = name.strip()
        changes[tuple(name.split(".", 1)) if "." in name else name] = ast.literal_eval(value.strip())
    return rev, changes


def edited(rev: str | None, changes: dict, profile: str) -> str:
    """train.py of `rev` with the changes applied: the constants', then each idea's variant."""
    source = set_constants(source_of(rev), {k: v for k, v in changes.items() if isinstance(k, str)}, profile)
    by_idea = {}
    for key, value in changes.items():
        if isinstance(key, tuple):
            by_idea.setdefault(key[0], {})[key[1]] = value
    for name, params in by_idea.items():
        if name not in ideas.IDEAS:
            raise SystemExit(f"{name}: no such idea (the catalog: {', '.join(sorted(ideas.IDEAS))})")
        source = ideas.apply(source, ideas.IDEAS[name], params, profile)
    return source


def source_of(rev: str | None) -> str:
    if rev is None:  # the reviewed train.py, never the work tree's (docs/integrity.md)
        from autoresearch import untrusted
        return untrusted.source(ROOT)
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:train.py"], check=True, capture_output=True,
                          text=True).stdout


def report(rows: list[dict]) -> None:
    by = {}
    for r in rows:
        by.setdefault(r["config"], []).append(r)
    print(f"\n{'config':45s} {'n':>2s} {'val_bpb mean':>12s} {'sem':>7s} {'steps':>6s} {'tok/s':>7s} {'compile_s':>9s} "
          f"{'outside_s':>9s} {'eval_s':>6s}")
    for config, rs in by.items():
        v = [r["val_bpb"] for r in rs]
        sem = statistics.stdev(v) / len(v) ** 0.5 if len(v) > 1 else float("nan")
        print(f"{config:45s} {len(v):2d} {statistics.fmean(v):12.4f} {sem:7.4f} "
              f"{statistics.median(r['num_steps'] for r in rs):6.0f} "
              f"{statistics.median(r['tokens_per_second'] for r in rs):7.0f} "
              f"{statistics.median(r['compile_seconds'] for r in rs):9.1f} "
              f"{statistics.median(r.get('wall_seconds', float('nan')) - r['training_seconds'] for r in rs):9.1f} "
              f"{statistics.median(r['eval_seconds'] for r in rs):6.1f}")


def already_run(out: Path, configs, seeds) -> list[dict]:
    """The runs `out` holds of these configurations and seeds: a sweep started again does not repeat them."""
    if not out.exists():
        return []
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["config"] in configs and r["seed"] in seeds]


def run_once(source: str, cache: Path, extra_env: dict) -> tuple[dict | str, float]:
    """Run one train.py by hand in a scratch directory: (its result.json, or the end of its output if it
    crashed; the process's wall seconds). The compile cache is one beside the harness's bases, kept across the
    sweep's runs, so warm graphs stay warm (a sweep runs by hand: no run of it is judged by the harness)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "train.py").write_text(source)
        env = dict(os.environ, AUTORESEARCH_RUN_DIR=tmp, PYTHONPATH=str(ROOT),
                   TORCHINDUCTOR_CACHE_DIR=str(compiled.root(cache) / "sweep"), **extra_env)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "train.py"], cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        result_path = Path(tmp) / "result.json"
        if proc.returncode != 0 or not result_path.exists():
            return f"{proc.stdout[-500:]} {proc.stderr[-1500:]}", wall
        return json.loads(result_path.read_text()), wall


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="*")
    parser.add_argument("--seeds", type=int, nargs="+", default=[42])
    parser.add_argument("--out", default="sweep.jsonl")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--report", help="only print the table of an earlier --out file")
    parser.add_argument("--warm", action="store_true",
                        help="first run each configuration once for 1 s and drop it, so that no seed pays a cold "
                             "torch.compile (30-90 s on 2 cores for a new graph) and every one starts warm")
    args = parser.parse_args()
    if args.report:
        report([json.loads(line) for line in open(args.report)])
        return
    editions = {text: edited(rev, changes, args.profile)
                for text in args.configs for rev, changes in [parse_config(text)]}  # bad configs fail before any run
    cache = Path(os.environ.get("AUTORESEARCH_CACHE") or Path.home() / ".cache" / "autoresearch")
    done = already_run(Path(args.out), editions, args.seeds)
    finished = {(r["config"], r["seed"]) for r in done}
    if finished:
        print(f"{len(finished)} run(s) already in {args.out}: not run again", flush=True)
    for text, source in editions.items() if args.warm else ():
        if all((text, seed) in finished for seed in args.seeds):
            continue
        _, wall = run_once(source, cache, {"AUTORESEARCH_TIME_BUDGET": "1"})
        print(f"{text:45s} warmed in {wall:.0f} s", flush=True)
    print(f"{'config':45s} {'seed':>4s} {'val_bpb':>8s} {'steps':>6s} {'tok/s':>7s} {'mfu%':>5s} {'compile_s':>9s}")
    for seed in args.seeds:
        for text, source in editions.items():
            if (text, seed) in finished:
                continue
            result, wall = run_once(source, cache, {"AUTORESEARCH_SEED": str(seed)})
            if isinstance(result, str):
                print(f"{text:45s} {seed:4d} crashed: {result}", flush=True)
                continue
            result |= {"config": text, "seed": seed, "wall_seconds": wall, "cache": str(cache)}
            done.append(result)
            with open(args.out, "a") as f:
                f.write(json.dumps(result) + "\n")
            print(f"{text:45s} {seed:4d} {result['val_bpb']:8.4f} {result['num_steps']:6d} "
                  f"{result['tokens_per_second']:7.0f} {result['mfu_percent']:5.1f} {result['compile_seconds']:9.1f}",
                  flush=True)
    report(done)


if __name__ == "__main__":
    main()
