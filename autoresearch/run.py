"""`autoresearch run`: one experiment, end to end: check, commit, train under a hard timeout, record, keep or
discard.

run_once does one run: the next run of an unfinished series if there is one (study.py), else train.py as the
agent left it, as a new candidate. run_series runs an experiment to its decision: its first run, then the
repeats the rule asks for (decide.py). Every run is one ledger row, and what series is open is read from the
ledger alone, so a kill between any two runs loses nothing (record.py finishes a run killed midway).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

from autoresearch import (audit, compiled, decide, descriptions, execute, fixed, git, heldout, ledger, machine,
                          record, sandbox, state, study, supervise, tags, untrusted)
from autoresearch.errors import HarnessError, MachineBusy, Refused
from autoresearch.tagconfig import Tag

EDITABLE = state.EDITABLE


@dataclass
class Outcome:
    row: ledger.Row
    best_before: float | None
    log_tail: str
    run_dir: Path
    result: dict | None
    evaluation: dict


@dataclass
class Options:
    """How a run is run. rule, sandbox_mode and timeout default to the tag's (None); weaker ones are refused."""
    rule: str | None = None
    sandbox_mode: str | None = None
    timeout: float | None = None
    seed: int = study.FIRST_SEED     # the first seed of a new configuration's runs
    on_progress: Callable | None = None  # on_progress(elapsed, step_line) while it trains
    log: Callable = print
    give_up: Callable | None = None      # give_up() -> True: stop waiting for a quiet machine


def run_once(repo: Path, description: str, options: Options = Options()) -> Outcome:
    """One run. Under the stat rule it is the next run of the open series if there is one (the baseline's
    repeats, a candidate's confirmation), else a new candidate: train.py as the agent left it."""
    log = options.log
    config, protection, rule = begin(repo, options)
    untrusted.work_tree_source(repo)  # a plain file of bounded size, before git hashes it
    rows = ledger.read(state.results(repo), config.tag)
    step = study.next_run(rows, [], rule, True, "")
    series = step.series  # None: this run is a new candidate
    description = resume(repo, step, log) if series is not None else descriptions.clean(description)
    # the configuration about to run is planned: git's name for train.py as it will be committed (line-ending
    # conversion and filters applied, as tags.config_of will see it)
    planned = planned_config(repo)
    the_study = study.Study(repo, config, rule, rows)
    plan = the_study.plan(step, planned, first_seed=options.seed)
    trial = record.Trial(state.new_run_id(), config.tag, git.head(repo), description, seed=plan.seed,
                         run_no=plan.run_no, test_threshold=plan.test_threshold,
                         audit_at_keep=plan.audit_at_keep, protection=protection,
                         host=socket.gethostname(), device=config.device_label(), started=state.now())

    def refuse(reason: str) -> NoReturn:
        ledger.append(state.results(repo), trial.row(config, "refused", descriptions.noted(
            description, descriptions.REFUSED, reason)))
        raise Refused(f"Refused: {reason}")

    changed = git.changed_files(repo)
    problem = admission(repo, config, protection, rule, options.timeout, changed) or (
        the_study.rerun_problem(planned) if series is None and rule in decide.REPEATING else None)
    if problem:
        refuse(problem)
    fixed_half = fixed.of_tag(repo, config)
    try:
        base = compiled.watched(repo, protection, lambda: compile_base(repo, config, fixed_half, protection, log))
    except compiled.Tampered as e:
        refuse(str(e))
    if config.clock == "wall":  # a competing process would be measured, not train.py (machine.py)
        wait_until_quiet(repo, log, options.give_up)

    pending = start(repo, trial, plan.repeat, EDITABLE in changed)
    run_dir = state.run_dir(repo, trial.run_id)
    ctx = execute.Context(repo, config, protection, fixed_half)
    ex = execute.execute(ctx, execute.Attempt(
        run_dir, pending, timeout=options.timeout, compile_base=base, on_progress=options.on_progress,
        prune=getattr(plan.pruning, "check", None)))
    if base is not None:
        supervise.append_line(run_dir / state.RUN_LOG, compiled.note(base))
    ex, row = tell(the_study, ctx, ex, series, pending, log)
    pending.path.unlink()
    return Outcome(row=row, best_before=the_study.best.val_bpb if the_study.best else None,
                   log_tail=state.tail(run_dir / state.RUN_LOG), run_dir=run_dir, result=ex.result,
                   evaluation=ex.evaluation)


def tell(the_study: study.Study, ctx: execute.Context, ex: execute.Execution, series, pending: record.Pending,
         log) -> tuple[execute.Execution, ledger.Row]:
    """A finished run's row, judged (and its series audited, when it keeps: audit.series), recorded, the branch
    put back unless it kept or confirms, and the models no longer vouched for dropped."""
    repo, config, rows = ctx.repo, ctx.config, the_study.rows
    run_dir = state.run_dir(repo, pending.trial.run_id)
    ex, row = the_study.judge(ex, series, pending.trial)
    if row.status == "keep" and pending.trial.audit_at_keep:
        problem = audit.series(ctx, audit.owed(repo, rows, pending.trial.config) + (
            [(run_dir, (ex.evaluation["val_bpb"], ex.evaluation["test_bpb"]))]
            if ex.evaluation.get("test_bpb") is not None and not ex.evaluation.get("audited") else []), pending, log)
        if problem:  # the keep refused, its series ended (study.Study.row)
            ex, row = the_study.judge(replace(ex, status="refused", reason=problem), series, pending.trial)
    record.record(repo, row, run_dir)
    if row.status not in ("keep", "confirm"):
        git.reset_to(repo, tags.last_kept_commit(repo, config, rows), EDITABLE)
        state.fault_point("reset")
        # a confirmation's model waits for its series' end (it may owe an audit at the keep); a series that
        # ended without one drops them all
        ended = not any(s.config == pending.trial.config for s in decide.unfinished(rows + [row]))
        for done in series_dirs(repo, rows, pending.trial.config, run_dir) if ended else [run_dir]:
            record.drop_model(done)
    return ex, row


def series_dirs(repo: Path, rows: list[ledger.Row], config_id: str, run_dir: Path) -> list[Path]:
    """The run directories of a configuration's confirmations (its series' runs before the one that decides it)
    and of the run `run_dir`: the runs a keep vouches for."""
    return [state.run_dir(repo, r.run_id) for r in rows
            if r.status == "confirm" and r.config == config_id and r.run_id] + [run_dir]


def begin(repo: Path, options: Options) -> tuple[Tag, str, str]:
    """The tag, the protection and the rule a run gets, once the fixed half is checked and anything a dead
    harness left is finished (record.py)."""
    config = tags.load_tag(repo)
    fixed.check_contract()
    record.recover(repo, options.log)
    try:
        protection = sandbox.protection(options.sandbox_mode or config.sandbox_mode())
    except sandbox.SandboxError as e:
        raise HarnessError(str(e)) from None
    return config, protection, config.rule(options.rule)


def start(repo: Path, trial: record.Trial, repeat: int, commit_it: bool) -> record.Pending:
    """The run begins: from here on a kill at any moment is recovered. Its record first (pending.json), then its
    directory and the commit of train.py (commit_it: the work tree's changed it), then the record again."""
    pending = record.Pending(state.pending_file(repo), trial)
    pending.write()
    state.fault_point("pending-written")
    state.run_dir(repo, trial.run_id).mkdir(parents=True)
    commit = git.commit_file(repo, EDITABLE, trial.description) if commit_it else git.head(repo)
    state.fault_point("committed")
    pending.trial = replace(trial, commit=commit, config=tags.config_of(repo, commit), repeat=repeat)
    pending.write()
    return pending


def resume(repo: Path, step: study.Next, log) -> str:
    """The open series' next run checked out (its candidate's commit, or under the control rule the tag's base
    for a control beside it; a harness killed during the last run left the series open), and that run's
    description."""
    series = step.series
    if EDITABLE in git.changed_files(repo):
        raise HarnessError(
            f"The {series.kind} series of {series.commit} ({series.description!r}) is unfinished: "
            f"{series.runs} run(s) so far, a harness was killed during the next. It must finish before "
            f"another change runs. Set your edit aside and finish it: `git stash && autoresearch run -m "
            f"resume && git stash pop`.")
    if git.head(repo)[:7] != step.commit[:7]:
        git.reset_to(repo, git.git(repo, "rev-parse", step.commit), EDITABLE)
    if step.kind == "control":
        log(f"control: the base {step.commit} on seed {step.seed}, beside candidate {series.commit}")
    else:
        log(f"{series.kind} {series.commit}: run {series.runs + 1}")
    return step.description


def wait_until_quiet(repo: Path, log, give_up) -> None:
    """Wait for a machine quiet enough to measure train.py, not a competing process (machine.py); `status`
    and the dashboard show the wait (state.waiting_file)."""
    waiting = state.waiting_file(repo)
    try:
        machine.wait_until_quiet(
            log, on_wait=lambda text: state.atomic_json(waiting, {"since": state.now(), "text": text}),
            give_up=give_up)
    except machine.Busy as e:
        raise MachineBusy(str(e)) from None
    finally:
        waiting.unlink(missing_ok=True)


def admission(repo: Path, config: Tag, protection: str, rule: str, timeout: float | None,
              changed: list[str]) -> str | None:
    """Why a run may not start, or None: weaker settings than the tag's pins, files other than train.py
    changed, a train.py over the tag's size limit, or a machine or fixed half unlike the tag's (preflight)."""
    pins = config.pin_problems(protection, rule, timeout)
    if pins:
        return ("; ".join(pins) + ". A tag's rules are fixed at setup: run without those options, or set up a new "
                "tag with the settings you want")
    others = [p for p in changed if p != EDITABLE]
    if others:
        return (f"files other than {EDITABLE} changed ({', '.join(others[:5])}); only {EDITABLE} may be edited. "
                f"Undo them (`git checkout -- FILE`, or delete new files) and run again")
    base = git.git(repo, "show", f"{config.base_commit}:{EDITABLE}", strip=False).encode()
    problem = train_py_problem(untrusted.work_tree_source(repo), config, base)
    if problem:
        return problem
    return tags.preflight(repo, config)


def train_py_problem(raw: bytes, config: Tag, base: bytes) -> str | None:
    """Why this train.py may not run under this tag, or None: not UTF-8 text, over the tag's size limit, or
    carrying more than the tag's limit beyond its base (heldout.py). Both loops ask here."""
    return source_problem(raw) or heldout.problem(raw, config, base)


def source_problem(raw: bytes) -> str | None:
    """Why train.py's bytes cannot be a run's source, or None: every reader (both loops, the agents' prompt, the
    built-in researcher, git's diffs) takes it as UTF-8 text."""
    nul = raw.find(b"\0")
    if nul >= 0:
        return f"{EDITABLE} holds a NUL byte at offset {nul}: it must be UTF-8 text. Remove it"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return (f"{EDITABLE} is not UTF-8 (byte {raw[e.start]:#04x} at offset {e.start}): save it as UTF-8 "
                "(and drop any `coding:` line) and run again")
    return None


def run_series(repo: Path, description: str, options: Options = Options(), on_outcome=None) -> list[Outcome]:
    """One experiment under the decision rule (the tag's by default): its first run, then (stat) the repeats its
    series needs, each recorded as it ends. An open series left by a killed harness is finished first (see
    run_once)."""
    if options.rule is not None and options.rule not in decide.RULES:
        raise HarnessError(f"--decision {options.rule!r}: use stat (repeats until the rule is sure, the default), control "
                           "(stat, its repeats each beside a run of the champion) or naive (one run, kept when below "
                           "the best single run: the public project's rule).")
    outcomes = []
    while True:
        outcome = run_once(repo, description, options)
        outcomes.append(outcome)
        if on_outcome:
            on_outcome(outcome)
        if outcome.row.status in ("crash", "refused"):
            break
        if decide.latest_unfinished(ledger.read(state.results(repo), outcome.row.tag)) is None:
            break
    return outcomes


def planned_config(repo: Path) -> str:
    """The configuration train.py as it is now will have once committed (line-ending conversion and filters
    applied, as tags.config_of will see it)."""
    return git.git(repo, "hash-object", "--path", EDITABLE, EDITABLE, check=False)[:12]


def compile_base(repo: Path, config: Tag, fixed_half: fixed.FixedHalf, protection: str, log=print) -> Path | None:
    """The compile cache the run of train.py as it is now starts from: its configuration's base for this tag's
    threads per run (compiled.key), filled by a compile phase the first time, from a copy of the tag's base
    configuration's (never a champion's: compiled.Wanted); None when the tag was set up with
    AUTORESEARCH_COMPILE_CACHE=off."""
    if config.compile_cache == "off":
        return None
    wanted = compiled.Wanted(planned_config(repo), (repo / EDITABLE).read_text(),
                             tags.config_of(repo, config.base_commit))
    return compiled.ensure_base(fixed_half, config, wanted, protection, log)


def crash_hint(commit: str) -> str:
    """What to do after a crash: train.py is back at the champion, the crashed one is in git."""
    return (f"train.py is back at the last kept commit; the train.py that crashed is commit {commit}. To fix it "
            f"rather than start over: `git show {commit}:train.py > train.py`, edit, and run again")


def summary(outcome: Outcome) -> str:
    row, result = outcome.row, outcome.result
    if row.status == "refused":
        return (f"refused: {row.description}\n--- the branch is back on the last kept commit; the rules are in "
                f"program.md")
    if row.status == "pruned":
        return f"pruned: {row.description}\n--- {row.decision}; train.py is back at the champion (commit {row.commit})"
    if row.status == "crash":
        return (f"crash: {row.description}\n--- last 50 lines of the log ({outcome.run_dir / state.RUN_LOG}) ---\n"
                f"{outcome.log_tail}\n--- {crash_hint(row.commit)}")
    config = f"mean {row.mean:.6f}" + (f" +- {row.sem:.6f}" if row.sem is not None else "") + f" over {row.n} run(s)"
    p = "" if row.p_better is None else f" | P(better) {row.p_better:.3f}"
    after = {"keep": "the branch holds it", "confirm": "it runs again, with another seed",
             "discard": "train.py is back at the champion", "control": "the candidate's series goes on"}[row.status]
    return (f"{row.status}: val_bpb={row.val_bpb:.6f} | {config}{p} | {row.decision} | steps={row.steps} "
            f"| memory_gb={row.memory_gb:.1f} | tok/s={result.get('tokens_per_second', 0):.0f} | wall={row.wall_s:.0f}s "
            f"| load={row.load or 0:.2f} | commit={row.commit} | {after}")
