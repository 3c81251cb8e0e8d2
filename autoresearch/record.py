"""Recording a finished run: its Trial, its row (judged by study.Study.row), its log, the ledger.

Both loops record through here: `autoresearch run` (run.py) after executing in the repository, and the parallel
driver (driver.py) after a worker returns, so a run's row does not depend on where it ran. The Study judges,
record writes; the branch is the caller's (a sequential run resets it on a discard, the driver fast-forwards it
on a keep).

Recovering: a harness, driver or worker that died mid-run leaves a record of what it started, and the next
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
import uuid
from dataclasses import KW_ONLY, asdict, dataclass, fields
from pathlib import Path

from autoresearch import (descriptions, fixed, git, ledger, processes, sandbox, scratch, state, supervise, tagconfig,
                          tags)
from autoresearch.errors import HarnessError
from autoresearch.evaluator import safe_read
from autoresearch.tagconfig import Tag


@dataclass(frozen=True)
class Trial:
    """One run, from the moment it is planned to its row: what it runs (its commit and configuration, the seed,
    which repeat, its place in its series), what was decided before it ran (the test threshold, the pruning
    reference), what protects it and where it runs. Its JSON (to_json) is what pending.json and a parallel loop's
    inflight/<run_id>.json hold, and what recovery reads back (from_json, the one place a record from an older
    harness gets its defaults). The parallel driver sends it to a worker with train.py's text (source)."""
    run_id: str
    tag: str
    parent: str            # the commit it was made from (the branch's head, or a candidate's parent)
    description: str
    _: KW_ONLY             # the rest by name: a field added later never shifts a caller's values
    seed: int = 0
    repeat: int = 1        # which run of its configuration (1 for the first)
    run_no: int = 1        # its place in its series
    test_threshold: float | None = None  # val_bpb below which its test split is scored (and it is audited)
    protection: str = "none"
    commit: str = ""       # its train.py's commit ("" until committed: its row then names the parent)
    config: str = ""       # git blob of its train.py ("" until committed)
    worker: str = ""
    host: str = ""
    device: str = ""
    started: str = ""
    compile_from: str = ""  # the tag's base configuration: a new configuration's compile base starts from a copy of
                            # its base, never a champion's (compiled.Wanted)
    audit_at_keep: bool = False  # its causality audit waits for its series' keep (study.Study.audit_at_keep)
    verify: bool = False   # a verification's run (verify.py): status verify, never an experiment's
    budget_s: float | None = None  # a verification's budget where it is not the tag's
    source: str = ""       # train.py, for a worker; never written to disk with the record
    pruning: dict | None = None  # a candidate's first run: the base's curves it is stopped against (baseline.py,
                                 # study.Study.pruning); never written with the record

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in ("source", "pruning")}

    @classmethod
    def from_json(cls, data: dict) -> "Trial":
        """A record as to_json wrote it, or an older harness's (no parent: its commit's)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known and v is not None}
        values.setdefault("parent", values.get("commit", ""))
        return cls(**values)

    def row(self, tag_config: Tag, status: str, description: str | None = None, **values) -> ledger.Row:
        """Its ledger row with `status` (and another description, a note added), the rest of the row's fields
        given by name (val_bpb, steps, wall, the decision's statistics, ...)."""
        return make_row(tag_config, self.commit or self.parent, self.description if description is None
                        else description, self.run_id, status, seed=self.seed, protection=self.protection,
                        config=self.config, repeat=self.repeat, worker=self.worker, host=self.host,
                        device=self.device, **values)

    def interrupted(self, tag_config: Tag, reason: str) -> ledger.Row:
        """The row of this run when its harness, driver or worker died before it was recorded (a verification's
        stays one: never a crash of an experiment)."""
        return self.row(tag_config, "verify" if self.verify else "crash",
                        descriptions.noted(self.description, descriptions.INTERRUPTED, reason), decision="interrupted",
                        **({"budget_s": self.budget_s} if self.budget_s else {}))


class Pending:
    """A Trial's record on disk while it runs (pending.json, or a worker's): the trial and every process of its
    training (supervise.run_training adds them), which a later recovery kills and records (record.py)."""

    def __init__(self, path: Path, trial: Trial | None = None):
        self.path, self.trial, self.processes = path, trial, []

    def write(self) -> None:
        state.atomic_json(self.path, dict(self.trial.to_json() if self.trial else {}, processes=self.processes))

    @classmethod
    def read(cls, path: Path) -> "Pending | None":
        """The record at `path`, None where there is none; an unreadable one is a clear error."""
        try:
            data = json.loads(path.read_text())
            pending = cls(path, Trial.from_json(data))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, AttributeError) as e:
            raise HarnessError(f"{path} is unreadable ({e}). It records the experiment that was in flight; look "
                               "at it, then delete it to go on.") from None
        pending.processes = data.get("processes") or []
        return pending


def make_row(tag_config: Tag, commit: str, description: str, run_id: str, status: str, **fields) -> ledger.Row:
    """A ledger row of the tag: fields by name as ledger.Row has them, but `wall` for wall_s."""
    fields.setdefault("val_bpb", 0.0)
    fields.setdefault("memory_gb", 0.0)
    fields.setdefault("steps", 0)
    fields.setdefault("seed", 0)
    return ledger.Row(commit=commit[:7], status=status, description=description, tag=tag_config.tag,
                      run_id=run_id, time=state.now(), budget_s=fields.pop("budget_s", tag_config.budget_s),
                      wall_s=fields.pop("wall", 0.0), fingerprint=tag_config.fingerprint[:12],
                      clock=tag_config.clock, **fields)


def publish_log(repo: Path, log_path: Path) -> None:
    """The finished run's log as repo/run.log, for agents that follow the public protocol. Read as a regular file
    only: a link left in its place would otherwise copy whatever it points to into the work tree."""
    try:
        data = safe_read.read_regular(log_path, 4 * supervise.LOG_KEEP)
    except (OSError, safe_read.Unsafe) as e:
        data = f"(the run's log could not be read: {e})\n".encode()
    tmp = state.state_dir(repo) / f".{state.RUN_LOG}.{uuid.uuid4().hex[:8]}.tmp"  # same filesystem, outside the work tree
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, repo / state.RUN_LOG)


def drop_model(run_dir: Path) -> None:
    """Only kept models are worth their disk."""
    contract = fixed.contract()
    for name in (contract.TENSORS_FILE, contract.GRAPH_FILE):
        (run_dir / sandbox.OUT_DIR / name).unlink(missing_ok=True)


def record(repo: Path, row: ledger.Row, run_dir: Path | None = None) -> None:
    """The one way a run's row is written once the run started (finished, crashed or interrupted; only a refusal
    before a run starts is appended by run.py itself). A run that produced a val_bpb gets the public protocol's
    last line (`val_bpb: ...`, now the harness's number) in its log; the row goes to the ledger; the log is published as
    repo/run.log for agents that follow the public protocol. A kill between any two steps loses nothing: the
    caller's marker of the run in flight (pending.json, inflight/<id>.json) is removed only after this."""
    log_path = run_dir / state.RUN_LOG if run_dir is not None else None
    if log_path is not None and row.status in ("keep", "discard", "confirm", "control"):
        supervise.append_line(log_path, fixed.contract().final_line(row.val_bpb, row.memory_gb, row.steps))
    state.fault_point("recording")
    ledger.append(state.results(repo), row)
    state.fault_point("recorded")
    if log_path is not None:
        publish_log(repo, log_path)


def read_pending(repo: Path) -> Pending | None:
    """`autoresearch run`'s record of the run in flight (pending.json), None when nothing is."""
    return Pending.read(state.pending_file(repo))


def recover_inflight(repo: Path, log=print, reason: str = "the driver died mid-run") -> list[ledger.Row]:
    """Record every run a dead parallel driver had dispatched and not recorded (its workers died with it)."""
    recorded = []
    for path in sorted(state.inflight_dir(repo).glob("*.json")):
        try:
            trial = Trial.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, AttributeError):  # torn by a kill while written: it never reached a
            path.unlink()                                         # worker
            continue
        config = tagconfig.read(state.tag_file(repo, trial.tag))
        if not any(r.run_id == trial.run_id for r in ledger.read(state.results(repo), config.tag,
                                                                  verification=True)):
            row = trial.interrupted(config, reason)
            record(repo, row)
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
        record(repo, row)
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
