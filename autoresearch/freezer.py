"""A pause the agent cannot undo: its sandbox starts in a freezer cgroup of its own, which pause.py freezes.

Why: a pause by SIGSTOP is undone by a process of the agent's own. A POSIX timer whose signal is SIGCONT
(timer_create, SIGEV_SIGNAL) continues it after a scan of /proc found everything stopped, and it continues the
others in turn: 1.5 CPU-s of 2 s burned while "paused" (tests/test_pause.py, 13.9 CPU-s during a run). The
kernel's freezer holds a cgroup's tasks where no signal reaches: SIGCONT does not thaw a frozen task, and a cgroup
under a frozen one is frozen too.

How (`Freezer`, made like memcap.Cap, and the functions on a cgroup that pause.py uses):
- cgroup v2 (this process's cgroup in the unified hierarchy, writable: root, a container; a hybrid machine has one
  beside v1's): a child of it, the sandbox started in a child of that one; frozen by `cgroup.freeze` = 1, done
  when `cgroup.events` says `frozen 1`; killed by `cgroup.kill`;
- cgroup v1 with a writable freezer hierarchy: the same two levels; frozen by `freezer.state` = FROZEN, done when
  it reads FROZEN; killed by SIGKILL to each task, then thawed (a frozen task dies only once it runs).
  Two levels, as memcap's: an agent that unshares a cgroup namespace and mounts the hierarchy sees the inner
  cgroup as its root, and what it writes there (0, THAWED) does not thaw a cgroup whose parent is frozen;
- neither: no freezer, and `how` says so: pause.py then stops the sandbox with SIGSTOP and says so as it does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from autoresearch import cgroups, memcap

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
        (memcap.Cap's on a v2 machine): a v1 freezer or none."""
        self.dir: Path | None = None
        self.prefix: list[str] = []
        problems = [] if v2 else ["its cgroup v2 is the systemd scope that limits its memory"]
        for parent, wanted in ((v2_parent() if v2 else None, "v2"), (memcap.v1_parent("freezer", None), "v1")):
            if parent is None:
                continue
            memcap.sweep(parent)
            cgroup = parent / f"{memcap.PREFIX}{os.getpid()}-{name}-{time.monotonic_ns()}"  # a new one, never joined
            try:
                cgroup.mkdir()
                (cgroup / INNER).mkdir()
                if kind(cgroup) != wanted:
                    raise OSError(f"no {'cgroup.freeze' if wanted == 'v2' else 'freezer.state'} in {cgroup}")
            except OSError as e:
                problems.append(f"a cgroup {wanted} could not be made ({e})")
                memcap.remove(cgroup)
                continue
            self.dir = cgroup
            self.prefix = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup / INNER)]
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
            memcap.remove(self.dir, tries=50)

    def __enter__(self) -> Freezer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
