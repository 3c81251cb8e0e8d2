"""The reviewed train.py: what the project's tests and benchmarks run, never the work tree's (docs/integrity.md).

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

import subprocess
from pathlib import Path

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
