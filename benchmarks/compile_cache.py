"""What the compile cache costs and saves under the champion-base design (autoresearch/compiled.py), measured
through the real harness on the prepared data, against the alternative it was chosen over.

    python benchmarks/compile_cache.py --budget 120

In a scratch clone of this checkout, on a fresh compile cache (beside a copy of the data cache):
1. `autoresearch run` of the unchanged default: the champion's compile phase fills the base (cold, outside the
   budget), then the run trains from a private copy of it: its first step is a warm compile;
2. the same again: no compile phase, a warm first step;
3. a change of constants (WARMDOWN_RATIO): the same graph, warm;
4. a change of shape (DEPTH + 1): a new graph, compiled cold inside the budget, as on every run of it;
5. the alternative design, a compile phase for every new configuration: the phase's time on a base that already
   holds the graph (a constants-only change would pay this outside the budget on every new configuration).
Reports the seconds of each and the private copy's cost. Run it alone (2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def cli(repo: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoresearch.cli", *args], cwd=repo, env=env, capture_output=True,
                          text=True)


def first_step(repo: Path) -> float | None:
    run_dir = max((repo / ".autoresearch" / "runs").iterdir(), key=lambda p: p.name)
    found = re.search(r"^training=\S+ compile=([\d.]+)s", (run_dir / "run.log").read_text(), re.M)
    return float(found.group(1)) if found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=120)
    parser.add_argument("--out", help="append the measurements as one JSON line here")
    args = parser.parse_args()
    import prepare
    from autoresearch import compiled, sandbox, sites
    from autoresearch.state import FIXED
    source_cache = prepare.cache_dir()
    with tempfile.TemporaryDirectory(prefix="autoresearch-compilebench-") as tmp:
        cache = Path(tmp) / "cache"  # its own data cache, so its compile cache starts empty
        shutil.copytree(source_cache, cache, ignore=shutil.ignore_patterns("downloads"))
        repo = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
        from autoresearch import untrusted  # the reviewed train.py, never an experiment branch's (docs/integrity.md)
        subprocess.run(["git", "-C", str(repo), "checkout", "-q", "-B", "bench", untrusted.commit(ROOT)], check=True)
        env = dict(os.environ, AUTORESEARCH_CACHE=str(cache), AUTORESEARCH_TIME_BUDGET=f"{args.budget:g}")
        env.pop("PYTHONPATH", None)
        out = cli(repo, env, "setup", "--tag", "compile", "--decision", "naive")
        assert out.returncode == 0, out.stderr
        m = {"budget": args.budget}

        def run(label: str) -> None:
            t0 = time.perf_counter()
            proc = cli(repo, env, "run", "-m", label)
            m[f"{label}_command_s"] = round(time.perf_counter() - t0, 1)
            m[f"{label}_first_step_s"] = first_step(repo)
            m[f"{label}_status"] = proc.stdout.split(":", 1)[0]
            print(f"{label}: first step {m[f'{label}_first_step_s']} s, command {m[f'{label}_command_s']} s, "
                  f"{m[f'{label}_status']}", flush=True)

        run("unchanged-1")
        records = {p.stem.removesuffix(".done"): json.loads(p.read_text()) for p in compiled.root(cache).glob("*.done")}
        m["phase_cold_s"] = max(r["seconds"] for r in records.values())
        print(f"compile phase, cold: {m['phase_cold_s']} s (outside the budget)", flush=True)
        run("unchanged-2")
        train = repo / "train.py"
        train.write_text(sites.set_constants(train.read_text(), {"WARMDOWN_RATIO": 0.4}, "cpu"))
        run("constants")
        subprocess.run(["git", "-C", str(repo), "checkout", "-q", "--", "train.py"], check=True)
        text = train.read_text()
        depth = int(re.search(r"^DEPTH = (\d+) if CPU", text, re.M).group(1))
        train.write_text(sites.set_constants(text, {"DEPTH": depth + 1}, "cpu"))
        run("shape")
        subprocess.run(["git", "-C", str(repo), "checkout", "-q", "--", "train.py"], check=True)

        # The alternative: a compile phase per configuration, on a base that already holds the graph.
        base = next(p for p in compiled.root(cache).iterdir() if p.is_dir() and p.name in records)
        work = Path(tmp) / "phase"
        work.mkdir()
        (work / "train.py").write_text(train.read_text())
        for name in FIXED:
            shutil.copy(repo / name, work / name)
        manifest = json.loads((cache / "manifest.json").read_text())
        tag = json.loads((repo / ".autoresearch" / "tags" / "compile.json").read_text())
        view = sandbox.make_view(work, cache, manifest, tag.get("peak_flops"), tokens=False)
        argv = [sys.executable, "train.py"]
        if tag["protection"] == "bwrap":
            argv = sandbox.wrap_compile_phase(argv, work, base)
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=work, env=compiled.phase_env(view, base, os.cpu_count() or 1), check=True,
                       capture_output=True)
        m["phase_warm_s"] = round(time.perf_counter() - t0, 1)
        (Path(tmp) / "copy-test").mkdir()
        t0 = time.perf_counter()
        copy = compiled.private_copy(base, Path(tmp) / "copy-test")
        m["private_copy_s"] = round(time.perf_counter() - t0, 3)
        m["base_mb"] = round(sum(f.stat().st_size for f in copy.rglob("*") if f.is_file()) / 1e6, 1)
        print(f"compile phase on a warm base (the per-configuration alternative's cost): {m['phase_warm_s']} s; "
              f"private copy of the base: {m['private_copy_s']} s for {m['base_mb']} MB", flush=True)
    print(json.dumps(m))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(m) + "\n")


if __name__ == "__main__":
    main()
