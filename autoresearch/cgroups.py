"""Cgroups: where this process may make them and removing them (what one training's cgroup, below, and an agent
sandbox's, agentcgroup.py, share), and one training's cgroup (RunCgroup). Each names its cgroups PREFIX<pid>-...,
so that sweep() removes those of a command that died, never a live one's."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import psutil

from autoresearch import errors


def _mounts() -> list[tuple[str, str, Path, str]]:
    """(fstype, root, mount point, super options) of every cgroup mount this process sees."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] in ("cgroup", "cgroup2"):
            out.append((fields[sep + 1], fields[3], Path(fields[4]), fields[sep + 3]))
    return out


def _own(hierarchy: str) -> str | None:
    """This process's cgroup in a v1 hierarchy ("memory") or in v2 ("")."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (hierarchy == "" and controllers == "") or hierarchy in controllers.split(","):
            return path
    return None


def _below(root: str, point: Path, own: str) -> Path | None:
    if own == root or own.startswith(root.rstrip("/") + "/"):
        return point / own[len(root):].lstrip("/")
    return None


def v1_dir(controller: str, probe: str | None = None) -> Path | None:
    """This process's cgroup in the v1 hierarchy of `controller`, as a directory it may create children in (holding
    `probe`, where one is named), or None."""
    try:
        own = _own(controller)
        mounts = _mounts()
    except (OSError, ValueError):
        return None
    for fstype, root, point, options in mounts:
        if fstype == "cgroup" and controller in options.split(",") and own is not None:
            parent = _below(root, point, own)
            if parent is not None and (parent / (probe or "cgroup.procs")).exists() and os.access(parent, os.W_OK):
                return parent
    return None


def v2_dir() -> Path | None:
    """This process's cgroup in the v2 hierarchy, as a directory it may create children in, or None."""
    try:
        own = _own("")
        mounts = _mounts()
    except (OSError, ValueError):
        return None
    for fstype, root, point, _ in mounts:
        if fstype == "cgroup2" and own is not None:
            parent = _below(root, point, own)
            if parent is not None and (parent / "cgroup.procs").exists() and os.access(parent, os.W_OK):
                return parent
    return None


def entering(dirs) -> list[str]:
    """The prefix of an argv that moves its process into each cgroup of `dirs` (directories the harness made)
    before it execs the rest: nothing the command starts runs outside them; exit 126 where one refuses it. The
    training's cgroup and an agent sandbox's (agentcgroup.py) enter theirs this one way."""
    procs = " ".join(f'"{d}/cgroup.procs"' for d in dict.fromkeys(dirs))
    return ["sh", "-c", f'for f in {procs}; do echo $$ > "$f" || exit 126; done; exec "$@"', "sh"]


def remove(cgroup: Path, tries: int = 1) -> bool:
    """Remove a cgroup and the children made in it, deepest first; False if a process still holds one (the kernel
    refuses), after `tries` tries a tenth of a second apart."""
    for attempt in range(tries):
        if not cgroup.exists():
            return True
        try:
            for child in sorted((d for d in cgroup.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
                child.rmdir()
            cgroup.rmdir()
            return True
        except FileNotFoundError:
            continue
        except OSError:
            if attempt + 1 < tries:
                time.sleep(0.1)
    return not cgroup.exists()


def sweep(parent: Path, prefix: str) -> None:
    """Remove the cgroups named `prefix`<pid>-... whose process is gone (a command that died before removing
    them); another live command's are left alone, one a process still holds is refused by the kernel."""
    for stale in parent.glob(prefix + "*"):
        pid = stale.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            remove(stale)


UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def size_from_env(name: str, advice: str) -> int | None:
    """The bytes an environment variable gives (512M, 8G, 4096), None where it is unset or empty; a clear error
    naming `advice` (what to give) for anything else. The one parser of every size the user sets (the agent cap's,
    runcgroup's, scratch's)."""
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return None
    m = re.fullmatch(r"(\d+)\s*([kmgt]?)i?b?", text)
    if not m or int(m[1]) == 0:
        from autoresearch.errors import HarnessError
        raise HarnessError(f"{name}={os.environ[name]!r}: {advice}")
    return int(m[1]) * UNITS[m[2]]


# --- one training's cgroup ----------------------------------------------------------------------------------------
# The kernel's measure and bound of one training: a cgroup of its own.
#
# Why: the cpu clock summed the CPU time of the processes the harness saw and of the children it waited for. A
# train.py that ignores SIGCHLD and trains in a child has that child reaped by the kernel, unseen by both: it trained
# 133 s of a 10 s budget and was kept (issue 50). And bubblewrap's init, reaped in the next run's poll, billed an
# evaluation's CPU to the next training. A cgroup counts what the kernel charged to it, every process that ever ran
# in it, reaped by anyone or not, and nothing else.
#
# How (`RunCgroup`, the mechanism and the reason it was chosen, as nanochat's _detect_compute_dtype does):
# - cgroup v1 with writable cpuacct, memory and pids hierarchies (root, a container that mounts them): a new cgroup
#   in each, below this process's own; CPU from `cpuacct.usage`, memory capped by `memory.limit_in_bytes` (and
#   memory with swap), processes by `pids.max`;
# - cgroup v2 where this process may make a child of its own cgroup (root on a pure v2 machine, a systemd user
#   delegation): CPU from `cpu.stat`'s usage_usec (always kept), memory and pids capped where those controllers are
#   enabled for the child;
# - neither: None from make(); the tag recorded at setup what its runs get (`Tag.accounting`), and a run of a tag
#   whose cgroup cannot be made now is refused, never run with less (execute.py).
# The training starts inside it (`sh -c 'echo $$ > .../cgroup.procs; exec ...'`): no process of it starts outside.
# Nothing inside can write it: the sandbox mounts /sys read-only and drops every capability.

PREFIX = "autoresearch-run-"
RUN_MEMORY_SHARE = 0.85   # of the machine's memory a training may hold (its out/ tmpfs included)
PIDS_MAX = 8192           # processes and threads of one training: torch's threads and inductor's compile workers
                          # are dozens; a fork bomb is stopped here, not by the machine
MEMORY_ENV = "AUTORESEARCH_RUN_MEMORY"  # bytes (or 8G) a training may hold, instead of the share


def memory_limit() -> int:
    return size_from_env(MEMORY_ENV, "give the bytes a training may hold (e.g. 16G, 8192M)") or \
        int(RUN_MEMORY_SHARE * psutil.virtual_memory().total)


class RunCgroup:
    """One training's cgroup(s): `wrap(argv)` starts it inside, `cpu_seconds()` is what the kernel charged to it
    so far, `close()` removes them once the training has ended. `how`: the mechanism, for the run's log."""

    def __init__(self, dirs: dict[str, Path], kind: str, memory: int | None, how: str):
        self.dirs, self.kind, self.memory, self.how = dirs, kind, memory, how

    def wrap(self, argv: list[str]) -> list[str]:
        return entering(self.dirs.values()) + argv

    def cpu_seconds(self) -> float:
        """CPU seconds of every process that ever ran in it, ended, reaped or not."""
        try:
            if self.kind == "v1":
                return int((self.dirs["cpuacct"] / "cpuacct.usage").read_text()) / 1e9
            text = (self.dirs["cpu"] / "cpu.stat").read_text()
            return int(re.search(r"^usage_usec (\d+)", text, re.M)[1]) / 1e6
        except (OSError, ValueError, TypeError):
            raise errors.HarnessError(f"the training's cgroup ({self.how}) could not be read") from None

    def pids(self) -> list[int]:
        """The processes in it now."""
        found = set()
        for d in dict.fromkeys(self.dirs.values()):
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                pass
        return sorted(found)

    def kill(self, tries: int = 50) -> None:
        """SIGKILL every process in it until none is left (a fork racing the scan is caught by the next)."""
        for _ in range(tries):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.02)

    def memory_peak(self) -> int | None:
        try:
            if self.kind == "v1":
                return int((self.dirs["memory"] / "memory.max_usage_in_bytes").read_text())
            return int((self.dirs["memory"] / "memory.peak").read_text())
        except (OSError, ValueError, KeyError):
            return None

    def close(self) -> None:
        for d in dict.fromkeys(self.dirs.values()):
            remove(d, tries=50)

    def __enter__(self) -> RunCgroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make(name: str) -> tuple[RunCgroup | None, str]:
    """A new cgroup for one training, and how (or None, and why not)."""
    memory = memory_limit()
    stamp = f"{PREFIX}{os.getpid()}-{name}-{time.monotonic_ns()}"
    v1 = {c: v1_dir(c) for c in ("cpuacct", "memory", "pids")}
    why = []
    if all(v1.values()):
        dirs = {}
        try:
            for controller, parent in v1.items():
                sweep(parent, PREFIX)
                dirs[controller] = parent / stamp
                dirs[controller].mkdir()
            (dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory))
            swap = dirs["memory"] / "memory.memsw.limit_in_bytes"
            if swap.exists():
                swap.write_text(str(memory))
            (dirs["pids"] / "pids.max").write_text(str(PIDS_MAX))
            return RunCgroup(dirs, "v1", memory, f"cgroup v1, memory {memory / (1 << 30):.1f} GiB, pids "
                                                f"{PIDS_MAX}"), "cgroup v1"
        except OSError as e:
            RunCgroup(dirs, "v1", memory, "").close()
            why.append(f"cgroup v1: {e}")
    else:
        why.append("cgroup v1: no writable " + ", ".join(c for c, d in v1.items() if d is None))
    parent = v2_dir()
    if parent is not None:
        try:
            sweep(parent, PREFIX)
            d = parent / stamp
            d.mkdir()
            capped = []
            if (d / "memory.max").exists():
                (d / "memory.max").write_text(str(memory))
                capped.append(f"memory {memory / (1 << 30):.1f} GiB")
            if (d / "pids.max").exists():
                (d / "pids.max").write_text(str(PIDS_MAX))
                capped.append(f"pids {PIDS_MAX}")
            return RunCgroup({"cpu": d, "memory": d, "pids": d}, "v2",
                             memory if capped else None, "cgroup v2" + (", " + ", ".join(capped) if capped else
                                                                        ", CPU measured, nothing capped")), \
                "cgroup v2"
        except OSError as e:
            why.append(f"cgroup v2: {e}")
    else:
        why.append("cgroup v2: no writable cgroup of this process")
    return None, "; ".join(why)


def available() -> str:
    """What a tag set up now records for its runs' accounting: 'cgroup v1', 'cgroup v2' or 'none'."""
    cg, how = make("probe")
    if cg is None:
        return "none"
    cg.close()
    return how
