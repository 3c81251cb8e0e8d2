"""A tag's record, typed: what `autoresearch setup` pins in .autoresearch/tags/<tag>.json, with the one default
of every field for tags written before it existed. Read it with `read`; write it with `to_json`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from autoresearch import heldout
from autoresearch import scratch as scratch_
from autoresearch.errors import HarnessError

MAX_TRAIN_BYTES = 100_000  # a train.py larger than this is refused (the tag records its own): the default is
#                            ~25 KB, and a file of many times that is data (embedded text to train on), not code
OLD_ALLOWANCE = 30.0       # a tag from before allowances were recorded had a fixed 30 s on the cpu profile
DEFAULT_RULE = "stat"      # the decision rule of a tag that names none (decide.RULES)
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
    timeout_s: float | None = None    # the hard timeout (None: tags.default_timeout)
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
