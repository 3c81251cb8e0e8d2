"""What untrusted code may see: the training's run-scoped data view, and, where bubblewrap exists, the sandboxes
of the three processes that run or read the agent's code.

A run's directory belongs to the harness. Inside it, `data/` is the training's view of the data (the manifest, the
tokenizer, the tag's device measurements and links to the training token files only: prepare.py pointed at it
finds no validation or test split), `out/` is the one directory the training may write (its result.json and
exported model), and `compile/` a throwaway copy of the compile cache. The log and the harness's evaluation.json
sit beside them, out of the training's reach.

Under bubblewrap (`bwrap`, Linux) each process starts from an empty root that holds only what it needs, read-only:
the system's programs and libraries (/usr, /etc, ...), the Python installation, and then
- the training: train.py and prepare.py (at their paths in the repository, nothing else of it), its data view,
  the training token files, `out/` writable, the compile cache's private copy writable;
- the evaluator: its private copy of the evaluator package and the clean prepare.py, the data cache, `out/`, nothing
  writable (it answers on a pipe);
- the compile phase: the champion's train.py and prepare.py, a view without any token file, the compile cache
  writable (see compiled.py).
Every agent's confinement (its own profile: an empty root too, with a private home and the network) is
confine.py's.
Each has a private /tmp and /dev/shm, no network, its own process namespace (every process it starts ends with it),
and its own user namespace with no capability, so that it holds when root starts it. Without
bubblewrap nothing is enforced while the code runs; the harness detects afterwards what changed in the
repository and the data (guard.py), and the row says so (protection=none).
"""

from __future__ import annotations

import functools
import getpass
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from autoresearch import state

MODES = ("auto", "on", "off")
VIEW_DIR = "data"        # in a run's directory: the training's data view (read-only to it)
OUT_DIR = "out"          # in a run's directory: the only directory the training writes
COMPILE_DIR = "compile"  # in a run's directory: the run's private, throwaway copy of the compile cache
SOURCE = "train.py"      # in a run's directory: the train.py the run checked, the one its sandbox shows
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt/conda", "/sys")


class SandboxError(RuntimeError):
    pass


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


def make_view(run_dir: Path, cache: Path, manifest: dict, peaks: dict | None = None, tokens: bool = True) -> Path:
    """The data view in run_dir: manifest, tokenizer, the tag's peak FLOP/s (measured by the harness at setup,
    so no run can change what a later run reads), and links to the training token files (none: tokens False)."""
    view = run_dir / VIEW_DIR
    (view / manifest["data_dir"]).mkdir(parents=True, exist_ok=True)
    for name in ("manifest.json", "tokenizer.json"):
        shutil.copyfile(cache / name, view / name)
    if peaks:  # where runtime.py reads them (its PEAK_FILE, defined there once)
        import runtime
        (view / runtime.PEAK_FILE).write_text(json.dumps(peaks, indent=1))
    if tokens:
        for rel in training_files(manifest):
            (view / rel).symlink_to((cache / rel).resolve())
    return view


RECORD = "bwrap-worked.json"  # in the user's state directory (bwrap_record): bubblewrap worked on this machine
FAILURE: dict[str, str] = {}  # why bwrap_works() last said no ("why"): bubblewrap's own words


def bwrap_record() -> Path:
    """Where the harness records that bubblewrap worked here: the user's state directory ($XDG_STATE_HOME, else
    ~/.local/state), outside every repository; read-only to every agent (confine.wrap_agent's view of the machine),
    and no path an agent may be given to write (confine.allow_problem: ~/.local)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return Path(base) / "autoresearch" / RECORD


def bwrap_expected() -> Path | None:
    """The record, if bubblewrap worked on this machine before: from then its failure is an error, not `none`."""
    return bwrap_record() if bwrap_record().is_file() else None


@functools.lru_cache(maxsize=None)
def bwrap_works() -> bool:
    """Whether bubblewrap is installed and can create the namespaces it needs here, from an empty root. Once it
    does, that is recorded (bwrap_record); when it does not, FAILURE says why."""
    exe = shutil.which("bwrap")
    if exe is None:
        FAILURE["why"] = "`bwrap` is not on PATH"
        return False
    try:
        proc = subprocess.run([*empty_root(), "--", sys.executable, "-c", "pass"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        FAILURE["why"] = f"{exe}: {e}"
        return False
    if proc.returncode != 0:
        FAILURE["why"] = (proc.stderr.decode(errors="replace").strip()[-500:]
                          or f"{exe} exited with status {proc.returncode}")
        return False
    if bwrap_expected() is None:
        try:
            state.atomic_json(bwrap_record(), {"bwrap": exe, "since": time.strftime("%Y-%m-%dT%H:%M:%S")})
        except OSError:
            pass  # a read-only home: unrecorded, `auto` stays as lenient as before
    return True


def failure() -> str:
    """Why bubblewrap cannot be used here, with the fix: for an error where it was expected."""
    why = FAILURE.get("why", "it cannot create namespaces")
    record = bwrap_expected()
    where = f"bubblewrap worked here before (recorded in {record}) and fails now" if record else \
        "bubblewrap fails here"
    return (f"{where}: {why}. If the user namespaces are used up (an agent's processes may hold them open; "
            "/proc/sys/user/max_user_namespaces), end those processes or raise the limit; if bubblewrap is gone, "
            "install it (`apt-get install bubblewrap`); or run with `--sandbox off` explicitly (no enforcement, "
            "docs/integrity.md)" + (f"; if this machine is to run without it for good, remove {record}"
                                    if record else ""))


def protection(mode: str) -> str:
    """The protection a run gets under --sandbox mode: 'bwrap' or 'none'. `auto` is `none` only where bubblewrap
    never worked: once it has (bwrap_record), its failure is an error, never a quiet drop to no protection (an
    agent that used up the user namespaces would otherwise have its next tag set up without the sandbox)."""
    if mode not in MODES:
        raise SandboxError(f"--sandbox {mode!r}: choose auto, on or off.")
    if mode == "off":
        return "none"
    if bwrap_works():
        return "bwrap"
    if mode == "on":
        raise SandboxError("--sandbox on needs bubblewrap, and `bwrap` is missing or cannot create namespaces here "
                           f"({FAILURE.get('why', '')}). Install it (`apt-get install bubblewrap` on Debian/Ubuntu), "
                           "or set the tag up with `--sandbox off` (no enforcement; see docs/integrity.md).")
    if bwrap_expected() is not None:
        raise SandboxError(failure())
    return "none"


def python_dirs() -> list[Path]:
    """The Python installation this harness runs on: its prefixes, the directories on its path that hold
    packages (site-packages, a venv's) and PYTHONPATH's entries, wherever they live (a venv in the repository,
    pyenv under $HOME or /tmp).
    A path entry that is the repository itself (an editable install) is not among them: the training needs the
    installed packages, not the harness's source."""
    dirs = [Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and Path(p).is_dir() and not (Path(p).resolve() / "prepare.py").exists()]  # not a repository
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path):
        if not p:
            continue
        path = Path(p).resolve()
        if path.is_dir() and (path in map(Path, (sys.prefix, sys.base_prefix, sys.exec_prefix))
                              or "-packages" in path.name or path.name.startswith("python")):
            dirs.append(path)
    exe = Path(sys.executable)
    dirs += [exe.parent, exe.resolve().parent]
    out = []
    for d in sorted(set(dirs), key=lambda d: len(d.parts)):
        if not any(d.is_relative_to(o) for o in out):
            out.append(d)
    return out


# Whoever starts it, root included, what runs inside holds no capability: a user namespace of its own and every
# capability dropped. Started by root without them, bubblewrap keeps nearly all (CapEff 0x1fffeffffff inside):
# open_by_handle_at (CAP_DAC_READ_SEARCH) then opened the held-out files by inode number, outside every mount
# (benchmarks/redteam.py, open-by-handle). With them: "Operation not permitted". A user other than root holds no
# capability outside; bubblewrap gives it a user namespace itself where it needs one. Where root may not create
# a user namespace, bwrap_works() is False: no sandbox rather than one that does not hold.
CONFINED = ["--unshare-user", "--cap-drop", "ALL"] if os.geteuid() == 0 else ["--cap-drop", "ALL"]
# What root's uid can still write without a capability: in a user namespace of root's, the sandbox's uid 0 is the
# host's, and /proc's own permissions let the owner write kernel settings. /proc/sys/kernel/core_pattern set to
# "|out/helper.sh" had the kernel run a script as host root, outside every namespace, at the next crash
# (benchmarks/redteam.py, sysctl-escape). Every top-level /proc entry root may write is read-only in the sandbox.
PROC_READ_ONLY = ("sys", "sysrq-trigger", "irq", "bus", "mtrr", "pressure", "acpi", "fs", "driver", "tty", "scsi")


def gpu_devices() -> list[str]:
    """The device nodes a GPU's driver needs (NVIDIA's, and /dev/dri), where they exist: the only host devices a
    sandbox gets besides bubblewrap's own minimal /dev (null, zero, full, random, urandom, tty). With the host's
    whole /dev, the sandbox's uid 0 (root's) opened /dev/loop0 by its owner bits and attached a file of out/ to
    it: global kernel state, read back by the next run (benchmarks/redteam.py, loop-device-carry)."""
    import glob
    return sorted(glob.glob("/dev/nvidia*") + glob.glob("/dev/dri"))


def empty_root() -> list[str]:
    """An empty root with the system and Python read-only, /dev, /proc, a private /tmp; no network, no other
    process visible, no capability, dead with its parent."""
    args = ["bwrap", *CONFINED, "--die-with-parent", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--dev", "/dev", "--tmpfs", "/dev/shm", "--proc", "/proc", "--tmpfs", "/tmp"]
    for node in gpu_devices():
        args += ["--dev-bind", node, node]
    for entry in PROC_READ_ONLY:
        args += ["--ro-bind-try", f"/proc/{entry}", f"/proc/{entry}"]
    # /proc/locks is the host's, and shows OFD locks (pid -1) to every pid namespace with their byte ranges: an
    # agent confined beside a run sent it 8 KB that way (locks on a file both see), past train.py's checked bytes
    args += ["--ro-bind", "/dev/null", "/proc/locks"]
    return args + system_binds() + [a for d in python_dirs() if not in_system(d) for a in ("--ro-bind", str(d), str(d))]


def system_binds() -> list[str]:
    """The system's programs and libraries (SYSTEM_DIRS), read-only at their paths; a merged /usr's links kept."""
    args = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    return args


def directory(path: Path) -> str:
    """`path` as a bind source or target, if it is a directory itself (lstat: a link is refused, never followed).
    The harness makes every such directory just before the sandbox starts, and nothing untrusted runs between; this
    is the rule where that is checked: a link there would make the bind follow it to any host directory (a compile
    phase's `headers -> /` did, issue 50)."""
    import stat as stat_
    try:
        mode = os.lstat(path).st_mode
    except OSError as e:
        raise SandboxError(f"{path}: cannot be mounted in the sandbox ({e.strerror})") from None
    if not stat_.S_ISDIR(mode):
        raise SandboxError(f"{path} is not a directory the harness made ({stat_.filemode(mode)}): refused, "
                           "never mounted")
    return str(path)


def in_system(path: Path) -> bool:
    """Whether `path` lies in a system directory that system_binds() shows."""
    return any(path.is_relative_to(s) for s in SYSTEM_DIRS if os.path.isdir(s) and not os.path.islink(s))


def finish(args: list[str], cwd: Path, argv: list[str]) -> list[str]:
    """The sandbox's argv: root read-only, `argv` run in `cwd` with HOME /tmp."""
    return args + ["--remount-ro", "/", "--chdir", str(cwd), "--setenv", "HOME", "/tmp", "--", *argv]


def wrap(argv: list[str], repo: Path, run_dir: Path, cache: Path, manifest: dict) -> list[str]:
    """The training's sandbox: train.py (the run's checked copy), prepare.py and runtime.py at their paths, the view and the
    training files read-only, out/ and the compile cache's private copy writable."""
    args = empty_root()
    # the bytes the harness checked (execute.py), never the work tree's train.py, which an agent confined beside
    # this run may rewrite while it trains
    source = run_dir / SOURCE if (run_dir / SOURCE).is_file() else repo / "train.py"
    args += ["--ro-bind", str(source), str(repo / "train.py"), "--ro-bind", directory(run_dir / VIEW_DIR),
             str(run_dir / VIEW_DIR)]
    for name in state.FIXED:  # the work tree's: its fingerprint is checked before and after the run (execute.py)
        if (repo / name).exists():
            args += ["--ro-bind", str(repo / name), str(repo / name)]
    for rel in training_files(manifest):
        real = str((cache / rel).resolve())
        args += ["--ro-bind", real, real]
    args += ["--bind", directory(run_dir / OUT_DIR), str(run_dir / OUT_DIR)]
    hf_home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
    kernel = hf_home / "hub" / FA3_CACHE
    if kernel.is_dir() and not kernel.is_symlink():  # kernels' FA3, fetched once by hand: that repository alone,
        # read-only (HOME is /tmp in here). Never the whole cache: a user's cached datasets (climbmix's held-out
        # pool among them) would be the training's to read
        args += ["--ro-bind", str(kernel), str(kernel), "--setenv", "HF_HOME", str(hf_home)]
    compiled = run_dir / COMPILE_DIR
    if os.path.lexists(compiled):
        args += ["--bind", directory(compiled), str(compiled), "--bind", directory(compiled / "headers"),
                 inductor_default_dir()]
    return finish(args, repo, argv)


# The Hugging Face hub cache's directory of the FA3 kernel runtime.py loads (get_kernel("varunneal/flash-attention-3")
# on Hopper): what a training sees of HF_HOME.
FA3_CACHE = "models--varunneal--flash-attention-3"


def wrap_evaluator(argv: list[str], private: Path, cache: Path, out: Path, source: Path | None = None) -> list[str]:
    """The evaluator's sandbox: its private directory (its copy of the evaluator package, the clean prepare.py),
    the data cache, and at out/'s path `source` (the directory the harness copies out/'s accepted files into:
    scratch.kept_dir), all read-only; it answers on its stdout."""
    args = empty_root()
    for path in (private, cache.resolve()):
        args += ["--ro-bind", str(path), str(path)]
    args += ["--ro-bind", directory(source or out), str(out)]
    return finish(args, private, argv)


def wrap_compile_phase(argv: list[str], workdir: Path, base: Path) -> list[str]:
    """The compile phase's sandbox: its working directory (train.py, prepare.py, a view without token files)
    read-only, the compile cache it fills writable."""
    args = empty_root() + ["--ro-bind", directory(workdir), str(workdir), "--bind", directory(base), str(base),
                           "--bind", directory(base / "headers"), inductor_default_dir()]
    return finish(args, workdir, argv)
