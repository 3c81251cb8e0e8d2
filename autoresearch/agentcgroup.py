"""An agent sandbox's cgroups: a pause it cannot undo (Freezer) and the memory it may hold (Cap, below).

A pause the agent cannot undo: its sandbox starts in a freezer cgroup of its own, which pause.py freezes.

Why: a pause by SIGSTOP is undone by a process of the agent's own. A POSIX timer whose signal is SIGCONT
(timer_create, SIGEV_SIGNAL) continues it after a scan of /proc found everything stopped, and it continues the
others in turn: 1.5 CPU-s of 2 s burned while "paused" (tests/test_pause.py, 13.9 CPU-s during a run). The
kernel's freezer holds a cgroup's tasks where no signal reaches: SIGCONT does not thaw a frozen task, and a cgroup
under a frozen one is frozen too.

How (`Freezer`, made like Cap, and the functions on a cgroup that pause.py uses):
- cgroup v2 (this process's cgroup in the unified hierarchy, writable: root, a container; a hybrid machine has one
  beside v1's): a child of it, the sandbox started in a child of that one; frozen by `cgroup.freeze` = 1, done
  when `cgroup.events` says `frozen 1`; killed by `cgroup.kill`;
- cgroup v1 with a writable freezer hierarchy: the same two levels; frozen by `freezer.state` = FROZEN, done when
  it reads FROZEN; killed by SIGKILL to each task, then thawed (a frozen task dies only once it runs).
  Two levels, as Cap's: an agent that unshares a cgroup namespace and mounts the hierarchy sees the inner
  cgroup as its root, and what it writes there (0, THAWED) does not thaw a cgroup whose parent is frozen;
- neither: no freezer, and `how` says so: pause.py then stops the sandbox with SIGSTOP and says so as it does.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil

from autoresearch import cgroups


FREEZE_WAIT = 10.0  # seconds for the kernel to report a cgroup frozen (or empty once killed) before giving up
INNER = "sandbox"   # the child the sandbox starts in


v2_parent = cgroups.v2_dir


def kind(cgroup: Path) -> str | None:
    """'v2' or 'v1': how this cgroup freezes; None: it cannot (gone, or not a freezer's)."""
    if (cgroup / "cgroup.freeze").exists():
        return "v2"
    if (cgroup / "freezer.state").exists():
        return "v1"
    return None


def frozen(cgroup: Path) -> bool:
    """Whether the kernel reports every task of the cgroup (its children's included) frozen."""
    try:
        if kind(cgroup) == "v2":
            return "frozen 1" in (cgroup / "cgroup.events").read_text().splitlines()
        return kind(cgroup) == "v1" and (cgroup / "freezer.state").read_text().strip() == "FROZEN"
    except OSError:
        return False


def freeze(cgroup: Path, wait: float = FREEZE_WAIT) -> bool:
    """Freeze the cgroup; whether the kernel reports it frozen within `wait` seconds."""
    how = kind(cgroup)
    try:
        if how == "v2":
            (cgroup / "cgroup.freeze").write_text("1")
        elif how == "v1":
            (cgroup / "freezer.state").write_text("FROZEN")
        else:
            return False
    except OSError:
        return False
    deadline = time.monotonic() + wait
    while not frozen(cgroup):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def thaw(cgroup: Path) -> None:
    with contextlib.suppress(OSError):
        if kind(cgroup) == "v2":
            (cgroup / "cgroup.freeze").write_text("0")
        elif kind(cgroup) == "v1":
            (cgroup / "freezer.state").write_text("THAWED")


def pids(cgroup: Path) -> list[int]:
    """Every process in the cgroup and the cgroups under it."""
    found = []
    for procs in [cgroup / "cgroup.procs", *cgroup.rglob("*/cgroup.procs")] if cgroup.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            found += [int(p) for p in procs.read_text().split()]
    return found


def kill(cgroup: Path, wait: float = FREEZE_WAIT) -> bool:
    """SIGKILL every process of the cgroup; whether it is empty within `wait` seconds. On v1 a frozen task dies
    only once thawed, so the cgroup is thawed once every task has the signal: each dies at its first step."""
    deadline = time.monotonic() + wait
    while pids(cgroup):
        if (cgroup / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (cgroup / "cgroup.kill").write_text("1")
        for pid in pids(cgroup):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if kind(cgroup) == "v1":
            thaw(cgroup)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Freezer:
    """A freezer cgroup for one sandbox: `wrap(argv)` starts it inside; `dir` is the cgroup pause.py freezes (None:
    no freezer here); `close()` (or the end of a `with`) removes it once the sandbox has ended. `how`: the
    mechanism, or why there is none."""

    def __init__(self, name: str, v2: bool = True):
        """v2 False: not in cgroup v2, where the sandbox must stay in the systemd scope that limits its memory
        (Cap's on a v2 machine): a v1 freezer or none."""
        self.dir: Path | None = None
        self.prefix: list[str] = []
        problems = [] if v2 else ["its cgroup v2 is the systemd scope that limits its memory"]
        for parent, wanted in ((v2_parent() if v2 else None, "v2"), (v1_parent("freezer", None), "v1")):
            if parent is None:
                continue
            sweep(parent)
            cgroup = parent / f"{PREFIX}{os.getpid()}-{name}-{time.monotonic_ns()}"  # a new one, never joined
            try:
                cgroup.mkdir()
                (cgroup / INNER).mkdir()
                if kind(cgroup) != wanted:
                    raise OSError(f"no {'cgroup.freeze' if wanted == 'v2' else 'freezer.state'} in {cgroup}")
            except OSError as e:
                problems.append(f"a cgroup {wanted} could not be made ({e})")
                remove(cgroup)
                continue
            self.dir = cgroup
            self.prefix = cgroups.entering([cgroup / INNER])
            self.how = f"paused by the kernel's freezer (a cgroup {wanted} of its own, {cgroup})"
            return
        self.how = ("NO freezer: no writable cgroup v2 or v1 freezer here, so a pause stops it with SIGSTOP, which "
                    "a process of its own can undo (a SIGCONT timer; docs/integrity.md)"
                    + "".join(f"; {p}" for p in problems))

    def wrap(self, argv: list[str]) -> list[str]:
        return self.prefix + argv

    def close(self) -> None:
        if self.dir is not None:
            if pids(self.dir):  # what outlived its sandbox (v1: frozen tasks die only once thawed)
                kill(self.dir)
            remove(self.dir, tries=50)

    def __enter__(self) -> Freezer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- the memory an agent's sandbox may hold -----------------------------------------------------------------------
# A memory limit on an agent's sandbox: what it holds cannot crowd out a run it is judged by.
#
# Why: a paused agent (pause.py) runs nothing while the harness trains, but keeps its memory. Its private /tmp, the
# tmpfs that hide the caches and /dev are unsized, and inside its own namespaces it may mount more: a few lines
# writing into /tmp before a control runs fill the RAM, so that the control swaps, or is the process the kernel's
# OOM killer picks (tmpfs pages belong to no process; the training is the largest one). No threshold on what the
# machine has free holds, since the agent decides what is free. So the kernel bounds what the sandbox may hold: a
# memory cgroup, which charges its tmpfs and shared memory as well as what its processes allocate, and OOM-kills
# inside the sandbox, not outside, when it would go beyond.
#
# How (`Cap`, nanochat's way: the mechanism and the reason it was chosen):
# - cgroup v1 with a writable memory hierarchy (root, a container that mounts it): a child of this process's memory
#   cgroup holding the limit (and the same limit on memory and swap together, where swap is accounted), and the
#   sandbox started in a child of that one (`sh -c 'echo $$ > cgroup.procs; exec ...'`: no process of the sandbox
#   starts outside it). Two levels because v1 has no delegation guard: an agent that unshares a cgroup namespace
#   and mounts the memory hierarchy sees its own cgroup as the root and, root underneath, could raise that one's
#   limit (a red team did: 128 MiB to 1 GiB, then held 300 MiB); the limit it cannot see holds. Removed, deepest
#   first (the agent may make children), when the sandbox has ended;
# - cgroup v2 under systemd (a desktop, a workstation): `systemd-run --scope -p MemoryMax=...` (`--user` unless
#   root), the scope gone when the sandbox ends;
# - neither: no limit, and the reason says so (the command prints it; docs/integrity.md lists the hole).
#
# The limit: AGENT_SHARE of the machine's memory, at least AGENT_FLOOR; AUTORESEARCH_AGENT_MEMORY (bytes, or 512M,
# 8G; `none` for no limit) overrides it. It is read when the sandbox starts, from the environment of the user's
# command: the agent inside cannot change it.

ENV = "AUTORESEARCH_AGENT_MEMORY"
AGENT_SHARE = 0.25       # of the machine's memory: Claude Code and its tools use 0.3-1 GiB, a torch import 0.3 GiB
AGENT_FLOOR = 2 << 30    # bytes, whatever the share: an agent that checks its train.py imports torch
PREFIX = "autoresearch-agent-"


def limit() -> int | None:
    """The bytes an agent's sandbox may hold (None: no limit, asked for by the user)."""
    if os.environ.get(ENV, "").strip().lower() == "none":
        return None
    given = cgroups.size_from_env(ENV, "give the bytes an agent may hold (e.g. 4G, 512M) or `none` for no limit")
    return given or max(AGENT_FLOOR, int(AGENT_SHARE * psutil.virtual_memory().total))


def v1_parent(controller: str = "memory", probe: str | None = "memory.limit_in_bytes") -> Path | None:
    """This process's cgroup (v1) of `controller` as a directory it may create children in (cgroups.v1_dir)."""
    return cgroups.v1_dir(controller, probe)


@functools.cache  # asked once per process: the loop's agents start one sandbox a proposal
def systemd_scope_works(user: bool) -> bool:
    """Whether `systemd-run --scope` can start a process with a memory limit here (it needs systemd as the
    service manager, a user's own on cgroup v2)."""
    if shutil.which("systemd-run") is None:
        return False
    argv = ["systemd-run", *(["--user"] if user else []), "--scope", "--quiet", "-p", "MemoryMax=1G", "true"]
    try:
        return subprocess.run(argv, capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class Cap:
    """A memory limit for one sandbox: `wrap(argv)` starts it inside the limit; `close()` (or the end of a `with`)
    removes what was made once the sandbox has ended. `how`: the mechanism and why, or why there is none."""

    def __init__(self, name: str):
        self.bytes = limit()
        self.dir: Path | None = None
        self.prefix: list[str] = []
        if self.bytes is None:
            self.how = f"no memory limit ({ENV}=none)"
            return
        size = f"{self.bytes / (1 << 30):.1f} GiB"
        parent = v1_parent()
        problem = ""
        if parent is not None:
            sweep(parent)
            self.dir = parent / f"{PREFIX}{os.getpid()}-{name}-{time.monotonic_ns()}"  # a new one, never joined
            try:
                self.dir.mkdir()
                hierarchy = self.dir / "memory.use_hierarchy"  # a child's pages count here (always, since 5.11)
                if hierarchy.exists() and hierarchy.read_text().strip() != "1":
                    hierarchy.write_text("1")
                (self.dir / "memory.limit_in_bytes").write_text(str(self.bytes))
                with contextlib.suppress(FileNotFoundError):  # present where swap is accounted
                    (self.dir / "memory.memsw.limit_in_bytes").write_text(str(self.bytes))
                (self.dir / "sandbox").mkdir()
            except OSError as e:
                problem = f"; a cgroup v1 could not be made ({e})"
                self.close()
                self.dir = None
            else:
                self.prefix = cgroups.entering([self.dir / "sandbox"])
                self.how = f"memory limited to {size} (a cgroup v1 of its own, {self.dir})"
                return
        if systemd_scope_works(user=os.geteuid() != 0):
            self.prefix = ["systemd-run", *(["--user"] if os.geteuid() else []), "--scope", "--quiet",
                           "-p", f"MemoryMax={self.bytes}", "-p", "MemorySwapMax=0", "--"]
            self.how = f"memory limited to {size} (a systemd scope)"
        else:
            self.how = ("NO memory limit: no writable memory cgroup (v1) and no systemd scope (v2) here, so what it "
                        f"holds while paused (its /tmp included) is not bounded (docs/integrity.md){problem}")

    def wrap(self, argv: list[str]) -> list[str]:
        return self.prefix + argv

    def reached(self) -> bool:
        """Whether the sandbox ever reached its limit (the kernel then reclaims, or kills inside it)."""
        try:  # its peak at the limit (the counters of failures and kills are kept where it was hit, or not at all)
            return self.dir is not None and int((self.dir / "memory.max_usage_in_bytes").read_text()) >= \
                self.bytes - (1 << 20)
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        if self.dir is not None:
            remove(self.dir, tries=50)  # its last processes may take a moment to leave

    def __enter__(self) -> Cap:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


remove = cgroups.remove


def sweep(parent: Path) -> None:
    """Remove the cgroups of sandboxes whose command died before removing them (cgroups.sweep)."""
    cgroups.sweep(parent, PREFIX)
