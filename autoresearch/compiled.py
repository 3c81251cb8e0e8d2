"""torch.compile's cache, with no channel from one run to the next.

An unchanged graph compiles in seconds from inductor's cache instead of 25-80 s on 2 CPU cores. But a cache the
training writes and a later run reads carries whatever the training puts there (weights, say: three budgets of
training in one run). So the cache has two layers:

- a *base* per champion (configuration), filled only by a **compile phase**: the champion's train.py run by the
  harness in compile-only mode (prepare.COMPILE_ONLY_ENV): random tokens instead of data, one step, no export, in
  a sandbox where the base is the only thing it may write and no token file exists. It sees no data, so nothing in
  it can come from data. It runs outside any budget, once per champion (the baseline at its first run, then after
  each keep), and the harness records that it did (`<base>.done`, beside the base, where the phase cannot write);
- every run trains with a **private copy** of its tag's current base (run_dir/compile, `cp -a`: 0.06 s for the
  default's 155 MB), writable, deleted after the run: what a training writes there reaches no one.

So what a run's compilation costs depends on its own graph and the champion's alone, never on what ran before:
the champion's repeats and every change of constants compile warm, a change of shape compiles cold, on every one
of its runs alike. Without bubblewrap nothing stops a training from writing the base directly; the harness then
compares the base before and after each run and throws it away when it changed (the run is refused).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autoresearch import sandbox

PHASE_TIMEOUT = 300   # seconds for a compile phase: a cold compile of the default takes 25-82 s on 2 CPU cores.
                      # It bounds what a phase can compute without data and leave for later runs (docs/integrity.md)
KEEP_BASES = 3        # bases kept per data cache (~160 MB each on the cpu profile); older ones are deleted


def root(cache: Path) -> Path:
    """Where the bases of one data cache live: beside it."""
    return cache.parent / f"{cache.name}-compile"


def base_dir(cache: Path, config_id: str) -> Path:
    return root(cache) / config_id


def ready(cache: Path, config_id: str) -> dict | None:
    """The record of a finished compile phase for this configuration, None if it has not run."""
    try:
        return json.loads((root(cache) / f"{config_id}.done").read_text())
    except (OSError, ValueError):
        return None


def phase_env(view: Path, base: Path, threads: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTORESEARCH_", "PYTHON", "TORCHINDUCTOR_"))}
    import prepare
    env.update(AUTORESEARCH_CACHE=str(view), TORCHINDUCTOR_CACHE_DIR=str(base), PYTHONDONTWRITEBYTECODE="1",
               HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(threads))
    env[prepare.COMPILE_ONLY_ENV] = "1"
    return env


def ensure_base(cache: Path, config_id: str, train_source: str, prepare_source: bytes, manifest: dict,
                peaks: dict | None, protection: str, threads: int, log=print) -> Path:
    """The base for runs whose champion is config_id, filled by a compile phase if it has none yet. One phase at a
    time per base: parallel workers on one machine share the data cache, so they share its bases."""
    base = base_dir(cache, config_id)
    if ready(cache, config_id) is not None and base.is_dir():
        return base
    root(cache).mkdir(parents=True, exist_ok=True)
    with open(root(cache) / f"{config_id}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if ready(cache, config_id) is not None and base.is_dir():  # another worker filled it meanwhile
            return base
        return _fill(cache, config_id, base, train_source, prepare_source, manifest, peaks, protection, threads, log)


def _fill(cache: Path, config_id: str, base: Path, train_source: str, prepare_source: bytes, manifest: dict,
          peaks: dict | None, protection: str, threads: int, log) -> Path:
    shutil.rmtree(base, ignore_errors=True)
    (base / "headers").mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix="autoresearch-compile-"))
    try:
        (work / "train.py").write_text(train_source)
        (work / "prepare.py").write_bytes(prepare_source)
        view = sandbox.make_view(work, cache, manifest, peaks, tokens=False)
        argv = [sys.executable, "train.py"]
        if protection == "bwrap":
            argv = sandbox.wrap_compile_phase(argv, work, base)
        log(f"compile phase for {config_id} (no data, outside the budget): filling the compile cache")
        t0 = time.time()
        try:
            proc = subprocess.run(argv, cwd=work, env=phase_env(view, base, threads), capture_output=True, text=True,
                                  timeout=PHASE_TIMEOUT, stdin=subprocess.DEVNULL)
            ok, tail = proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]
        except subprocess.TimeoutExpired:
            ok, tail = False, f"timed out after {PHASE_TIMEOUT} s"
        seconds = time.time() - t0
        if not ok:  # the runs then compile cold; the training's own log will say why it fails, if it does
            log(f"compile phase for {config_id} failed after {seconds:.0f} s; its runs compile cold:\n{tail}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record = {"seconds": round(seconds, 2), "ok": ok, "protection": protection,
              "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    tmp = root(cache) / f"{config_id}.done.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, root(cache) / f"{config_id}.done")
    prune(cache, keep=base)
    return base


def prune(cache: Path, keep: Path) -> None:
    """Delete all but the newest KEEP_BASES bases (and always keep `keep`)."""
    bases = sorted((p for p in root(cache).iterdir() if p.is_dir() and (root(cache) / f"{p.name}.done").exists()),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    for old in bases[KEEP_BASES:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)
            (root(cache) / f"{old.name}.done").unlink(missing_ok=True)


def private_copy(base: Path, run_dir: Path) -> Path:
    """The run's throwaway copy of the base."""
    dest = run_dir / sandbox.COMPILE_DIR
    if shutil.which("cp") and sys.platform.startswith("linux"):
        subprocess.run(["cp", "-a", str(base), str(dest)], check=True)
    else:
        shutil.copytree(base, dest, symlinks=True)
    (dest / "headers").mkdir(exist_ok=True)
    return dest


def state(base: Path) -> dict:
    """What a base holds (path -> size, mtime, inode): compared around an unsandboxed run."""
    out = {}
    for top, _, files in os.walk(base):
        for name in files:
            st = os.lstat(os.path.join(top, name))
            out[os.path.relpath(os.path.join(top, name), base)] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def discard(cache: Path, config_id: str) -> None:
    """Forget a base (a run without a sandbox changed it): the next run fills a new one."""
    (root(cache) / f"{config_id}.done").unlink(missing_ok=True)
    shutil.rmtree(base_dir(cache, config_id), ignore_errors=True)
