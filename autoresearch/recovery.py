"""Recovery: a harness, driver or worker that died mid-run leaves a record of what it started, and the next
command that takes the repository's lock finishes it.

- `autoresearch run`/`loop` writes .autoresearch/pending.json before a run starts and removes it after the row is
  recorded; a parallel driver writes one inflight/<run_id>.json per run it dispatches. Finding one means its
  writer died (the lock is free, so it is certainly dead).
- recover() kills what is left of the training (the processes recorded, each checked by its start time),
  records the run as an interrupted crash unless its row made it, and puts the branch back where it belongs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from autoresearch import git, ledger, processes, record, sandbox, scratch, state, tagconfig, tags


def read_pending(repo: Path) -> record.Pending | None:
    """`autoresearch run`'s record of the run in flight (pending.json), None when nothing is."""
    return record.Pending.read(state.pending_file(repo))


def recover_inflight(repo: Path, log=print, reason: str = "the driver died mid-run") -> list[ledger.Row]:
    """Record every run a dead parallel driver had dispatched and not recorded (its workers died with it)."""
    recorded = []
    for path in sorted(state.inflight_dir(repo).glob("*.json")):
        try:
            trial = record.Trial.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, AttributeError):  # torn by a kill while written: it never reached a
            path.unlink()                                         # worker
            continue
        config = tagconfig.read(state.tag_file(repo, trial.tag))
        if not any(r.run_id == trial.run_id for r in ledger.read(state.results(repo), config.tag,
                                                                  verification=True)):
            row = trial.interrupted(config, reason)
            record.record(repo, row)
            recorded.append(row)
            log(f"recovered an interrupted run ({trial.run_id} on {trial.worker or 'a worker'}): recorded as crash")
        path.unlink()
    return recorded


def recover(repo: Path, log=print, reason: str = "harness died mid-run", parallel: bool = False) -> ledger.Row | None:
    """Finish an experiment whose harness died: kill its training, record it as a crash unless its row was
    recorded, and put the branch back on the last kept commit (or on the candidate whose series is open, for
    `autoresearch run`; a parallel driver never moves the branch to a candidate). Only a holder of the
    repository's lock may call this (run and loop do): then the harness that wrote pending.json is certainly
    dead."""
    inflight = recover_inflight(repo, log)
    pending = read_pending(repo)
    if pending is None:
        if inflight or parallel:
            branch_back(repo, parallel, inflight[-1].tag if inflight else None)
        return inflight[-1] if inflight else None
    processes.kill_recorded(pending.processes)
    trial = pending.trial
    run_dir = state.run_dir(repo, trial.run_id)
    for bounded in (sandbox.OUT_DIR, sandbox.COMPILE_DIR):  # a tmpfs the dead harness mounted (scratch.py)
        if os.path.ismount(run_dir / bounded):
            scratch.release(run_dir / bounded)
    config = tagconfig.read(state.tag_file(repo, trial.tag))
    rows = ledger.read(state.results(repo), config.tag, verification=True)
    row = None
    if not any(r.run_id == trial.run_id for r in rows):
        row = trial.interrupted(config, reason)
        record.record(repo, row)
        log(f"recovered an interrupted experiment ({trial.run_id}): recorded as crash")
    branch_back(repo, parallel, trial.tag)
    if trial.verify:  # a verification's train.py (verify.py) in the work tree: the branch's back
        git.reset_to(repo, git.head(repo), state.EDITABLE)
    (state.pending_file(repo)).unlink()
    return row


def branch_back(repo: Path, parallel: bool, tag: str | None) -> None:
    """The branch back where it belongs between runs, if it is the tag's (or, tag None, any experiment branch)."""
    name = git.branch(repo)
    if not name.startswith(state.BRANCH_PREFIX) or (tag is not None and name != state.BRANCH_PREFIX + tag):
        return
    config = tags.load_tag(repo)
    rows = ledger.read(state.results(repo), config.tag)
    # an open confirmation series of `autoresearch run` stays on its candidate
    target = tags.last_kept_commit(repo, config, rows) if parallel else tags.branch_target(repo, config, rows)
    if git.head(repo) != target:
        git.reset_to(repo, target, state.EDITABLE)
