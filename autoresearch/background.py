"""`autoresearch run --detach` and `autoresearch wait`: an experiment for an agent whose shell tool times out.

A run takes 5-21 minutes; coding agents' shell tools give up after 2-10. A killed `autoresearch run` is recorded as
interrupted and its series must then be finished before the next edit runs, so an agent should not hold a run
in its shell: `run --detach` starts it in its own session (a tool's timeout cannot kill it) and returns once it
holds the repository's lock; `wait` returns when it ends, or after --timeout seconds (default WAIT_S, under
every agent's limit) with exit status STILL_RUNNING, to be called again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from autoresearch import lock, processes, state

LOG_FILE = "detached.log"   # under STATE_DIR: the detached run's output
RC_FILE = "detached.rc"     # under STATE_DIR: its exit status, written when it ends
PID_FILE = "detached.pid"   # under STATE_DIR: the identity (pid, start time) of the detached process
RC_ENV = "AUTORESEARCH_DETACHED_RC"  # set for the detached process: where it writes its exit status as it ends
WAIT_S = 240.0
STILL_RUNNING = 3           # `wait`'s exit status when the run is still going at its timeout
START_S = 60.0              # seconds a detached run may take to take the lock (imports, recovery)


def detach(repo: Path, argv: list[str]) -> tuple[int, str]:
    """Start `autoresearch <argv>` in the background; (exit status, what to tell the user)."""
    where = state.state_dir(repo)
    where.mkdir(parents=True, exist_ok=True)
    if lock.is_held(where):
        raise lock.LockHeld(lock.describe_holder(where / lock.LOCK_NAME) + "; `autoresearch wait` returns when it "
                            "ends")
    log_path, rc_path = where / LOG_FILE, where / RC_FILE
    rc_path.unlink(missing_ok=True)
    with open(log_path, "w") as out:  # its own session: the caller's shell timeout cannot kill it
        proc = subprocess.Popen([sys.executable, "-m", "autoresearch.cli", *argv], cwd=repo, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1", **{RC_ENV: str(rc_path)}))
    (where / PID_FILE).write_text(json.dumps(processes.identity(proc.pid)))
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline and not lock.is_held(where) and proc.poll() is None:
        time.sleep(0.2)
    if proc.poll() is not None and not lock.is_held(where):  # it ended at once: an error, said now
        return _status(rc_path), log_path.read_text(errors="replace").rstrip()
    return 0, (f"started in the background (pid {proc.pid}); its output goes to {log_path}. "
               f"`autoresearch wait` returns when it ends (or after {WAIT_S:.0f} s with exit status "
               f"{STILL_RUNNING}: call it again); `autoresearch status` shows it meanwhile")


def record_status(code: int) -> None:
    """Called by the detached process as it ends: its exit status, for `wait` (written whole, then renamed)."""
    path = os.environ.get(RC_ENV)
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{code}\n")
        os.replace(tmp, path)


def _status(rc_path: Path) -> int:
    try:
        return int(rc_path.read_text().strip())
    except (OSError, ValueError):
        return 1


def wait(repo: Path, timeout: float = WAIT_S) -> tuple[int, str]:
    """Wait until no command holds the repository (a detached run, a loop); (exit status, what to tell)."""
    where = state.state_dir(repo)
    deadline = time.monotonic() + timeout
    while lock.is_held(where):
        if time.monotonic() >= deadline:
            return STILL_RUNNING, (f"still running: {lock.holder(where / lock.LOCK_NAME)}; call "
                                   "`autoresearch wait` again (`autoresearch status` shows its progress)")
        time.sleep(1.0)
    log_path, rc_path = where / LOG_FILE, where / RC_FILE
    if not log_path.exists():
        return 0, "nothing is running"
    try:  # the lock is free a moment before the process writes its exit status and ends
        detached = processes.same_process(json.loads((where / PID_FILE).read_text()))
    except (OSError, ValueError):
        detached = None
    while detached is not None and not rc_path.exists() and detached.is_running() and time.monotonic() < deadline + 10:
        time.sleep(0.1)
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-60:])
    if not rc_path.exists():
        return 1, (tail + "\n--- the background run ended without an exit status (it was killed); the next "
                   "`autoresearch run` records it as interrupted and puts the branch back")
    return _status(rc_path), tail
