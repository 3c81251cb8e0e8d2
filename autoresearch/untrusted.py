"""train.py as untrusted code: the reviewed one that tests and benchmarks run (source, write, commit), and an
agent's put back when its session ends (put_back, below).

The reviewed train.py: what the project's tests and benchmarks run, never the work tree's (docs/integrity.md).

Every train.py an agent wrote is untrusted code, kept or not: the work tree's file is whatever the last agent
left there (an agent's session planted a payload at its top, and the test that imported it ran it as the user,
outside every sandbox, and copied the secret draws), and an experiment branch's commits (autoresearch/TAG) are
the harness's commits of an agent's text. What the developers reviewed is a commit of their own branches.

The rule (commit): the newest commit of HEAD's first-parent line that a local branch outside autoresearch/*
reaches. On main or a feature branch that is HEAD; on an experiment branch (or detached at one of its commits)
it is the commit the tag was set up from, or a later one merged into the user's branch; a commit the user
adopted (a branch of theirs made from a champion) is theirs. Without any local branch outside autoresearch/* (a
CI job's detached checkout) it is HEAD, unless an experiment branch holds HEAD (then there is none). Why not a checked-in copy: it would drift from the train.py it stands
for, and a test of the shipped train.py would test the copy. Why not "main": a user's branch may be called
otherwise, and a feature branch's train.py is the one its tests are about.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from autoresearch import git, state
from autoresearch.errors import HarnessError
from autoresearch.evaluator import safe_read


EXPERIMENT_BRANCHES = "autoresearch/*"  # state.BRANCH_PREFIX's branches, as git's --exclude pattern


class NoReference(RuntimeError):
    pass


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if proc.returncode != 0:
        raise NoReference(f"git {' '.join(args)} in {repo}: {proc.stderr.strip()}")
    return proc.stdout


def commit(repo: Path) -> str:
    """The commit whose train.py the tests and benchmarks run (see the top)."""
    head = _git(repo, "rev-parse", "HEAD").strip()
    users = _git(repo, "for-each-ref", "--format=%(refname)", "refs/heads").split()
    if not any(not ref.startswith("refs/heads/autoresearch/") for ref in users):
        # only experiment branches, and HEAD one of their commits
        if _git(repo, "for-each-ref", "--contains", "HEAD", "refs/heads").strip():
            raise NoReference(f"HEAD ({head[:12]}) is an experiment branch's commit and no branch of yours is "
                              "left: check out your own branch to run the tests")
        return head  # a detached checkout without branches (a CI job's)
    # HEAD's first-parent line down to the first commit a user's branch reaches: those are the agents' alone
    agents = _git(repo, "rev-list", "--first-parent", "HEAD", "--not",
                  f"--exclude={EXPERIMENT_BRANCHES}", "--branches").split()
    if not agents:
        return head
    parent = subprocess.run(["git", "rev-parse", "--verify", "-q", f"{agents[-1]}^"], cwd=repo,
                            capture_output=True, text=True).stdout.strip()
    if not parent:
        raise NoReference(f"HEAD ({head[:12]}) shares no commit with a branch outside {EXPERIMENT_BRANCHES}: "
                          "check out your own branch to run the tests")
    return parent


def source(repo: Path, name: str = "train.py") -> str:
    """`name` as the reference commit holds it (by default train.py)."""
    return _git(repo, "show", f"{commit(repo)}:{name}")


def write(repo: Path, dest: Path, name: str = "train.py") -> Path:
    """The reference `name` written to `dest` (a directory: dest/name), for a test or benchmark to run or import
    from there rather than from the work tree. Returns the file's path."""
    path = dest / name if dest.is_dir() else dest
    path.write_text(source(repo, name))
    return path


# --- an agent's train.py put back when its session ends -----------------------------------------------------------
# What an agent's session leaves in the work tree: its train.py, untrusted code (docs/integrity.md).
# 
# A session of `autoresearch agent` planted a payload at the top of train.py and ran nothing; left in the work
# tree, it ran as the user at the next `python train.py` or test that imported it. So when a session ends, train.py
# is put back to the branch's committed one (HEAD's: a kept run's train.py is committed, and so is the base), and
# the agent's text is kept under the state directory (SESSIONS/STAMP/train.py, ignored by git), for the user to
# read, not to run.

READ_LIMIT = 1 << 20   # bytes of the agent's train.py kept: ten times a tag's limit on its size
SESSIONS = "agent-sessions"  # under state.state_dir: one folder per session whose train.py was put back


def work_tree_source(repo: Path) -> bytes:
    """The work tree's train.py (what an agent last wrote) read as a regular file of at most READ_LIMIT bytes,
    without following a link: a sparse 100 GB file, a FIFO or a link costs the harness nothing before it is
    refused (HarnessError, naming the fix). Read before git or anything else hashes it."""
    try:
        return safe_read.read_regular(repo / state.EDITABLE, READ_LIMIT)
    except FileNotFoundError:
        raise HarnessError(f"there is no {state.EDITABLE} in {repo}: `git checkout {state.EDITABLE}` restores the "
                           "branch's") from None
    except (OSError, safe_read.Unsafe) as e:
        raise HarnessError(f"{state.EDITABLE} cannot be read as a plain file of at most {READ_LIMIT:,} bytes "
                           f"({e}); `git checkout {state.EDITABLE}` restores the branch's") from None


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
        self.held = state.RepoLock(state.state_dir(repo), "autoresearch agent (putting train.py back)")
        self.log = log

    def __enter__(self):
        said = False
        while True:
            try:
                return self.held.__enter__()
            except state.LockHeld as e:
                if not said:
                    self.log(f"autoresearch agent: waiting to put {state.EDITABLE} back: {e}")
                    said = True
                time.sleep(1)

    def __exit__(self, *exc):
        self.held.__exit__(*exc)
