"""What the parallel driver (driver.py) sends a worker (worker.py): one run as a Job, and where a kept one lands
on the tag's branch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autoresearch import git, state


@dataclass
class Job:
    """One run dispatched to a worker; its JSON in inflight/ is what recovery records if it never returns."""
    run_id: str
    tag: str
    commit: str        # the commit recorded for it (a candidate's commit object, or the champion's)
    parent: str
    config: str        # git blob of its train.py
    description: str
    seed: int
    repeat: int
    run_no: int        # its place in its series (1 for a candidate's first run)
    test_threshold: float | None
    worker: str
    host: str
    device: str
    protection: str
    started: str
    source: str = ""   # train.py; not written to inflight/
    compile_from: str = ""  # the tag's base configuration: a new configuration's compile base starts from a
                            # copy of its base, never a champion's (compiled.Wanted)
    pruning: dict | None = None  # a candidate's first run: the base's curves it is stopped against (prune.py,
                                 # study.Study.pruning); not written to inflight/


def keep_on_branch(repo: Path, job: Job) -> str:
    """Move the branch to a kept candidate: its own commit when the branch is still on its parent, else a new
    commit of its train.py on top of the branch (a candidate kept after another one was), the candidate's own
    commit its second parent (what it was made from: git.parent_blobs). The commit."""
    head = git.head(repo)
    target = job.commit if head == job.parent else git.commit_with(repo, head, state.EDITABLE, job.source,
                                                                    job.description, merged=job.commit)
    git.reset_to(repo, target, state.EDITABLE)
    return target
