"""Seconds outside the training budget per experiment, for one or more git revisions side by side.

    python benchmarks/overhead.py --rev 48c3bea --rev HEAD --budget 30 --runs 3

Each revision is cloned into a temporary directory (its own harness, prepare.py and train.py), set up on a
tag, and runs `autoresearch run` on its unchanged train.py `--runs` times; revisions take turns, so a slow
minute of the machine hits both. Outside-budget time is the whole `autoresearch run` command's wall clock
minus the budget: process starts, imports, the peak probe, data and model setup, export, evaluation and the
harness's own work. The parts come from the run's result.json and, where the revision has one, the
harness's evaluation.json. Uses the prepared data in AUTORESEARCH_CACHE (default ~/.cache/autoresearch).
Since the compile cache has a base per champion (autoresearch/compiled.py), a revision's first run also fills
that base (the compile phase, outside the budget, once per champion): its `outside` is not a typical run's,
which is why the table gives medians.
A revision written REV+venv gets a `.venv` inside its clone, as the README's quick start makes one: this
interpreter's site-packages, hard-linked (the same files and bytes a `pip install -e .` venv holds: ~2 GB, ~70,000
files with torch), to measure what a venv in the clone costs the harness per experiment:

    python benchmarks/overhead.py --rev HEAD --rev HEAD+venv --budget 30 --runs 3

An unaudited run at the real budget: under the naive rule a run is audited when it beats the best, which an
unchanged train.py does by chance. --worse runs every run after a revision's first with MATRIX_LR a hundredth of
the default's: the same model, the same costs outside the budget, a result certainly worse, so discarded and
scored without the audit (its first run after the change also fills the changed configuration's compile base):

    python benchmarks/overhead.py --budget 300 --runs 3 --worse

Run it alone: another torch process on the same cores makes every number meaningless.
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


def clone(spec: str, dest: Path) -> Path:
    rev, venv = (spec[:-len("+venv")], True) if spec.endswith("+venv") else (spec, False)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", rev], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", "-b", "bench"], check=True)
    if venv:
        import sysconfig
        site = Path(sysconfig.get_paths()["purelib"])
        target = dest / ".venv" / "lib" / site.parent.name / "site-packages"
        target.parent.mkdir(parents=True)
        if subprocess.run(["cp", "-al", str(site), str(target)]).returncode != 0:  # another filesystem: copy
            shutil.copytree(site, target, symlinks=True, dirs_exist_ok=True)
        files = sum(len(f) for _, _, f in os.walk(dest / ".venv"))
        print(f"{spec}: a .venv of {files:,} files in the clone", flush=True)
    return dest


def cli(repo: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    # `python -m` puts the clone first on sys.path, so each revision runs its own harness.
    return subprocess.run([sys.executable, "-m", "autoresearch.cli", *args], cwd=repo, env=env,
                          capture_output=True, text=True)


def naive_option(repo: Path, env: dict, command: str) -> list[str]:
    """One run per command: since the stat rule, a tag's first `run` would run the baseline 3 times. Since the
    tag pins its rule, `setup` takes the option; before, `run` did."""
    pinned = "--decision" in cli(repo, env, "setup", "--help").stdout
    wanted = "setup" if pinned else "run"
    has = "--decision" in cli(repo, env, "run", "--help").stdout
    return ["--decision", "naive"] if command == wanted and (pinned or has) else []


def last_line(text: str) -> str:
    """The run's verdict: its last line (a compile phase or a wait may print lines before it)."""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


WORSE = ("MATRIX_LR = 0.04 ", "MATRIX_LR = 0.0004 ")  # --worse: the default's Muon rate, and a hundredth of it


def make_worse(repo: Path) -> None:
    """train.py with its matrices' learning rate a hundredth of the default's (--worse): same shapes, same costs."""
    path = repo / "train.py"
    text = path.read_text()
    if WORSE[0] not in text:
        raise SystemExit(f"{repo}: --worse needs a train.py with {WORSE[0].strip()!r}")
    path.write_text(text.replace(WORSE[0], WORSE[1], 1))


def one_run(repo: Path, env: dict, budget: float, n: int) -> dict:
    naive = naive_option(repo, env, "run")
    t0 = time.perf_counter()
    proc = cli(repo, env, "run", "-m", f"unchanged {n}", *naive)
    total = time.perf_counter() - t0
    if proc.returncode not in (0, 1) and not last_line(proc.stdout).startswith("refused:"):  # a refusal took its time
        raise SystemExit(f"{repo}: autoresearch run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    run_dir = max((repo / ".autoresearch" / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    result_path = next((p for p in (run_dir / "out" / "result.json", run_dir / "result.json") if p.exists()), None)
    result = json.loads(result_path.read_text()) if result_path else {}  # out/: since the harness owns run_dir
    evaluation = run_dir / "evaluation.json"
    evaluation = json.loads(evaluation.read_text()) if evaluation.exists() else {}
    audit = run_dir / "audit.json"  # the causality audit made at the keep (since the audit moved there)
    audit = json.loads(audit.read_text()) if audit.exists() else {}
    m = {"total": total, "outside": total - budget, "status": last_line(proc.stdout).split(":", 1)[0],
         "training": result.get("training_seconds"), "startup": result.get("startup_seconds"),
         "train_eval": result.get("eval_seconds"), "export": result.get("export_seconds"),
         "harness_eval": evaluation.get("seconds"), "val": evaluation.get("val_seconds"),
         "load": evaluation.get("load_seconds"), "check": evaluation.get("check_seconds"),
         "test": evaluation.get("test_seconds"), "tok_s": result.get("tokens_per_second"),
         "compile": result.get("compile_seconds"), "dtype": result.get("dtype"),
         "audit": audit.get("seconds", evaluation.get("causal_seconds")), "mfu": result.get("mfu_percent"),
         "mem_gb": result.get("memory_gb"), "fa3": result.get("flash_attention_3"), "device": result.get("device")}
    if m["status"] not in ("keep", "discard", "confirm"):  # a crash or a refusal: say why
        print(f"  {last_line(proc.stdout)}", flush=True)
    # The parts of the outside time. The training process: from its start to result.json (outside_s) is its
    # imports and interpreter start, train.py's startup (model, data, probe), the last step's overshoot of the
    # budget, the export and the check rows; then the evaluator; the rest is the harness's own work.
    if "outside_s" in evaluation and result and m["harness_eval"] is not None:
        overshoot = result["training_wall_seconds"] - budget
        m["overshoot"] = overshoot
        m["imports_etc"] = evaluation["outside_s"] - result["startup_seconds"] - overshoot - result["export_seconds"]
        m["harness"] = total - budget - evaluation["outside_s"] - evaluation["seconds"]
    return m


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", action="append", help="git revision (repeatable; default HEAD)")
    parser.add_argument("--budget", type=float, default=30)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", help="write every measurement as JSON lines here")
    parser.add_argument("--worse", action="store_true",
                        help="every run after the first with a worse train.py: discarded, so never audited")
    args = parser.parse_args()
    revs = args.rev or ["HEAD"]
    env = dict(os.environ, AUTORESEARCH_TIME_BUDGET=f"{args.budget:g}")
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory() as tmp:
        repos = {}
        for i, rev in enumerate(revs):
            repos[rev] = clone(rev, Path(tmp) / f"r{i}")
            out = cli(repos[rev], env, "setup", "--tag", "overhead", *naive_option(repos[rev], env, "setup"))
            if out.returncode != 0:
                raise SystemExit(f"setup failed for {rev}: {out.stderr}")
        rows = {rev: [] for rev in revs}
        for n in range(args.runs):
            for rev in revs:
                if args.worse and n > 0:  # a discard put train.py back: worse again, before each run
                    make_worse(repos[rev])
                m = one_run(repos[rev], env, args.budget, n)
                rows[rev].append(m)
                print(f"{rev:>12} run {n + 1}: " + " ".join(
                    f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in m.items()), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps({"rev": rev, "budget": args.budget, "worse": args.worse and n > 0, **m})
                                + "\n")
    print(f"\nmedians over {args.runs} runs, budget {args.budget:g} s (seconds):")
    keys = ["outside", "imports_etc", "startup", "overshoot", "export", "harness_eval", "load", "check", "val",
            "test", "audit", "harness", "compile", "tok_s", "mfu"]
    print(f"{'revision':>12} " + " ".join(f"{k:>12}" for k in keys))
    # imports_etc: interpreter start, imports and the check rows in train.py; overshoot: the last step past the
    # budget; harness_eval: the evaluator after the harness handed it the run (load: the export loaded, on a GPU
    # with its context; check: the check rows' forwards; val: its validation pass; test: the test split's, scored
    # for a run that may be kept; audit: the causality probes).
    for rev in revs:
        cells = []
        for k in keys:
            values = [m[k] for m in rows[rev] if m.get(k) is not None]
            cells.append(f"{statistics.median(values):12.1f}" if values else f"{'-':>12}")
        print(f"{rev:>12} " + " ".join(cells))


if __name__ == "__main__":
    main()
