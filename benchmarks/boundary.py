"""What the training's boundary (issue 50) costs a run, on this machine: the compile cache's private copy made
file by file by the harness (compiled.copy_base: directories and regular files only, checked on the open descriptor)
against `cp -a` (before), onto the disk and onto the run's tmpfs; a tmpfs mounted and settled for out/; a cgroup
made, entered and removed. Interleaved, median of --repeats.

    python prepare.py && python benchmarks/boundary.py            # fills a real base first (a cold compile, ~1 min)

The base is the shipped train.py's (the default configuration's compile phase, sandboxed where bubblewrap works).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    import prepare

    from autoresearch import cgroups, compiled, fixed, machine, sandbox, scratch, state, untrusted
    from autoresearch.tagconfig import Tag
    cache = prepare.cache_dir()
    work = Path(tempfile.mkdtemp(prefix="autoresearch-boundary-"))
    try:
        bench_cache = work / "cache"
        bench_cache.symlink_to(cache)
        half = fixed.FixedHalf({n: (ROOT / n).read_bytes() for n in state.FIXED}, bench_cache,
                               prepare.require_manifest())
        from dataclasses import replace

        from autoresearch import tags
        tag = Tag("bench", "autoresearch/bench", "f", 300, "c", hardware=machine.hardware())
        tag = replace(tag, peak_flops=tags.machine_peaks(half.sources, tag.threads_per_run(), tag.hardware))
        protection = "bwrap" if sandbox.bwrap_works() else "none"
        t0 = time.perf_counter()
        base = compiled.ensure_base(half, tag, compiled.Wanted("benchmark000", untrusted.source(ROOT)), protection,
                                    log=lambda *a: None)
        phase = time.perf_counter() - t0
        files = sum(1 for p in base.rglob("*") if p.is_file())
        size = compiled.check(base)
        print(f"{machine.describe(machine.hardware())}; base: {files} files, {size / 1e6:.0f} MB "
              f"(compile phase {phase:.0f} s, {protection})", flush=True)
        results: dict[str, list[float]] = {k: [] for k in ("cp -a", "checked copy (disk)", "checked copy (tmpfs)",
                                                             "out/ tmpfs mount + settle", "cgroup make + enter + close")}
        for _ in range(args.repeats):
            dest = work / "dest"
            results["cp -a"].append(timed(lambda: subprocess.run(["cp", "-a", str(base), str(dest)], check=True)))
            shutil.rmtree(dest)
            results["checked copy (disk)"].append(timed(lambda: compiled.copy_base(base, dest)))
            shutil.rmtree(dest)
            run_dir = work / "run"
            run_dir.mkdir()
            results["checked copy (tmpfs)"].append(timed(lambda: compiled.private_copy(base, run_dir)))
            scratch.release(run_dir / sandbox.COMPILE_DIR)
            out = run_dir / sandbox.OUT_DIR

            def out_cycle():
                scratch.bounded_dir(out, scratch.OUT_LIMIT)
                scratch.prepare_kept(out)
                (out / "result.json").write_text("{}")
                scratch.settle(out, ("result.json",), {})
            results["out/ tmpfs mount + settle"].append(timed(out_cycle))
            shutil.rmtree(run_dir)

            def cgroup_cycle():
                cg, _ = cgroups.make("bench")
                if cg is not None:
                    subprocess.run(cg.wrap(["true"]), check=True)
                    cg.cpu_seconds()
                    cg.close()
            results["cgroup make + enter + close"].append(timed(cgroup_cycle))
        print(f"\n| step | median s ({args.repeats} interleaved) | min | max |\n|---|---|---|---|")
        for name, values in results.items():
            print(f"| {name} | {statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} |")
    finally:
        scratch.release(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
