"""Where this process may make cgroups, and removing them: what the run's cgroup (runcgroup.py), an agent's memory
limit (memcap.py) and its freezer (freezer.py) share. Each names its cgroups PREFIX<pid>-..., so that sweep()
removes those of a command that died, never a live one's."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import psutil


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
    naming `advice` (what to give) for anything else. The one parser of every size the user sets (memcap's,
    runcgroup's, scratch's)."""
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return None
    m = re.fullmatch(r"(\d+)\s*([kmgt]?)i?b?", text)
    if not m or int(m[1]) == 0:
        from autoresearch.errors import HarnessError
        raise HarnessError(f"{name}={os.environ[name]!r}: {advice}")
    return int(m[1]) * UNITS[m[2]]
