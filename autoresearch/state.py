"""Where the harness keeps its state, each path defined here once, how it writes it, and the repository's lock
(below).

    results.tsv                      the ledger (ledger.py): append-only, the record of truth
    .autoresearch/tags/<tag>.json    written once by setup (tags.py): what the tag's runs are compared under
    .autoresearch/pending.json       the run in flight of `autoresearch run`/`loop` (record.py)
    .autoresearch/inflight/<id>.json each run a parallel driver has dispatched (driver.py)
    .autoresearch/runs/<id>/         one run: run.log, evaluation.json, out/ (the only dir a training writes)
    .autoresearch/lock               held by whoever changes state (RepoLock, below)
    .autoresearch/waiting.json       while a run waits for a quiet machine (machine.py)
    .autoresearch/stop               the dashboard's stop button (loop.py reads it between experiments)
    .autoresearch/detached.*         `run --detach`'s output, pid and exit status (background.py)
    .autoresearch/agent-tokens/*.json each agent session's tokens, its stretch and runs (tokens.py)

Every JSON file is written whole or not at all (atomic_json), so a kill at any moment leaves the old file or
the new one, never half of one.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
import uuid
from pathlib import Path



STATE_DIR = ".autoresearch"
RESULTS = "results.tsv"
BRANCH_PREFIX = "autoresearch/"
EDITABLE = "train.py"          # the one file an experiment changes
FIXED = ("prepare.py", "runtime.py")  # the fixed half's code: what train.py imports, never edited by an experiment
RUN_LOG = "run.log"            # in a run's directory, and the last run's copy at the repository's root
EVALUATION = "evaluation.json"  # in a run's directory: the harness's evaluation


def state_dir(repo: Path) -> Path:
    return repo / STATE_DIR


def results(repo: Path) -> Path:
    return repo / RESULTS


def tags_dir(repo: Path) -> Path:
    return state_dir(repo) / "tags"


def tag_file(repo: Path, tag: str) -> Path:
    return tags_dir(repo) / f"{tag}.json"


def pending_file(repo: Path) -> Path:
    return state_dir(repo) / "pending.json"


def inflight_dir(repo: Path) -> Path:
    return state_dir(repo) / "inflight"


def inflight_file(repo: Path, run_id: str) -> Path:
    return inflight_dir(repo) / f"{run_id}.json"


def runs_dir(repo: Path) -> Path:
    return state_dir(repo) / "runs"


def run_dir(repo: Path, run_id: str) -> Path:
    return runs_dir(repo) / run_id


def waiting_file(repo: Path) -> Path:
    return state_dir(repo) / "waiting.json"


def stop_file(repo: Path) -> Path:
    return state_dir(repo) / "stop"


def atomic_json(path: Path, data: dict) -> None:
    """Write path whole or not at all. The temporary file is created new (O_EXCL, never through a link) and
    renamed over path, which replaces whatever path was, a link a run left there included, without following it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def parse_time(stamp: str) -> float | None:
    """Seconds since the epoch of a stamp now() wrote (a ledger row's time), None for anything else."""
    try:
        return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))
    except (TypeError, ValueError):
        return None


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def tail(path: Path, n: int = 50) -> str:
    """The last n lines of a text file (a run's log: the training's text), as a terminal may show it
    (descriptions.printable), or "" when there is none."""
    from autoresearch.descriptions import printable  # descriptions imports nothing of the harness's state
    if not path.exists():
        return ""
    return printable("\n".join(path.read_text(errors="replace").splitlines()[-n:]))


def fault_point(name: str) -> None:
    """For the fault-injection tests and benchmark (benchmarks/faults.py): AUTORESEARCH_KILL_AT=name makes the
    harness SIGKILL itself here, at a moment a test could not otherwise hit reliably."""
    if os.environ.get("AUTORESEARCH_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


# --- the repository's lock ----------------------------------------------------------------------------------------
# One lock per repository for everything that changes state (setup, run, loop).
# 
# The lock is an flock on .autoresearch/lock: the kernel releases it when its holder dies, however it dies, so
# "the holder is dead" is exactly "the lock is free". The file also names the holder, for the message a second
# command prints. Read-only commands (status, report) never take it.

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
