"""What runs next, and what is decided about it before it runs: one place for both loops.

What runs next is next_run's answer, a pure function of the ledger and the runs in flight. The sequential loop
(loop.py) is the one-worker case: nothing is in flight when it asks. The parallel driver (driver.py) asks each time
a worker is free, with the configurations its workers are running. In order:
1. an unfinished series (decide.unfinished, oldest first): the baseline's runs go out side by side, up to
   BASELINE_RUNS in all; a candidate's confirmation runs one at a time, so the rule sees its runs in order
   (under the control rule each with a control run of the tag's base beside it, first: control_due). A
   series whose last run was interrupted or refused is resumed only when a new experiment may begin, and counts
   as one: a run refused for a lasting reason would otherwise repeat past --max-experiments, --hours and the
   stop button;
2. no kept run yet: the baseline (again, after a crash), unless it crashed BASELINE_TRIES times, which stops the
   loop (when it would start it again); an interrupted run (a killed harness or worker, decide.is_interruption)
   is not the baseline's failure;
3. a new proposal, once the baseline's series is complete, if the loop may begin another experiment
   (--max-experiments, --hours and the stop button say).

What is decided about a run before it runs, and after: a Study (the tag, its decision rule, its ledger rows read
once) plans each run (Plan: its seed, which run of its configuration it is, its place in its series, the val_bpb
below which its test split is scored, what it is pruned against, when it is audited), refuses a train.py that
ran before (rerun_problem), and judges the finished run (judge: its row, its status by decide.py's rules).
`autoresearch run` (run.run_once) and the parallel driver (driver.Driver) both ask the Study;
tests/test_schedule.py replays a ledger through both and compares the plans."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from statistics import fmean

from autoresearch import baseline, decide, descriptions, execute, fixed, ledger, record, state, tags
from autoresearch.tagconfig import Tag

BASELINE_TRIES = 3   # crashes of the baseline before the loop stops and says so
FIRST_SEED = 42      # the public project's seed: every configuration's first run (seed(), paired seeds)


@dataclass(frozen=True)
class Next:
    kind: str              # series (the next run of an unfinished series), control (the tag's base beside a
                           # series' candidate, the control rule), baseline, propose, wait or stop
    description: str = ""
    commit: str = ""       # a series' commit; "" for the baseline (the branch's head) and proposals
    run_no: int = 1        # its place in its series
    new: bool = False      # it begins a new experiment (counted by --max-experiments)
    reason: str = ""       # kind stop: why
    series: decide.Series | None = None  # kind series and control: the series it continues
    seed: int | None = None  # kind control: the seed of the pair it belongs to (else study.seed picks)


def baseline_crashes(rows) -> int:
    """How many times the baseline itself crashed (its interruptions do not count)."""
    return sum(descriptions.is_baseline(r.description) and r.status == "crash" and not decide.is_interruption(r)
               for r in rows)


def next_run(rows, running: list[str], rule: str, may_begin: bool, baseline_config: str) -> Next:
    """The next run for a free worker. rows: the tag's ledger rows; running: the series of every run in flight
    (its configuration, a control's candidate's: in_flight; empty for the sequential loop); may_begin: whether
    a new experiment may start; baseline_config: the configuration of train.py on the branch's head (the
    baseline while nothing is kept)."""
    for series in decide.unfinished(rows):
        busy = running.count(series.config)
        resume = stalled(rows, series.config)
        if resume and not may_begin:
            continue
        if series.kind == "baseline" and series.runs + busy < decide.BASELINE_RUNS:
            return _repeat(series, series.runs + busy + 1, resume)
        if series.kind == "candidate" and not busy:
            return (rule == "control" and control_due(rows, series, resume)) or _repeat(series, series.runs + 1, resume)
    if not any(r.status == "keep" for r in rows):
        tries = baseline_crashes(rows)
        if tries >= BASELINE_TRIES:
            return Next("wait") if running or not may_begin else Next("stop", reason=(
                f"the baseline crashed {tries} times (see the log tails above and `autoresearch status`): fix "
                "train.py on the branch's base commit, or the machine, then run the loop again"))
        busy = running.count(baseline_config)
        if busy >= (decide.BASELINE_RUNS if rule in decide.REPEATING else 1) or (busy == 0 and not may_begin):
            return Next("wait")
        description = descriptions.baseline(tries)
        return Next("baseline", descriptions.repeated(description, busy + 1) if busy else description, run_no=busy + 1,
                    new=busy == 0)
    if any(s.kind == "baseline" for s in decide.unfinished(rows)):
        return Next("wait")  # its last runs are in flight: candidates wait for the champion's mean
    return Next("propose", new=True) if may_begin else Next("wait")


def in_flight(config: str, description: str) -> str:
    """The series a run in flight holds (what next_run's `running` lists): a control's candidate's, else its
    configuration's."""
    return descriptions.control_of(description) or config


def control_due(rows, series: decide.Series, resume: bool) -> Next | None:
    """Under the control rule, the control run due beside a surviving candidate, or None when the candidate's own
    next run is due. A control is a run of the tag's base train.py (the baseline's: no agent wrote it, so no
    agent's code decides how it does), on the candidate's seed, right beside the candidate's run: the candidate's
    first run is screened alone (decide.rule), so its control follows it; every later pair runs its control
    first, so the candidate's run completes the pair and its row carries the verdict."""
    base = baseline.base_row(rows)
    done = baseline.controlled_seeds(rows, series.config, base.key)
    mine = sorted({r.seed for r in decide.finished(rows) if r.key == series.config})
    missing = [s for s in mine if s not in done]
    due = missing[0] if missing else seed(rows, series.config, [], "control", first=series_first(rows, series.config))
    if due in done:
        return None
    return Next("control", descriptions.control(series.config, series.description), base.commit,
                series.runs + 1, new=resume, series=series, seed=due)


def series_first(rows, config: str, default: int = FIRST_SEED) -> int:
    """The seed a configuration's series began on (its lowest finished run's), so that its later runs and their
    controls follow it whatever --seed a later command gives; `default` for a configuration with none."""
    return min((r.seed for r in decide.finished(rows) if r.key == config), default=default)


def stalled(rows, config: str) -> bool:
    """Whether a series' last run ended without a result of its own: interrupted (a killed harness, driver or
    worker) or refused."""
    last = [r for r in rows if decide.series_key(r) == config]
    return bool(last) and (last[-1].status == "refused" or decide.is_interruption(last[-1]))


def _repeat(series: decide.Series, run_no: int, resume: bool) -> Next:
    return Next("series", descriptions.repeated(series.description, run_no), series.commit, run_no, new=resume,
                series=series)


def seed(rows, config: str, in_flight: list[int], rule: str, first: int = FIRST_SEED) -> int:
    """The seed of the next run of configuration `config` (the harness passes it as runtime.SEED_ENV, and refuses
    a result with another). Under the stat rule: the lowest seed from `first` up that none of the configuration's
    finished runs and none of its runs in flight (in_flight: their seeds) has. So a configuration's k-th run
    gets first + k - 1, its runs never share a seed, and its k-th run meets the champion's k-th on the same seed,
    so that shared seed effects cancel in the comparison (decide.compare); a run that ended with no result
    (crashed, interrupted, refused) leaves its seed to the next. The naive rule keeps the one seed, like the
    public project."""
    if rule not in decide.REPEATING:
        return first
    taken = {r.seed for r in decide.finished(rows) if r.key == config} | set(in_flight)
    return next(s for s in range(first, first + len(taken) + 1) if s not in taken)


def repeat_number(rows, config: str, running: list[str]) -> int:
    """Which run of its configuration this is (1 for the first), counting those in flight."""
    return sum(r.config == config for r in rows if r.status not in ("refused", "verify")) + running.count(config) + 1


@dataclass(frozen=True)
class Plan:
    seed: int
    repeat: int                  # which run of its configuration (1 for the first), counting those in flight
    run_no: int                  # its place in its series
    test_threshold: float | None  # Study.test_threshold
    pruning: baseline.Reference | None  # a candidate's first run: the base's curves it is stopped against
    audit_at_keep: bool = False  # its causality audit waits for its series' keep (audit_at_keep below)


@dataclass(frozen=True)
class Study:
    """A tag's experiments as its ledger rows say, read once: what the loops ask of them before a run (plan,
    rerun_problem) and after it (judge). Its answers about the rows (champion, best, samples, noise) are computed
    once; a new row makes a new Study."""
    repo: Path
    config: Tag
    rule: str
    rows: list[ledger.Row]

    @cached_property
    def champion(self) -> ledger.Row | None:
        return decide.champion(self.rows)

    @cached_property
    def best(self) -> ledger.Row | None:
        """The best single kept run (the naive rule's bar), under the tag's fingerprint and budget."""
        return ledger.best(self.rows, self.config.fingerprint, self.config.budget_s)

    @cached_property
    def samples(self) -> dict[str, list[float]]:
        return decide.samples(self.rows)

    @cached_property
    def noise(self) -> decide.Noise | None:
        return decide.pooled_noise(self.samples)

    def plan(self, step: Next, config_id: str, in_flight: Sequence[tuple[str, int]] = (),
             first_seed: int = FIRST_SEED) -> Plan:
        """The plan of the run `step` (next_run's) asks for, of configuration `config_id`; in_flight:
        (configuration, seed) of every run in flight beside it (the parallel driver's); first_seed: the first seed
        of a new configuration's runs (`autoresearch run --seed`); a series keeps the seed it began on."""
        first = series_first(self.rows, config_id, first_seed)
        chosen = step.seed if step.seed is not None else seed(
            self.rows, config_id, [s for c, s in in_flight if c == config_id], self.rule, first)
        return Plan(chosen, repeat_number(self.rows, config_id, [c for c, _ in in_flight]), step.run_no,
                    self.test_threshold(step.kind), self.pruning(step.series is None and step.run_no == 1),
                    self.audit_at_keep(step))

    def test_threshold(self, kind: str = "") -> float | None:
        """The val_bpb below which a run may be a new best, so the held-out test split is scored (and the deep
        audit made) for it: the best single run (naive) or the champion's mean (stat). kind: the schedule's kind
        of the run (Next.kind). Under the control rule a survivor's run may be kept above the champion's mean
        (its pairs decide), so every such run is scored (None); a control (the tag's base, which no agent wrote)
        never is."""
        if self.rule == "control" and kind in ("series", "control"):
            return float("-inf") if kind == "control" else None
        values = self.samples.get(self.champion.key, []) if self.champion else []
        if self.rule in decide.REPEATING and values:
            return fmean(values)
        return self.best.val_bpb if self.best else None

    def rerun_problem(self, config_id: str) -> str | None:
        """Why train.py as it is may not start a new experiment, or None: it ran before in this tag (the
        champion's, or any configuration with a result, a crash, a pruning or a refusal after it trained). A
        repeat of the champion would join its runs: an agent's train.py that does worse when run again (on a
        given hour, say) raised the champion's mean at will, and a later no-op was kept every time (a red-team
        simulation, 4 repeats). A resubmission of any other would redraw a run that train.py ended on purpose (a
        crash, a refusal, after it saw its training go badly), on its seed, against the same controls. An
        interrupted run is no result: its configuration may run again; so may the baseline, before it is kept.
        Both loops ask here, under the rules that decide on means (the naive rule's bar is the best single run:
        a repeat there can only raise it)."""
        champ = self.champion
        if champ is None:  # the baseline, again after a crash: the user's train.py, no agent's
            return None
        if champ.key == config_id:
            return (f"{state.EDITABLE} is the champion's (commit {champ.commit}): nothing changed. Edit it to try "
                    "something, and run again")
        ran = [r for r in self.rows if r.key == config_id and (
            r.status in ("keep", "discard", "confirm", "pruned")
            or (r.status == "crash" and not decide.is_interruption(r))
            or (r.status == "refused" and r.decision == decide.REFUSED_CLOSES))]
        if ran:
            return (f"{state.EDITABLE} as it is ran before in this tag (run {ran[-1].run_id}, {ran[-1].status}, "
                    f"commit {ran[-1].commit}): its result stands. Edit it to try something new, and run again")
        return None

    def judge(self, ex, series: decide.Series | None, trial: record.Trial) -> tuple:
        """(ex, its row) for the finished run `trial` (an execute.Execution) against the rows before it; what the
        run reported may break the row: then it is its crash, never an interruption (execute.py)."""
        try:
            return ex, self.row(ex, series, trial)
        except Exception as e:
            ex = replace(ex, status="crash", reason=f"its result could not be recorded ({type(e).__name__})")
            return ex, self.row(ex, series, trial)

    def row(self, ex, series: decide.Series | None, ran: record.Trial) -> ledger.Row:
        """The ledger row of a finished execution (an execute.Execution), judged against the rows before it."""
        config = self.config
        common = dict(load=ex.training.load, wall=ex.training.wall,
                      outside_s=execute.outside_seconds(config, ex.training) if ex.training.wall else None)
        if ex.status == "refused":  # after it trained: train.py broke a rule. Its series ends there, and it may
            # not run again as a new experiment (rerun_problem): a run refused on demand, after train.py saw how
            # its training went, would otherwise be redrawn on its seed. A control refused after it trained ends
            # its candidate's series too: redrawn, its seed would be drawn again until the pair suits the
            # candidate. Refused before it trained: no result; it may run.
            trained = bool(ex.training.wall)
            return ran.row(config, "refused", descriptions.noted(ran.description, descriptions.REFUSED, ex.reason),
                           decision=decide.REFUSED_CLOSES if trained else "", **common)
        if ex.status == "pruned":
            return ran.row(config, "pruned", decision=ex.reason, **common)
        if ex.status == "crash":
            return ran.row(config, "crash", descriptions.noted(ran.description, descriptions.CRASH, ex.reason),
                           decision=("crashed during its confirmation: discarded"
                                     if series is not None and series.kind == "candidate" else ""), **common)
        val_bpb = ex.evaluation["val_bpb"]
        if descriptions.control_of(ran.description):  # the base beside a candidate: evidence, never a verdict
            status, stats = "control", self.control_stats(ran.config, ran.seed)
        else:
            status, stats = self.verdict(series, (ran.config, ran.seed, val_bpb), ex.training.load)
        test_bpb = ex.evaluation.get("test_bpb")
        flags = [decide.identical_flag(self.rows, ran.config, val_bpb, ran.seed)]
        if status == "keep":
            flags.append(decide.test_gap_flag(self.rows, val_bpb, test_bpb, self.noise))
        return ran.row(config, status, val_bpb=val_bpb, memory_gb=ex.result["memory_gb"],
                       steps=ex.result["num_steps"], test_bpb=test_bpb, flags="; ".join(f for f in flags if f),
                       **stats, **common)

    def verdict(self, series: decide.Series | None, run: tuple[str, int, float],
                load: float | None = None) -> tuple[str, dict]:
        """The status of a finished run, run = (its configuration, seed, val_bpb), and the statistics its row
        carries (decide.py). load: the cores others kept busy during its training (the control rule's pairs
        need it)."""
        config_id, seed_, val_bpb = run
        champ_row = self.champion
        values = {k: list(v) for k, v in self.samples.items()}
        values[config_id] = values.get(config_id, []) + [val_bpb]
        mine = values[config_id]
        noise = decide.pooled_noise(values)
        stats = {"mean": fmean(mine), "n": len(mine), "sem": decide.sem(mine, noise) if noise else None}
        if self.rule == "naive":
            best_before = self.best.val_bpb if self.best else None
            better = best_before is None or val_bpb < best_before
            return ("keep" if better else "discard"), dict(stats, decision="naive: " + (
                "first run" if best_before is None
                else f"{'below' if better else 'not below'} the best {best_before:.6f}"))
        if champ_row is None or (series is not None and series.kind == "baseline"):
            return "keep", dict(stats, decision=f"baseline {len(mine)}/{decide.BASELINE_RUNS}")
        if config_id == champ_row.key:
            return "keep", dict(stats, decision="a repeat of the champion")
        comparison = decide.compare(decide.seeded(self.rows) + [run], config_id, champ_row.key)
        if self.rule == "control" and len(mine) >= 2:  # past the screen: only the pairs beside the base's controls
            base = baseline.base_row(self.rows).key
            tilted = baseline.tilted(self.rows, config_id, base, (seed_, load))
            if tilted:
                return "discard", dict(stats, decision=tilted)
            beside = baseline.in_time(baseline.control_diffs(self.rows, base, run), config_id, noise,
                                     None if champ_row.key == base else champ_row.key)
            if beside is None:  # no pair yet (never the stat comparison: that is what drift fools)
                status = "discard" if len(mine) >= decide.MAX_RUNS else "confirm"
                return status, dict(stats, decision=f"no pairs beside controls after {len(mine)} runs"
                                    + (": undecided" if status == "discard" else ""))
            comparison = beside
        verdict = decide.rule(len(mine), comparison)
        return verdict.status, dict(stats, p_better=verdict.p, decision=verdict.reason)

    def control_stats(self, config_id: str, seed_: int) -> dict:
        """A control run's statistics: its configuration's (the tag's base) over its own runs, which controls
        never join (a second run on a seed the base already ran would shrink the noise estimate;
        decide.finished)."""
        mine = self.samples.get(config_id, [])
        return dict(mean=fmean(mine) if mine else None, n=len(mine),
                    sem=decide.sem(mine, self.noise) if self.noise and mine else None,
                    decision=f"control on seed {seed_}")

    def audit_at_keep(self, step: Next) -> bool:
        """Whether the run's causality audit (evaluator/probes.py: 4,603 probes, what a run that may be kept gets)
        waits for its series to be kept (audit.series) instead of being made when it is scored: a candidate's
        run under a repeating rule once there is a champion, whose series may still end discarded (then no run
        of it needs the audit). A baseline's run, or any run under the naive rule, is kept exactly when it may be
        kept: audited at once, as before. The parallel driver's runs are audited when scored (a worker's export
        stays on its machine)."""
        return (self.rule in decide.REPEATING and step.kind in ("propose", "series")
                and not (step.series is not None and step.series.kind == "baseline")
                and self.champion is not None)

    def pruning(self, first_run: bool) -> baseline.Reference | None:
        """What a candidate's run is checked against to be stopped early (baseline.py): only a candidate's first run,
        under a repeating rule, once there is a champion; None: it trains its whole budget."""
        if (self.rule not in decide.REPEATING or not baseline.enabled() or not first_run
                or self.champion is None):
            return None
        return baseline.reference(self.rows, self.config.budget_s,
                               baseline.log_reader(state.runs_dir(self.repo), state.RUN_LOG), fixed.runtime().STEP_RE,
                               tags.config_of(self.repo, self.config.base_commit))
