"""torch.compile's cache, with no channel from one run to the next.

An unchanged graph compiles in seconds from inductor's cache instead of 25-80 s on 2 CPU cores. But a cache the
training writes and a later run reads carries whatever the training puts there (weights, say: three budgets of
training in one run). So the cache has two layers:

- a *base* per configuration (train.py) and what else changes the code inductor compiles for it (the threads per
  run, the machine and torch: key()), filled only by a **compile phase**: that train.py run by the harness in
  compile-only mode (runtime.COMPILE_ONLY_ENV): random tokens instead of data, one step, no export, in a sandbox
  where the base is the only thing it may write and no token file exists. It sees no data, so nothing in it can
  come from data. It runs outside any budget, once per base, before the configuration's first run; a new
  configuration's base starts as a copy of the tag's base configuration's, so a change of constants costs its phase about 6 s
  and a change of shape its cold compile (about a minute on 2 cores), outside the budget. The harness records
  that it ran (`<base>.done`, beside the base, where the phase cannot write); the run's log says which base it
  started from (note());
- every run trains with a **private copy** of its base (run_dir/compile, `cp -a`: 0.06 s for the default's
  155 MB), writable, deleted after the run: what a training writes there reaches no one.

So every run starts warm, whatever it changed: what its first step costs inside the budget is loading its own
kernels, never compiling them, and never depends on what ran before (issue 34: a change of shape compiled cold
inside its budget, about a minute of 300 s on 2 cores, and crashed at a 10 s budget). Without bubblewrap nothing
stops a training from writing the base directly; the harness then compares the base before and after each run
and throws it away when it changed (the run is refused).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from autoresearch import cgroups, descriptions, fixed, guard, machine, processes, sandbox, scratch
from autoresearch.scratch import Unaccepted
from autoresearch.tagconfig import Tag

PHASE_TIMEOUT = 300   # seconds for a compile phase: a cold compile of the default takes 25-82 s on 2 CPU cores.
                      # It bounds what a phase can compute without data and leave for later runs (docs/integrity.md)
KEEP_BASES = 6        # bases kept per data cache (~160 MB each on the cpu profile); the least recently used go.
                      # A base per configuration: a loop's champion and its workers' candidates, on two thread counts


def root(cache: Path) -> Path:
    """Where the bases of one data cache live: beside it."""
    return cache.parent / f"{cache.name}-compile"


def key(config_id: str, config: Tag) -> str:
    """A base's name: the configuration, and what else the harness controls that changes the code inductor
    compiles for it. What inductor's own cache keys hold (torch 2.13, _inductor/codecache.py): the FX graph's
    key has parallel_num_threads(), i.e. torch.get_num_threads(), which CPU C++ kernels specialize on (set by the
    harness: OMP_NUM_THREADS = the tag's threads per run), the torch version, the GPU's name and CUDA version
    (CacheBase.get_system) and the default dtype; a C++ kernel's key has the compile command with the CPU's
    vector ISA (pick_vec_isa; machine.hardware's CPU name carries it). train.py's matmul dtype follows the device
    and the tag's peak FLOP/s (runtime.pick_dtype), measured at each tag's setup. So: the device and threads in
    clear, the device's name, torch, the tag's peaks and the Python environment (sys.prefix) hashed. Keyed by
    configuration alone, a base filled at 2 threads served a --workers 2 tag's runs (1 thread each) nothing: each
    compiled cold inside its budget (issue 34)."""
    hw = config.hardware or machine.hardware()
    # the peaks: they decide bf16 or float32 on a CPU, and two tags on one machine may choose differently; the
    # Python environment: a C++ kernel's key holds its compile command, with torch's include paths
    machine_id = hashlib.sha256(json.dumps([hw.get("device"), hw.get("name"), hw.get("torch"),
                                            config.peak_flops, sys.prefix], sort_keys=True).encode()).hexdigest()
    return f"{config_id}-{hw.get('device')}-t{config.threads_per_run()}-{machine_id[:8]}"


def base_dir(cache: Path, name: str) -> Path:
    return root(cache) / name


def ready(cache: Path, name: str) -> dict | None:
    """The record of a finished compile phase for this base (a key()), None if it has not run."""
    try:
        return json.loads((root(cache) / f"{name}.done").read_text())
    except (OSError, ValueError):
        return None


def note(base: Path) -> str:
    """The line the harness appends to a run's log (after the training's output): the base it started from."""
    try:
        done = json.loads((base.parent / f"{base.name}.done").read_text())
    except (OSError, ValueError):
        done = {}
    failed = "" if done.get("ok") else ", which failed: this run compiled cold"
    return (f"compile cache: started from base {base.name} (its compile phase: {done.get('seconds')} s at "
            f"{done.get('time')}{failed})")


def phase_env(view: Path, base: Path, threads: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTORESEARCH_", "PYTHON", "TORCHINDUCTOR_"))}
    env.update(AUTORESEARCH_CACHE=str(view), TORCHINDUCTOR_CACHE_DIR=str(base), PYTHONDONTWRITEBYTECODE="1",
               HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(threads))
    env[fixed.runtime().COMPILE_ONLY_ENV] = "1"
    return env


@dataclass(frozen=True)
class Wanted:
    """The train.py a base is for: its configuration (tags.config_of), its source, and the configuration whose
    base a new one starts from ("" for none): the tag's base configuration, whose phase ran the code the user set
    the tag up with. Never a champion's: its phase ran an agent's code, and inductor loads what a phase leaves
    (pickled graphs) as code in every run that starts from it; a champion's base copied into each new
    configuration's would reach every later candidate's runs, and the base configuration's own (its refill after
    a prune), the yardstick of pruning and the control rule (issue 50, the red team's)."""
    config_id: str
    source: str
    start_from: str = ""


def ensure_base(fixed_half, config: Tag, wanted: Wanted, protection: str, log=print) -> Path:
    """The base for the runs of configuration `wanted` under tag `config` (named by key()), filled by a compile
    phase if it has none yet, starting from a copy of wanted.start_from's base when that one is ready. One phase at a
    time per base: parallel workers on one machine share the data cache, so they share its bases. fixed_half:
    the tag's fixed.FixedHalf (its clean files, data cache and manifest)."""
    cache = fixed_half.cache
    name = key(wanted.config_id, config)
    base = base_dir(cache, name)
    if ready(cache, name) is not None and base.is_dir():
        try:
            os.utime(base)  # last used now: prune() keeps the bases in use (two thread counts' champions, say)
            return base
        except OSError:  # deleted meanwhile (another base's prune, `clean`): filled again below
            pass
    root(cache).mkdir(mode=0o700, parents=True, exist_ok=True)  # the user's alone: no one else reaches a base
    os.chmod(root(cache), 0o700)
    with open(root(cache) / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if ready(cache, name) is not None and base.is_dir():  # another worker filled it meanwhile
            return base
        return _fill(fixed_half, name, wanted, config, protection, log)


def begin_base(dest: Path, bases: Path, start_from: str | None) -> str:
    """A new base at `dest` (an empty directory): a copy of the ready base `start_from` in `bases` (the tag's base
    configuration's: what the two share compiles warm), or empty. What it started from, for the log."""
    seed = bases / start_from if start_from else None
    if seed is not None and seed.is_dir() and (bases / f"{start_from}.done").exists():
        os.utime(seed)  # in use: prune() keeps it
        try:
            copy_base(seed, dest)
            return f"a copy of base {start_from}"
        except (OSError, Unaccepted):  # pruned meanwhile, or holding what no run may get: from empty
            if os.path.lexists(dest):
                scratch.empty(dest)
            else:  # a copy that failed halfway removed it (copy_base): the phase's bounded directory again
                scratch.bounded_dir(dest, BASE_LIMIT)
    (dest / "headers").mkdir(parents=True, exist_ok=True)
    return "empty"


def _fill(fixed_half, name: str, wanted: Wanted, config: Tag, protection: str, log) -> Path:
    """The compile phase of `wanted`, and its base: the phase writes a scratch base (a tmpfs of BASE_LIMIT where
    the harness may mount: a phase cannot fill the disk), in a cgroup of its own (memory, processes, all killed
    after it) with every file capped; what it leaves becomes the base on disk only as check() accepts it, copied
    by the harness; anything else and the base is empty (its runs compile cold)."""
    cache, base, threads = fixed_half.cache, base_dir(fixed_half.cache, name), config.threads_per_run()
    work = Path(tempfile.mkdtemp(prefix="autoresearch-compile-"))
    phase_base = work / "base"
    try:
        scratch.bounded_dir(phase_base, BASE_LIMIT)
        started = begin_base(phase_base, root(cache), key(wanted.start_from, config) if wanted.start_from else None)
        (work / "train.py").write_text(wanted.source)
        fixed.write_sources(fixed_half.sources, work)
        view = sandbox.make_view(work, cache, fixed_half.manifest, config.peak_flops, tokens=False)
        argv = [sys.executable, "train.py"]
        if protection == "bwrap":
            argv = sandbox.wrap_compile_phase(argv, work, phase_base)
        env = phase_env(view, phase_base, threads)  # before its cgroup exists: nothing can fail between the two
        cgroup, _ = cgroups.make("phase")
        if cgroup is not None:
            argv = cgroup.wrap(argv)
        log(f"compile phase for base {name} (no data, outside the budget; from {started}): filling the compile "
            "cache")
        t0 = time.time()
        ok, tail = _run_phase(argv, work, env, cgroup)
        seconds = time.time() - t0
        adopted = _adopt(phase_base, base)
        ok, tail = (False, adopted) if adopted else (ok, tail)
        if not ok:  # the runs then compile cold; the training's own log will say why it fails, if it does
            log(f"compile phase for base {name} failed after {seconds:.0f} s; its runs compile cold:\n"
                f"{descriptions.printable(tail)}")
    finally:
        if os.path.lexists(phase_base):
            scratch.release(phase_base)
        scratch.release(work)
    record = {"seconds": round(seconds, 2), "ok": ok, "protection": protection, "from": started,
              "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    tmp = root(cache) / f"{name}.done.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, root(cache) / f"{name}.done")
    prune(cache, keep=base)
    return base


def _run_phase(argv: list[str], work: Path, env: dict, cgroup) -> tuple[bool, str]:
    """Run the compile phase to its end, in its cgroup (killed after it) if it has one: (ok, its output's tail)."""
    processes.become_subreaper()  # what the phase starts stays in this tree, and ends with it
    try:
        proc = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, errors="backslashreplace",
                              timeout=PHASE_TIMEOUT, stdin=subprocess.DEVNULL,
                              preexec_fn=scratch.limit_files(BASE_LIMIT))
        ok, tail = proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        ok, tail = False, f"timed out after {PHASE_TIMEOUT} s"
    finally:
        if cgroup is not None:
            cgroup.kill()
            cgroup.close()
    if processes.end_descendants():
        ok, tail = False, "a process it started could not be ended"
    return ok, tail


def _adopt(phase_base: Path, base: Path) -> str | None:
    """What the phase left, check()ed, copied file by file into the base on disk; why not (the base is then
    empty: never handed to a run, never copied forward), or None."""
    if os.path.lexists(base):
        scratch.release(base)
    try:
        copy_base(phase_base, base)
        return None
    except (OSError, Unaccepted) as e:
        if os.path.lexists(base):
            scratch.release(base)
        (base / "headers").mkdir(parents=True)
        return f"it left what the harness does not accept in its base: {e}"


def prune(cache: Path, keep: Path) -> None:
    """Delete all but the KEEP_BASES bases last used (ensure_base touches a base it hands out; an old-layout
    base, named by the configuration alone, is never used again) and always keep `keep`."""
    bases = sorted((p for p in root(cache).iterdir() if p.is_dir() and (root(cache) / f"{p.name}.done").exists()),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    for old in bases[KEEP_BASES:]:
        if old != keep:
            scratch.release(old)
            (root(cache) / f"{old.name}.done").unlink(missing_ok=True)


BASE_LIMIT = 4 << 30   # bytes a base may hold: the default's is ~160 MB on the cpu profile; a GPU model's more


def check(base: Path, limit: int = BASE_LIMIT) -> int:
    """Its bytes; Unaccepted unless `base` (what a compile phase wrote) is an accepted tree (scratch.accepted_size:
    a `headers` replaced by a link to `../../..` became a writable bind of the host's / in every later run, issue
    50) with `headers`, if any, a directory."""
    total = scratch.accepted_size(base, limit)
    headers = os.lstat(base / "headers") if os.path.lexists(base / "headers") else None
    if headers is not None and not stat.S_ISDIR(headers.st_mode):
        raise Unaccepted(f"headers is not a directory ({stat.filemode(headers.st_mode)})")
    return total


def copy_base(base: Path, dest: Path, limit: int = BASE_LIMIT) -> None:
    """A copy of `base` at the new path `dest`, made of what check() accepts and nothing else (scratch.copy_accepted),
    with a `headers` directory. Unaccepted (dest removed) for anything else."""
    check(base, limit)
    _copy_checked(base, dest, limit)


def _copy_checked(base: Path, dest: Path, limit: int) -> None:
    """copy_base once check() has passed: the copy refuses on the open descriptor what changed since."""
    scratch.copy_accepted(base, dest, limit)
    try:
        (dest / "headers").mkdir(exist_ok=True)
        if (dest / "headers").is_symlink() or not (dest / "headers").is_dir():
            raise Unaccepted("headers is not a directory")
    except BaseException:
        scratch.release(dest)
        raise


def private_copy(base: Path, run_dir: Path) -> Path:
    """The run's throwaway copy of the base: on a tmpfs of the base's size plus scratch.COMPILE_ROOM where the
    harness may mount (scratch.py), removed after the run (scratch.release)."""
    dest = run_dir / sandbox.COMPILE_DIR
    size = check(base)
    scratch.bounded_dir(dest, size + scratch.COMPILE_ROOM)
    _copy_checked(base, dest, BASE_LIMIT)  # checked just above: one walk of the base per run, not two
    return dest


def state(base: Path) -> dict:
    """What a base holds (path -> size, mtime, inode): compared around an unsandboxed run."""
    out = {}
    for top, _, files in os.walk(base):
        for name in files:
            st = os.lstat(os.path.join(top, name))
            out[os.path.relpath(os.path.join(top, name), base)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


class Tampered(Exception):
    """A compile phase without the sandbox changed the repository (the run's train.py ran as you)."""


def watched(repo: Path, protection: str, fill) -> Path:
    """fill() (an ensure_base call), with the repository watched like a training when there is no sandbox: a
    compile phase runs a configuration's train.py, and one rewrote the tag's allowance for every later run
    (benchmarks/redteam.py, compile-phase-unguarded). Tampered, the changes undone and the base thrown away."""
    if protection == "bwrap":
        return fill()
    watch = guard.Guard(repo, exclude=[])
    base = fill()
    changed = watch.changes()
    if changed:
        lost = watch.restore()
        (base.parent / f"{base.name}.done").unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)
        raise Tampered(f"the compile phase (this train.py, run without a sandbox) changed files outside "
                       f"its directory: {', '.join(changed[:5])} (restored{'' if not lost else ', but not ' + ', '.join(lost[:3])}; "
                       "its compile cache thrown away)")
    return base


def discard(cache: Path, name: str) -> None:
    """Forget a base (a run without a sandbox changed it): the next run fills a new one."""
    (root(cache) / f"{name}.done").unlink(missing_ok=True)
    if os.path.lexists(base_dir(cache, name)):
        scratch.release(base_dir(cache, name))
