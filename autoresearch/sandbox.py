"""What the training process may see: a run-scoped view of the data, and, where bubblewrap exists, a sandbox.

The view is a directory in the run directory with the manifest, the tokenizer and links to the training token
files only: prepare.py pointed at it (AUTORESEARCH_CACHE) finds no validation or test split.

Under bubblewrap (`bwrap`, Linux) the training process runs with the whole filesystem read-only, its run
directory and the compile cache writable, /tmp private, no network, its own process namespace (when it ends,
every process it started ends too), and these hidden: the data cache (but the training files it may read), the local corpus
prepare read, npm's cache, the repository's .git, .autoresearch and results.tsv. Without bubblewrap nothing
is enforced; the harness still detects what changed afterwards (see guard.py), and the row says so.
"""

from __future__ import annotations

import functools
import getpass
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

MODES = ("auto", "on", "off")
VIEW_DIR = "data"
SHARED_CACHE_FILES = ("peak_flops.json",)  # measurements train.py may reuse; copied, never written back


class SandboxError(RuntimeError):
    pass


def compile_cache(cache: Path) -> Path:
    """torch.compile's cache (TORCHINDUCTOR_CACHE_DIR) for the trainings of one data cache: beside it, so that
    it outlives each run's private /tmp and an unchanged graph compiles in seconds. Only trainings use it; the
    harness's evaluation never compiles, so nothing written there can reach the metric."""
    path = cache.parent / f"{cache.name}-compile"
    path.mkdir(parents=True, exist_ok=True)
    return path


def inductor_default_dir() -> str:
    """Where inductor keeps its precompiled C++ headers whatever TORCHINDUCTOR_CACHE_DIR says: its default cache
    directory, /tmp/torchinductor_<user> (torch._inductor.runtime.cache_dir_utils.default_cache_dir). In the
    sandbox's fresh /tmp every run rebuilt them: a warm compile took 9 s instead of 3.6 s (BENCHMARKS.md)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return "/tmp/torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)


def training_files(manifest: dict) -> list[str]:
    """The manifest's training token files, relative to the cache."""
    return sorted(rel for rel in manifest["files"]
                  if Path(rel).name.startswith("train_") and rel.endswith((".tokens.npy", ".offsets.npy")))


def make_view(run_dir: Path, cache: Path, manifest: dict) -> Path:
    view = run_dir / VIEW_DIR
    (view / manifest["data_dir"]).mkdir(parents=True, exist_ok=True)
    for name in ("manifest.json", "tokenizer.json", *SHARED_CACHE_FILES):
        if (cache / name).is_file():
            shutil.copyfile(cache / name, view / name)
    for rel in training_files(manifest):
        (view / rel).symlink_to((cache / rel).resolve())
    return view


def keep_measurements(view: Path, cache: Path) -> None:
    """Copy train.py's cached device measurements (the peak-FLOP/s probe) from the view back to the cache, if
    they are what they should be: a JSON object of numbers. They only feed the MFU that train.py prints."""
    for name in SHARED_CACHE_FILES:
        try:
            data = json.loads((view / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and len(data) < 100 and all(
                isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in data.items()):
            tmp = cache / (name + ".tmp")
            tmp.write_text(json.dumps(data, indent=1))
            os.replace(tmp, cache / name)


@functools.lru_cache(maxsize=None)
def bwrap_works() -> bool:
    """Whether bubblewrap is installed and can create the namespaces it needs here."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False
    try:
        proc = subprocess.run([exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
                               "--unshare-net", "--", "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def protection(mode: str) -> str:
    """The protection a run gets under --sandbox mode: 'bwrap' or 'none'."""
    if mode not in MODES:
        raise SandboxError(f"--sandbox {mode!r}: choose auto, on or off.")
    if mode == "off":
        return "none"
    if bwrap_works():
        return "bwrap"
    if mode == "on":
        raise SandboxError("--sandbox on needs bubblewrap, and `bwrap` is missing or cannot create namespaces here. "
                           "Install it (`apt-get install bubblewrap` on Debian/Ubuntu), or run with "
                           "`--sandbox auto` / `--sandbox off` (no enforcement; see README: Integrity).")
    return "none"


def wrap(argv: list[str], repo: Path, run_dir: Path, cache: Path, manifest: dict, hide=()) -> list[str]:
    """argv wrapped in bubblewrap as described above, `hide` hidden too. Later mounts go over earlier ones."""
    hidden_dirs = [cache.resolve(), repo / ".git", repo / ".autoresearch", Path.home() / ".npm"]
    source = manifest.get("source", {}).get("path")
    hidden_files = [repo / "results.tsv"]
    for path in hide:
        (hidden_dirs if Path(path).is_dir() else hidden_files).append(Path(path))
    if source:
        (hidden_dirs if Path(source).is_dir() else hidden_files).append(Path(source))
    args = ["bwrap", "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--die-with-parent",
            "--ro-bind", str(repo), str(repo)]  # again, in case it lives under /tmp
    for d in hidden_dirs:
        if d.is_dir():
            args += ["--tmpfs", str(d)]
    for f in hidden_files:
        if f.is_file():
            args += ["--ro-bind", "/dev/null", str(f)]
    args += ["--bind", str(run_dir), str(run_dir)]
    compiled = compile_cache(cache)
    (compiled / "headers").mkdir(exist_ok=True)
    args += ["--bind", str(compiled), str(compiled), "--bind", str(compiled / "headers"), inductor_default_dir()]
    for rel in training_files(manifest):
        real = str((cache / rel).resolve())
        args += ["--ro-bind", real, real]
    return args + ["--chdir", str(repo), "--", *argv]
