"""One lock per repository for everything that changes state (setup, run, loop).

The lock is an flock on .autoresearch/lock: the kernel releases it when its holder dies, however it dies, so
"the holder is dead" is exactly "the lock is free". The file also names the holder, for the message a second
command prints. Read-only commands (status, report) never take it.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path


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
