"""A tag's record, typed: what `autoresearch setup` pins in .autoresearch/tags/<tag>.json, with the one default
of every field for tags written before it existed. Read it with `read`; write it with `to_json`."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from autoresearch import cgroups, heldout
from autoresearch import scratch as scratch_
from autoresearch.errors import HarnessError

MAX_TRAIN_BYTES = 100_000  # a train.py larger than this is refused (the tag records its own): the default is
#                            ~25 KB, and a file of many times that is data (embedded text to train on), not code
OLD_ALLOWANCE = 30.0       # a tag from before allowances were recorded had a fixed 30 s on the cpu profile
DEFAULT_RULE = "stat"      # the decision rule of a tag that names none (decide.RULES)
TIMEOUT_MARGIN = 120      # seconds on top of twice the budget, for startup, compilation and export
REQUIRED = ("tag", "branch", "fingerprint", "budget_s", "base_commit")


@dataclass(frozen=True)
class Tag:
    tag: str
    branch: str
    fingerprint: str                  # the fixed half's (fixed.fingerprint) at setup
    budget_s: float
    base_commit: str                  # the baseline: what the fixed files and train.py's base are read from
    clock: str = "wall"               # the budget's clock: wall or cpu (tags from before the cpu clock: wall)
    fixed_sha256: dict | None = None  # sha256 of each fixed file at the base commit (fixed.clean_sources)
    prepare_sha256: str | None = None  # a tag from before runtime.py: prepare.py's alone
    hardware: dict | None = None      # machine.hardware() at setup; None: a tag from before, taken as this machine
    created: str = ""
    # the rules pinned at setup; None: a tag from before pins, whose runs choose their own
    protection: str | None = None     # bwrap or none
    decision: str | None = None       # stat or naive
    timeout_s: float | None = None    # the hard timeout (None: default_timeout)
    allowance_s: float = OLD_ALLOWANCE  # seconds allowed outside the budget (startup, export)
    max_train_bytes: int = MAX_TRAIN_BYTES
    max_carried_bytes: int = heldout.LIMIT_BYTES  # what train.py may carry beyond its base, compressed
    draw_id: str | None = None        # the name of the tag's secret draw of scored rows (None: a tag from before)
    compile_cache: str = "champion"   # champion or off (compiled.py)
    threads: int | None = None        # threads per run (parallel workers); None: the machine's cores
    peak_flops: dict | None = None    # the machine's peak FLOP/s per dtype, measured at setup
    accounting: str | None = None     # each run's cgroup (cgroups.py): cgroup v1, cgroup v2 or none; None: a tag
                                      # from before, whose runs get one where it can be made
    scratch: str | None = None        # out/ and the compile copy (scratch.py): tmpfs or disk; None: a tag from before
    out_limit_bytes: int = scratch_.OUT_LIMIT  # what out/ may hold
    draw: int | None = None           # the draw itself, only in a parallel worker's copy (never written)

    @classmethod
    def from_json(cls, data: dict) -> "Tag":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None and k != "draw"}

    def rule(self, asked: str | None = None) -> str:
        """The decision rule a run of this tag is judged by: the one asked for, else the tag's (pin_problems
        refuses another), else the default for tags from before pins."""
        return asked or self.decision or DEFAULT_RULE

    def sandbox_mode(self) -> str:
        """The --sandbox a run of this tag gets when it names none: the tag's (auto for tags from before pins)."""
        return {"bwrap": "auto", "none": "off"}.get(self.protection, "auto")

    def threads_per_run(self) -> int:
        """Threads every run of the tag trains with: set at setup (parallel workers: each its share of the cores),
        else the cores of the machine the tag was set up on."""
        from autoresearch import machine
        return int(self.threads or (self.hardware or {}).get("cores") or machine.hardware()["cores"])

    def device_label(self, hw: dict | None = None) -> str:
        """What a row ran on, for its `device` column: the accelerator's name, or the CPU and its thread count."""
        from autoresearch import machine
        hw = hw or self.hardware or machine.hardware()
        return f"{hw['device']} {hw['name']}" if hw["device"] == "cuda" else f"{hw['device']} x{self.threads_per_run()}"

    def pin_problems(self, protection: str, rule: str, timeout: float | None) -> list[str]:
        """Where a run asks for weaker settings than its tag pinned at setup (tags from before pins: none)."""
        problems = []
        pinned = self.protection
        if pinned == "bwrap" and protection != "bwrap":
            problems.append("this tag was set up with the bubblewrap sandbox, and this run asked for none "
                            "(--sandbox off, or bubblewrap no longer works here)")
        if self.decision and rule != self.decision:
            problems.append(f"this tag decides by the {self.decision} rule, and this run asked for {rule}")
        if timeout is not None and self.timeout_s and timeout > self.timeout_s:
            problems.append(f"this tag's timeout is {self.timeout_s:g} s, and this run asked for {timeout:g} s")
        problems += self.boundary_problems()
        raw = os.environ.get("AUTORESEARCH_OUTSIDE_ALLOWANCE")
        if raw and float_or_none(raw) != self.allowance_s:
            problems.append(f"this tag allows {self.allowance_s:g} s outside the budget, and "
                            f"AUTORESEARCH_OUTSIDE_ALLOWANCE asks for {raw}")
        return problems

    def boundary_problems(self) -> list[str]:
        """Where this machine cannot now build a run's boundary as the tag recorded it at setup: its runs are refused,
        never run with less (issue 50)."""
        problems = []
        if self.accounting not in (None, "none"):
            got = cgroups.available()
            if got != self.accounting:
                problems.append(f"this tag's runs are measured and bounded in a {self.accounting} of their own, and "
                                f"none can be made now ({cgroups.make('probe')[1]}): run as the user who set the tag "
                                "up (root, for cgroup v1), or set up a new tag here")
        if self.scratch == "tmpfs" and not scratch_.can_mount():
            problems.append("this tag's runs write out/ on a tmpfs of its size, and only root may mount one: run as "
                            "root, or set up a new tag as this user (out/ then lies on the disk: docs/integrity.md)")
        return problems


def read(path: Path) -> Tag:
    """The tag recorded at path; a damaged record is a clear error."""
    try:
        data = json.loads(path.read_text())
        missing = [k for k in REQUIRED if k not in data]
        missing += [] if "fixed_sha256" in data or "prepare_sha256" in data else ["fixed_sha256"]
    except (OSError, ValueError, TypeError) as e:
        data, missing = None, [f"readable JSON ({e})"]
    if missing:
        raise HarnessError(f"{path} is damaged (no {', '.join(missing)}). Restore it from a backup, or start a new "
                           "tag with `autoresearch setup --tag NEWTAG` (results.tsv keeps every row).")
    return Tag.from_json(data)


def default_timeout(budget: float, clock: str) -> float:
    """The hard timeout: twice the budget plus a margin (four times on the cpu clock, where a busy machine
    stretches the budget's wall time)."""
    return (2 if clock == "wall" else 4) * budget + TIMEOUT_MARGIN


def float_or_none(raw: str) -> float | None:
    try:
        return float(raw)
    except ValueError:
        return None
