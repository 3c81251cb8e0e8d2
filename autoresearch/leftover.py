"""What an agent's session leaves in the work tree: its train.py, untrusted code (docs/integrity.md).

A session of `autoresearch agent` planted a payload at the top of train.py and ran nothing; left in the work
tree, it ran as the user at the next `python train.py` or test that imported it. So when a session ends, train.py
is put back to the branch's committed one (HEAD's: a kept run's train.py is committed, and so is the base), and
the agent's text is kept under the state directory (SESSIONS/STAMP/train.py, ignored by git), for the user to
read, not to run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from autoresearch import git, lock, state
from autoresearch.evaluator import safe_read

READ_LIMIT = 1 << 20   # bytes of the agent's train.py kept: ten times a tag's limit on its size
SESSIONS = "agent-sessions"  # under state.state_dir: one folder per session whose train.py was put back


def saved_path(repo: Path, stamp: str) -> Path:
    return state.state_dir(repo) / SESSIONS / stamp / state.EDITABLE


def committed(repo: Path) -> bytes | None:
    """HEAD's train.py as checkout would write it, or None (no commit holds it)."""
    proc = subprocess.run(["git", "cat-file", "--filters", f"HEAD:{state.EDITABLE}"], cwd=repo, capture_output=True)
    return proc.stdout if proc.returncode == 0 else None


def put_back(repo: Path, stamp: str | None = None, log=lambda text: print(text, file=sys.stderr)) -> Path | None:
    """After an agent's session (its sandbox ended): if the work tree's train.py is not HEAD's, save it to
    saved_path and write HEAD's in its place, under the repository's lock (a run in flight, which commits and
    puts back train.py itself, ends first). Returns where the agent's text was saved, or None."""
    target = repo / state.EDITABLE
    ours = committed(repo)
    if ours is None:
        log(f"autoresearch agent: HEAD holds no {state.EDITABLE}; the work tree's is left as the agent left it "
            "(untrusted code: read it before you run it, docs/integrity.md)")
        return None
    with _lock(repo, log):
        theirs, unread = None, ""
        try:  # the agent's file: a regular file of bounded size, read without following a link (a 200 GB sparse
            theirs = safe_read.read_regular(target, READ_LIMIT)  # one, or one of mode 000, stopped the put-back)
        except FileNotFoundError:
            pass
        except (OSError, safe_read.Unsafe) as e:
            unread = str(e)
        if theirs == ours:
            return None
        saved = saved_path(repo, stamp or time.strftime("%Y%m%d-%H%M%S"))
        try:
            saved.parent.mkdir(parents=True, exist_ok=True)
            if theirs is not None:
                saved.write_bytes(theirs)
        finally:  # whatever the agent left, HEAD's goes back
            if os.path.lexists(target) and not os.path.isfile(target) or os.path.islink(target):
                os.unlink(target)
            git.reset_to(repo, git.head(repo), state.EDITABLE)  # in place, HEAD unmoved
    left = (f"its text in {saved}" if theirs is not None else
            f"a file it could not keep ({unread})" if unread else "none (deleted)")
    log(f"autoresearch agent: {state.EDITABLE} is back at the committed one ({git.head(repo)[:7]}); the agent left "
        f"{left}: untrusted code, read it before you run it (docs/integrity.md)")
    return saved


class _lock:
    """The repository's lock, waited for: a command the agent started (a detached run) may still hold it."""

    def __init__(self, repo: Path, log):
        self.held = lock.RepoLock(state.state_dir(repo), "autoresearch agent (putting train.py back)")
        self.log = log

    def __enter__(self):
        said = False
        while True:
            try:
                return self.held.__enter__()
            except lock.LockHeld as e:
                if not said:
                    self.log(f"autoresearch agent: waiting to put {state.EDITABLE} back: {e}")
                    said = True
                time.sleep(1)

    def __exit__(self, *exc):
        self.held.__exit__(*exc)
