"""A memory limit on an agent's sandbox: what it holds cannot crowd out a run it is judged by.

Why: a paused agent (pause.py) runs nothing while the harness trains, but keeps its memory. Its private /tmp, the
tmpfs that hide the caches and /dev are unsized, and inside its own namespaces it may mount more: a few lines
writing into /tmp before a control runs fill the RAM, so that the control swaps, or is the process the kernel's
OOM killer picks (tmpfs pages belong to no process; the training is the largest one). No threshold on what the
machine has free holds, since the agent decides what is free. So the kernel bounds what the sandbox may hold: a
memory cgroup, which charges its tmpfs and shared memory as well as what its processes allocate, and OOM-kills
inside the sandbox, not outside, when it would go beyond.

How (`Cap`, nanochat's way: the mechanism and the reason it was chosen):
- cgroup v1 with a writable memory hierarchy (root, a container that mounts it): a child of this process's memory
  cgroup holding the limit (and the same limit on memory and swap together, where swap is accounted), and the
  sandbox started in a child of that one (`sh -c 'echo $$ > cgroup.procs; exec ...'`: no process of the sandbox
  starts outside it). Two levels because v1 has no delegation guard: an agent that unshares a cgroup namespace
  and mounts the memory hierarchy sees its own cgroup as the root and, root underneath, could raise that one's
  limit (a red team did: 128 MiB to 1 GiB, then held 300 MiB); the limit it cannot see holds. Removed, deepest
  first (the agent may make children), when the sandbox has ended;
- cgroup v2 under systemd (a desktop, a workstation): `systemd-run --scope -p MemoryMax=...` (`--user` unless
  root), the scope gone when the sandbox ends;
- neither: no limit, and the reason says so (the command prints it; docs/integrity.md lists the hole).

The limit: AGENT_SHARE of the machine's memory, at least AGENT_FLOOR; AUTORESEARCH_AGENT_MEMORY (bytes, or 512M,
8G; `none` for no limit) overrides it. It is read when the sandbox starts, from the environment of the user's
command: the agent inside cannot change it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import time
from pathlib import Path

import psutil

from autoresearch import cgroups

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
                self.prefix = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.dir / "sandbox")]
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
