"""results.tsv: the append-only record of every experiment.

One row per run, tab-separated, the public project's columns first. Rows are only ever appended, each with one
write() and an fsync, so a kill at any moment leaves either the whole row or none of it. The file is untracked
(in .gitignore), so `git reset` never touches it.

A configuration (one train.py, named by its git blob in `config`) may run several times, with other seeds:
`repeat` counts its runs, `mean`, `sem` and `n` are its statistics after this row, `p_better` the probability
that it beats the champion, and `decision` why the row has its status (decide.py). Status `confirm` means "more
runs of this configuration follow"; the last row of a series says keep or discard. Status `control` (the
control rule) is a run of the tag's base train.py made beside a candidate's run on the same seed: evidence for that
candidate's decision only, never one of the champion's runs. Status `verify` (verify.py) is a run of
`autoresearch verify`: the champion without one of its keeps, or the champion and the tag's base at a longer
budget; never an experiment, never one of any configuration's runs, never moving the branch.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

COLUMNS = ["commit", "val_bpb", "memory_gb", "status", "description",
           "tag", "run_id", "time", "budget_s", "steps", "wall_s", "fingerprint", "seed", "protection",
           "config", "repeat", "mean", "sem", "n", "p_better", "decision", "clock", "load", "worker", "host", "device",
           "outside_s", "test_bpb", "flags"]
HEADER = "\t".join(COLUMNS) + "\n"
# Earlier layouts: still read (report --results old.tsv), never appended to.
OLD_HEADERS = {"\t".join(COLUMNS[:13]) + "\n": "0.1 (before the harness evaluated models itself)",
               "\t".join(COLUMNS[:14]) + "\n": "0.2 (before decisions over repeated runs)"}
# Earlier layouts whose rows mean what they mean now, only with fewer columns: appended to in their own layout
# (the missing columns are dropped from new rows), so that a tag started before an upgrade goes on.
EXTENDABLE = {"\t".join(COLUMNS[:23]) + "\n": "0.3 (before parallel workers)",
              "\t".join(COLUMNS[:26]) + "\n": "0.4 (before outside_s, test_bpb and flags)"}
STATUSES = ("keep", "discard", "pruned", "confirm", "control", "crash", "refused", "verify")


class LedgerError(RuntimeError):
    pass


@dataclass
class Row:
    commit: str
    val_bpb: float
    memory_gb: float
    status: str
    description: str
    tag: str
    run_id: str
    time: str
    budget_s: float
    steps: int
    wall_s: float
    fingerprint: str
    seed: int
    protection: str = "none"   # what enforced the rules during training: bwrap (sandbox) or none
    config: str = ""           # the git blob of the train.py it ran (12 hex digits): its configuration
    repeat: int = 1            # this run is the configuration's repeat-th
    mean: float | None = None  # the configuration's mean val_bpb over its finished runs, this one included
    sem: float | None = None   # its standard error, with the tag's pooled noise
    n: int = 0                 # its finished runs
    p_better: float | None = None  # P(it beats the champion), when it was compared with one
    decision: str = ""         # why this status: the rule and its numbers
    clock: str = "wall"        # the budget's clock: wall or cpu (runtime.budget_clock)
    load: float | None = None  # cores other processes kept busy during training (steal included)
    worker: str = ""           # the Ray worker that ran it (cluster.py), empty for `autoresearch run`
    host: str = ""             # the machine it ran on
    device: str = ""           # what it ran on: "cpu x2" (threads), "cuda NVIDIA H200"; a tag never mixes two
    outside_s: float | None = None  # seconds the training ran beyond its budget (startup, export), on its clock
    test_bpb: float | None = None   # the held-out test split's score, where the harness measured it
    flags: str = ""            # what a reader should look at: a test_bpb far worse than val_bpb, identical repeats

    @property
    def key(self) -> str:
        """Its configuration: the train.py blob, or for rows written before `config` existed, the commit."""
        return self.config or self.commit

    def to_line(self, columns: list[str] = COLUMNS) -> str:
        values = asdict(self)
        for k in ("mean", "sem", "p_better", "load", "outside_s", "test_bpb"):
            v = values[k]
            values[k] = "" if v is None else f"{v:.4f}" if k in ("p_better", "load") else \
                f"{v:.1f}" if k == "outside_s" else f"{v:.6f}"
        values["flags"] = " ".join(str(self.flags).split())
        values["val_bpb"] = f"{self.val_bpb:.6f}"
        values["memory_gb"] = f"{self.memory_gb:.1f}"
        values["wall_s"] = f"{self.wall_s:.1f}"
        values["budget_s"] = format_budget(self.budget_s)
        values["description"] = " ".join(str(self.description).split())  # no tabs or newlines
        return "\t".join(str(values[c]).replace("\t", " ") for c in columns) + "\n"

    @classmethod
    def from_line(cls, line: str, columns: list[str] = COLUMNS) -> "Row":
        parts = line.rstrip("\n").split("\t")
        if len(parts) != len(columns):
            raise ValueError(f"{len(parts)} columns, not {len(columns)}")
        if parts[3] not in STATUSES:
            raise ValueError(f"status {parts[3]!r} is not one of {', '.join(STATUSES)}")
        kw = dict(zip(columns, parts))
        for f in fields(cls):
            if f.name not in kw:
                continue  # an older layout: the default
            if f.type in ("float", float, "int", int):
                kw[f.name] = (float if f.type in ("float", float) else int)(kw[f.name])
            elif f.type == "float | None":
                kw[f.name] = float(kw[f.name]) if kw[f.name] else None
        return cls(**kw)


def format_budget(seconds: float) -> str:
    """Exactly: 300 as '300', 299.99999 as '299.99999' (never rounded, so it compares equal when read back)."""
    return str(int(seconds)) if float(seconds) == int(seconds) else repr(float(seconds))


def create(path: Path) -> None:
    """Create results.tsv with its header; an existing valid file is kept as it is (never rewritten)."""
    if path.exists():
        check_header(path)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, HEADER.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def check_header(path: Path, old_ok: bool = False) -> list[str]:
    """The file's columns; an older layout only when old_ok (reading), never for appending."""
    if not path.exists():
        raise LedgerError(f"{path.name} is missing. Run `autoresearch setup --tag TAG` to create it.")
    with open(path, encoding="utf-8") as f:
        first = f.readline()
    if first in EXTENDABLE or (first in OLD_HEADERS and old_ok):
        return first.rstrip("\n").split("\t")
    if first in OLD_HEADERS:
        raise LedgerError(f"{path} was written by autoresearch {OLD_HEADERS[first]}, whose rows this version "
                          f"cannot extend. Move it aside (`mv {path.name} {path.name}.old`; nothing in it is lost) "
                          "and start a new tag with `autoresearch setup --tag TAG`.")
    if first != HEADER:
        raise LedgerError(f"{path} does not start with the expected header. It may be from another tool or "
                          f"version: move it aside (`mv {path.name} {path.name}.old`) and run "
                          "`autoresearch setup --tag TAG` to start a new one.")
    return COLUMNS


def append(path: Path, row: Row) -> None:
    data = row.to_line(check_header(path)).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        # A previous writer killed mid-line (only possible on power loss) would leave no newline: start fresh.
        if os.fstat(fd).st_size and _last_byte(path) != b"\n":
            data = b"\n" + data
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)


def read(path: Path, tag: str | None = None, damaged: list | None = None, old_ok: bool = False,
         verification: bool = False) -> list[Row]:
    """All well-formed rows (of one tag, if given); the file is never rewritten. A verification's rows (status
    `verify`) only when `verification`: every reader of experiments (the rules, the schedule, the proposers, an
    agent's prompt) gets none, so none is ever counted as one. A torn line (fewer columns:
    a write cut short) is skipped and reported in `damaged`. A line with every column but a value that does
    not parse is an error naming its line, unless `damaged` is given (read-only callers such as status):
    skipping it silently could skip a kept result."""
    columns = check_header(path, old_ok)
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        f.readline()
        for n, line in enumerate(f, 2):
            try:
                row = Row.from_line(line, columns)
            except (ValueError, TypeError) as e:
                problem = f"{path.name} line {n} is damaged ({e}): {line.strip()[:80]!r}"
                torn = len(line.rstrip("\n").split("\t")) != len(columns)
                if damaged is None and not torn:
                    raise LedgerError(problem + ". Fix that line by hand (or delete it) and run again; nothing "
                                      "else in the file is changed.") from None
                if damaged is not None:
                    damaged.append(problem + (" (skipped: a torn write)" if torn else " (skipped)"))
                continue
            if (tag is None or row.tag == tag) and (verification or row.status != "verify"):
                rows.append(row)
    return rows


def best(rows: list[Row], fingerprint: str | None = None, budget: float | None = None) -> Row | None:
    """The kept row with the lowest val_bpb, among rows under the same fingerprint and budget."""
    kept = [r for r in rows if r.status == "keep"
            and (fingerprint is None or r.fingerprint == fingerprint[:12])
            and (budget is None or r.budget_s == budget)]
    return min(kept, key=lambda r: r.val_bpb) if kept else None
