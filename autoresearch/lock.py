"""One lock per repository for everything that changes state (setup, run, loop), and the identity of processes.

The lock is an flock on .autoresearch/lock: the kernel releases it when its holder dies, however it dies, so
"the holder is dead" is exactly "the lock is free". The file also names the holder, for the message a second
command prints. Read-only commands (status, report) never take it.

A process is identified by its pid and its start time, so a pid the system has reused for something else is
never killed in our name.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil

LOCK_NAME = "lock"


class LockHeld(RuntimeError):
    pass


class RepoLock:
    def __init__(self, state_dir: Path, command: str):
        self.path = state_dir / LOCK_NAME
        self.command = command
        self.fd = None

    def __enter__(self) -> "RepoLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LockHeld(describe_holder(self.path)) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "command": self.command,
                                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}).encode())
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock
            self.fd = None


def holder(path: Path) -> str:
    """Who holds the lock at path, as its lock file names it."""
    try:
        data = json.loads(path.read_text())
        return f"`{data['command']}` (pid {data['pid']}, since {data['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another autoresearch command"


def describe_holder(path: Path) -> str:
    return (f"{holder(path)} is running in this repository, and only one command that changes state may run at a "
            "time. Wait for it to finish, or stop it (Ctrl-C in its terminal, or `kill PID`: the experiment in "
            "flight is then recorded by the next command). `autoresearch status` is safe to run alongside.")


def is_held(state_dir: Path) -> bool:
    """Whether a live process holds the lock (without taking it)."""
    path = state_dir / LOCK_NAME
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


# --- process identity ----------------------------------------------------------------------------------


def identity(pid: int) -> list | None:
    """[pid, start time] of a live process, None if there is none."""
    try:
        return [pid, psutil.Process(pid).create_time()]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def same_process(ident) -> psutil.Process | None:
    """The process with this recorded identity, if it is still the same process."""
    try:
        pid, started = ident
        proc = psutil.Process(int(pid))
        if abs(proc.create_time() - float(started)) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, TypeError, ValueError):
        pass
    return None


def kill_all(identities, grace: float = 5.0) -> int:
    """SIGTERM every recorded process that is still itself, then SIGKILL what is left after grace seconds.
    Returns how many were signalled."""
    procs = [p for p in (same_process(i) for i in identities) if p is not None]
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace) if procs else ([], [])
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
    return len(procs)


def reap(identities) -> None:
    """Collect the exit status of recorded processes that ended as our children (orphans that became ours as
    subreaper), so that none is left as a zombie over a night of runs."""
    me = os.getpid()
    for ident in identities:
        try:
            pid = int(ident[0])
            proc = psutil.Process(pid)
            if proc.ppid() == me and proc.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError, TypeError, ValueError, IndexError):
            continue


def become_subreaper() -> bool:
    """Linux: orphaned descendants (a daemon that double-forks, a setsid escapee whose parent died) are
    re-parented to this process instead of init, so they stay in its process tree and can be found."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def descendants(spare=()) -> list[list]:
    """Identities of every live descendant of this process, less the subtrees rooted at the pids in `spare`
    (the waiting evaluator and its sandbox)."""
    spare = set(spare)
    out = []
    for child in psutil.Process().children(recursive=True):
        try:  # by ancestry, checked per process: one forked in the spare tree a moment ago is still spare
            if child.pid in spare or any(a.pid in spare for a in child.parents()):
                continue
        except psutil.Error:
            continue
        try:
            out.append([child.pid, child.create_time()])
        except psutil.Error:
            continue
    return out


# Exec'd in front of a command: it dies (SIGKILL) when the process that started it dies, e.g. a Ray worker killed
# with its node, which leaves no one to kill a training in its own session. PR_SET_PDEATHSIG is 1 and outlives
# exec; the parent check covers a parent that died before the prctl.
_TIED = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0); "
         "os.getppid() == int(sys.argv[1]) or os._exit(70); os.execvp(sys.argv[2], sys.argv[2:])")


def tied_to_parent(argv: list[str]) -> list[str]:
    """argv, made to die with this process (Linux; elsewhere argv unchanged)."""
    if not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-c", _TIED, str(os.getpid()), *argv]
