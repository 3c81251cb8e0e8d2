"""What is decided about a run before it runs, in one place for both loops: a Study (the tag, its decision rule,
its ledger rows read once) plans each run (Plan: its seed, which run of its configuration it is, its place in
its series, the val_bpb below which its test split is scored, what it is pruned against, when it is
audited). `autoresearch run` (run.run_once) and the parallel driver (driver.Driver.job) both ask Study.plan;
tests/test_schedule.py replays a ledger through both and compares the plans."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autoresearch import decide, fixed, ledger, prune, record, schedule, state, tags
from autoresearch.tagconfig import Tag


@dataclass(frozen=True)
class Plan:
    seed: int
    repeat: int                  # which run of its configuration (1 for the first), counting those in flight
    run_no: int                  # its place in its series
    test_threshold: float | None  # record.test_threshold
    pruning: prune.Reference | None  # a candidate's first run: the base's curves it is stopped against
    audit_at_keep: bool = False  # its causality audit waits for its series' keep (audit_at_keep below)


@dataclass(frozen=True)
class Study:
    repo: Path
    config: Tag
    rule: str
    rows: list[ledger.Row]

    def plan(self, step: schedule.Next, config_id: str, in_flight: Sequence[tuple[str, int]] = (),
             first_seed: int = schedule.FIRST_SEED) -> Plan:
        """The plan of the run `step` (schedule.next_run's) asks for, of configuration `config_id`; in_flight:
        (configuration, seed) of every run in flight beside it (the parallel driver's); first_seed: the first seed
        of a new configuration's runs (`autoresearch run --seed`); a series keeps the seed it began on."""
        first = schedule.series_first(self.rows, config_id, first_seed)
        seed = step.seed if step.seed is not None else schedule.seed(
            self.rows, config_id, [s for c, s in in_flight if c == config_id], self.rule, first)
        return Plan(seed, schedule.repeat_number(self.rows, config_id, [c for c, _ in in_flight]), step.run_no,
                    record.test_threshold(self.rows, self.config, self.rule, step.kind),
                    self.pruning(step.series is None and step.run_no == 1), self.audit_at_keep(step))

    def audit_at_keep(self, step: schedule.Next) -> bool:
        """Whether the run's causality audit (evaluator/probes.py: 4,603 probes, what a run that may be kept gets)
        waits for its series to be kept (run.audit_series) instead of being made when it is scored: a candidate's
        run under a repeating rule once there is a champion, whose series may still end discarded (then no run
        of it needs the audit). A baseline's run, or any run under the naive rule, is kept exactly when it may be
        kept: audited at once, as before. The parallel driver's runs are audited when scored (a worker's export
        stays on its machine)."""
        return (self.rule in decide.REPEATING and step.kind in ("propose", "series")
                and not (step.series is not None and step.series.kind == "baseline")
                and decide.champion(self.rows) is not None)

    def pruning(self, first_run: bool) -> prune.Reference | None:
        """What a candidate's run is checked against to be stopped early (prune.py): only a candidate's first run,
        under a repeating rule, once there is a champion; None: it trains its whole budget."""
        if (self.rule not in decide.REPEATING or not prune.enabled() or not first_run
                or decide.champion(self.rows) is None):
            return None
        return prune.reference(self.rows, self.config.budget_s,
                               prune.log_reader(state.runs_dir(self.repo), state.RUN_LOG), fixed.runtime().STEP_RE,
                               tags.config_of(self.repo, self.config.base_commit))
