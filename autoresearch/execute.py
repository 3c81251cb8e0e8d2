"""Executing one run: train repo's train.py under the tag's protocol, check what it left, evaluate its model.

The checks come in this order, each a refusal (the run broke a rule) or a crash (it failed): files outside the
run directory and the fixed half as they were (guard.py), the exit status and the hard timeout, FAST_FAIL, the
result file against the contract's schema, the budget, the seed and the time outside the budget; then the
harness's own evaluation of the exported model (autoresearch/evaluator), whose val_bpb is the one recorded. Nothing here
writes the ledger or moves the branch: `autoresearch run` (run.py) and a parallel worker (worker.py) both call
execute, and record.py turns what it returns into a row.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autoresearch import (cgroups, compiled, descriptions, fixed, git, guard, heldout, processes, sandbox, scratch,
                          state, supervise, tagconfig, untrusted)
from autoresearch.errors import HarnessError
from autoresearch.evaluator import harness, safe_read, scoring
from autoresearch.evaluator.probes import CAUSAL_PROBES
from autoresearch.tagconfig import Tag


@dataclass
class Execution:
    status: str               # ok, crash, refused or pruned
    reason: str               # why it crashed or was refused
    result: dict | None       # train.py's result.json
    evaluation: dict          # the harness's evaluation
    training: supervise.Training


@dataclass(frozen=True)
class Context:
    """What every run of a tag executes under: the repository (or a worker's copy of it), the tag's config, the
    protection its runs get, and the tag's fixed half (fixed.of_tag)."""
    repo: Path
    config: Tag
    protection: str
    fixed_half: fixed.FixedHalf


@dataclass
class Attempt:
    """One run to execute: its Trial (seed, place in its series, test threshold), in the record a dead harness is
    recovered from (pending: record.Pending, pending.json or a worker's), and how it is executed."""
    run_dir: Path
    pending: object                          # record.Pending: .trial, .processes, .write(), .path
    timeout: float | None = None             # shorter than the tag's, never longer
    compile_base: Path | None = None         # the compile cache it gets a private copy of (compiled.py)
    on_progress: Callable | None = None      # on_progress(elapsed, step_line)
    prune: Callable | None = None            # supervise.run_training's prune (baseline.py)
    trained: bool = False                    # its training has ended: what fails from here is its crash (execute)


@dataclass(frozen=True)
class Held:
    """What the harness holds through one training, for the checks after it: the evaluator (started early under
    bubblewrap), the guard of everything outside the run directory, the compile base's state before the run
    (None where a sandbox keeps the run from writing it), whether out/ was a bounded tmpfs, and the hard
    timeout."""
    evaluator: harness.Evaluator
    watch: guard.Guard
    base_before: object
    bounded: bool
    timeout: float


@dataclass
class Facts:
    """What the checks of a finished training read."""
    training: supervise.Training
    log: str
    result: dict | None
    problem: str          # why result.json is unusable, when it is
    seed: int
    budget: float
    timeout: float
    took: float           # the budget plus the seconds outside it, on the tag's clock
    allowance: float
    clock: str
    protection: str


def _over_time(f: Facts) -> bool:
    return f.took > f.budget + f.allowance


def _first_step(f: Facts) -> float:
    first = f.result.get("compile_seconds")
    return first if isinstance(first, (int, float)) else 0.0


# A training that broke no rule of its own is then checked against these, in order: the first that fails decides
# the run's outcome (crash or refused) and its reason.
CHECKS = (
    ("crash", lambda f: f.training.timed_out, lambda f: f"timeout after {f.timeout:.0f} s, killed"),
    ("crash", lambda f: fixed.runtime().FAST_FAIL in f.log, lambda f: "FAST_FAIL (loss NaN, infinite or exploding)"),
    ("crash", lambda f: f.protection == "bwrap" and f.log.startswith("bwrap:"),  # the sandbox failed to start
     lambda f: (f"the sandbox could not start the training ({f.log.splitlines()[0][:300]}): a path it needs is "
                f"not mounted in it. The sandbox mounts /usr, /etc, the interpreter's prefixes "
                f"({', '.join(map(str, sandbox.python_dirs()))}) and PYTHONPATH; put what is missing there, or set "
                "up a tag with --sandbox off (no enforcement)")),
    ("crash", lambda f: f.training.code != 0, lambda f: f"exit status {f.training.code}"),
    ("crash", lambda f: f.result is None, lambda f: f.problem),
    ("crash", lambda f: f.result.get("export_error"),
     lambda f: f"the model could not be exported: {f.result['export_error'][:300]}"),
    ("refused", lambda f: f.training.rewritten,
     lambda f: (f"{', '.join(f.training.rewritten)} changed after result.json first appeared; prepare.finish "
                "writes the result and the model once, when training is over")),
    ("refused", lambda f: f.result["time_budget"] != f.budget,
     lambda f: f"the run used a {f.result['time_budget']} s budget, not {f.budget} s"),
    ("refused", lambda f: f.result["seed"] != f.seed or f.result.get("data_seed") != f.seed,
     lambda f: (f"the run used seed {f.result['seed']} (data order: {f.result.get('data_seed')}), not the "
                f"harness's {f.seed}: train.py must seed from AUTORESEARCH_SEED and take its batches from "
                "prepare.make_dataloader, so that repeats are independent samples")),
    ("crash", lambda f: _over_time(f) and _first_step(f) > f.budget,
     lambda f: (f"the first step (compilation and warm-up) took {_first_step(f):.0f} s, more than the whole "
                f"{f.budget:g} s budget: this budget is too short for this train.py. Use a longer budget, or "
                "USE_COMPILE = False for smoke tests")),
    ("refused", _over_time,
     lambda f: (f"the run took {f.took:.0f} s {'of CPU per thread ' if f.clock == 'cpu' else ''}until its process "
                f"ended, more than the {f.budget:g} s budget plus the {f.allowance:g} s allowance for startup and "
                "export")),
)


def execute(ctx: Context, attempt: Attempt) -> Execution:
    """Train ctx.repo's train.py once under the tag's protocol (sandbox, hard timeout, process group, the
    integrity checks) and evaluate the model it exported. Writes nothing but the run directory and pending; the
    caller records the result. `autoresearch run` calls it in the repository, a worker (worker.py) in its own
    copy. A pruned run is checked for integrity like any other, and not evaluated."""
    out = attempt.run_dir / sandbox.OUT_DIR
    attempt.run_dir.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(out):  # left by a harness killed mid-run (recovery releases it too)
        scratch.release(out)
    try:
        return _execute(ctx, attempt, out)
    except Exception as e:  # once it trained, whatever fails is its crash (_execute says why), never left unrecorded
        if not attempt.trained:
            raise
        return Execution("crash", f"the harness could not clean up after the run ({type(e).__name__}: "
                         f"{descriptions.printable(str(e))[:300]})", None, {}, supervise.Training(None, False, None, 0.0))
    finally:  # whatever happened: the tmpfs unmounted, out/ holding the contract files alone, the copy gone
        with contextlib.suppress(Exception):  # what a training left never makes this raise (a crash already)
            if os.path.ismount(out) or os.path.lexists(scratch.kept_dir(out)):  # not settled yet
                settle(out, ctx.config.out_limit_bytes)
        with contextlib.suppress(Exception):
            scratch.release(attempt.run_dir / sandbox.COMPILE_DIR)


def settle(out: Path, total: int) -> list[str]:
    """out/ after the training: its contract files, regular and within their limits (`total` bytes together),
    and nothing else (scratch.settle)."""
    return scratch.settle(out, fixed.contract_files(), {name: limit for name, limit in zip(
        fixed.contract_files(), (safe_read.RESULT_LIMIT, safe_read.GRAPH_LIMIT, safe_read.TENSORS_LIMIT))}, total)


def _execute(ctx: Context, attempt: Attempt, out: Path) -> Execution:
    config, run_dir = ctx.config, attempt.run_dir
    bounded = boundary(config, out)
    problem = checked_source(ctx.repo, config, run_dir, attempt.pending.trial.commit or None)
    if problem:
        return Execution("refused", problem, None, {}, supervise.Training(None, False, None, 0.0))
    refused, base_before = compile_copy(ctx, attempt)
    if refused is not None:
        return refused
    half = ctx.fixed_half
    view = sandbox.make_view(run_dir, half.cache, half.manifest, config.peak_flops)
    timeout = min(attempt.timeout or config.timeout_s or tagconfig.default_timeout(config.budget_s, config.clock),
                  config.timeout_s or float("inf"))
    watch = guard.Guard(ctx.repo, exclude=[run_dir, attempt.pending.path])
    cgroup, how = (None, "") if config.accounting == "none" else cgroups.make(run_dir.name)
    if cgroup is None and config.accounting not in (None, "none"):
        raise HarnessError(f"this tag's runs are measured in a {config.accounting} of their own, and none could be "
                           f"made ({how})")
    kept = scratch.prepare_kept(out)  # where settle() puts out/'s accepted files: all the evaluator ever sees
    # Under bubblewrap the evaluator imports torch while train.py starts (harness.Evaluator says why that is safe
    # there, and only there); closed unused if the run fails.
    with contextlib.closing(harness.Evaluator(half.sources, half.cache, out, ctx.protection, kept)) as evaluator, \
            contextlib.ExitStack() as stack:
        if cgroup is not None:
            stack.callback(cgroup.close)
        launch = supervise.Launch(
            ctx.repo, run_dir, attempt.pending.trial.seed, timeout, view, clock=config.clock,
            threads=config.threads_per_run(),
            wrap=((lambda argv: sandbox.wrap(argv, ctx.repo, run_dir, half.cache, half.manifest))
                  if ctx.protection == "bwrap" else None),
            spare=(evaluator.proc.pid,) if evaluator.proc else (), cgroup=cgroup, file_limit=config.out_limit_bytes,
            budget=config.budget_s if config.budget_s != fixed.budget() else None)  # a verification's longer budget (verify.py)
        try:
            training = supervise.run_training(launch, attempt.pending, attempt.on_progress, attempt.prune)
            attempt.trained = True
        finally:
            with contextlib.suppress(Exception):  # the compile copy the training wrote: never a reason to fail
                scratch.release(run_dir / sandbox.COMPILE_DIR)  # throwaway: no run reads it again
        # From here on the harness reads what the training left. Whatever that makes fail is the run's crash,
        # recorded: never an exception that leaves the run "interrupted", which would let the same train.py run
        # again on the same seed once it saw how its training went (an export_error of 1 did, on demand).
        try:
            return _after_training(ctx, attempt, Held(evaluator, watch, base_before, bounded, timeout), training)
        except Exception as e:  # not KeyboardInterrupt: the user's Ctrl-C stays an interruption
            return Execution("crash", f"the harness could not check what the run left ({type(e).__name__}: "
                             f"{descriptions.printable(str(e))[:300]})", None, {}, training)


def _after_training(ctx: Context, attempt: Attempt, held: Held, training: supervise.Training) -> Execution:
    """What the training left, checked in order (integrity, pruning, the result's facts, CHECKS), then evaluated."""
    config, run_dir = ctx.config, attempt.run_dir
    dropped = settle(run_dir / sandbox.OUT_DIR, config.out_limit_bytes)  # the contract files, copied off the tmpfs
    if dropped:
        supervise.append_line(run_dir / state.RUN_LOG, f"out/: {len(dropped)} file(s) not kept (only the "
                              "contract files are): " + ", ".join(dropped[:5]) + (
                                  "" if held.bounded else " (out/ was on the disk: no right to mount a tmpfs here)"))
    # Integrity first: the harness's state and the data must be as they were, whatever the run reports.
    refusal = integrity(ctx, training, held.watch, attempt.compile_base, held.base_before)
    if refusal is not None:
        return Execution("refused", refusal, None, {}, training)
    if training.pruned:
        return Execution("pruned", training.pruned, None, {}, training)
    facts = read_facts(ctx, attempt, training, dropped, held.timeout)
    for outcome, fails, reason in CHECKS:
        if fails(facts):
            return Execution(outcome, reason(facts), facts.result, {}, training)
    return evaluated(ctx, attempt, held.evaluator, facts)


def boundary(config, out: Path) -> bool:
    """The run's boundary as its tag recorded it (fail closed: never a run with less), and out/ a tmpfs of the
    tag's size where this user may mount one (True) or a directory on the disk (False)."""
    problems = config.boundary_problems()
    if problems:
        raise HarnessError("; ".join(problems))
    try:
        return scratch.bounded_dir(out, config.out_limit_bytes)
    except OSError as e:
        raise HarnessError(f"out/ could not be made a tmpfs of {config.out_limit_bytes:,} bytes ({e})") from None


def compile_copy(ctx: Context, attempt: Attempt) -> tuple[Execution | None, object]:
    """The run's private copy of its compile base (a refusal where the base holds what no run may get), and the
    base's state before the run where no sandbox keeps the run from writing it (integrity compares)."""
    if attempt.compile_base is None:
        return None, None
    try:
        compiled.private_copy(attempt.compile_base, attempt.run_dir)
    except scratch.Unaccepted as e:  # checked after its phase, so changed since: by a run without a sandbox
        compiled.discard(ctx.fixed_half.cache, attempt.compile_base.name)
        return Execution("refused", f"the compile cache's base holds what no run may get ({e}); thrown away, the "
                         "next run fills a new one", None, {}, supervise.Training(None, False, None, 0.0)), None
    return None, compiled.state(attempt.compile_base) if ctx.protection != "bwrap" else None


def read_facts(ctx: Context, attempt: Attempt, training: supervise.Training, dropped: list[str],
               timeout: float) -> Facts:
    """What the checks read of a finished training: its log and result.json (why it is unusable, when it is)."""
    config, run_dir = ctx.config, attempt.run_dir
    result, problem = ((None, "") if training.timed_out or training.code != 0 else fixed.read_result(run_dir))
    refused_result = [d for d in dropped if d.startswith(ascii(fixed.contract().RESULT_FILE) + " (")]
    if result is None and refused_result:  # why settle() did not keep it: a link, a FIFO, too large
        problem = f"result.json was not kept: {refused_result[0]}"
    return Facts(training, (run_dir / state.RUN_LOG).read_text(errors="replace"), result, problem,
                 attempt.pending.trial.seed, config.budget_s, timeout,
                 config.budget_s + outside_seconds(config, training), config.allowance_s, config.clock,
                 ctx.protection)


def integrity(ctx: Context, training: supervise.Training, watch: guard.Guard, compile_base: Path | None,
              base_before) -> str | None:
    """Why the run is refused whatever it reports (the harness's state, the shared compile cache or the fixed
    half changed, or its processes outlived it), or None."""
    if training.survivors:  # nothing of the training may run beside its evaluation
        return (f"{training.survivors} process(es) of the training could not be ended; the evaluation does not "
                "start beside them")
    tampered = watch.changes()
    if tampered:
        lost = watch.restore()
        return ("the run changed files outside its run directory: " + ", ".join(tampered[:5]) +
                (" (restored)" if not lost else f" (restored, but not {', '.join(lost[:3])})"))
    if compile_base is not None and base_before is not None and compiled.state(compile_base) != base_before:
        compiled.discard(ctx.fixed_half.cache, compile_base.name)
        return "the run wrote into the shared compile cache (thrown away; the next run fills a new one)"
    try:
        fingerprint_after = fixed.fingerprint(ctx.repo)
    except HarnessError as e:
        fingerprint_after = str(e)
    if fingerprint_after != ctx.config.fingerprint:
        return ("the prepared data, prepare.py or runtime.py changed during the run; every later run is refused "
                "until `git checkout prepare.py runtime.py` or `python prepare.py --force` restores it")
    return None


def evaluated(ctx: Context, attempt: Attempt, evaluator: harness.Evaluator, facts: Facts) -> Execution:
    """The harness's own evaluation of the exported model, whose val_bpb is the one recorded."""
    result, pending = facts.result, attempt.pending

    def evaluator_started(pid):  # recorded, so that recovery also ends an evaluator left by a killed harness
        pending.processes.append(processes.identity(pid) or [pid, 0.0])
        pending.write()
        state.fault_point("evaluating")
        state.fault_point(f"evaluating-run-{pending.trial.run_no}")  # the n-th run of a series

    threshold = pending.trial.test_threshold
    request = scoring.Request(str(attempt.run_dir / sandbox.OUT_DIR), result["dtype"], result["device"],
                      result["check_bpb"], threshold if threshold is not None else float("inf"),
                      draw=heldout.draw(ctx.config),
                      # audited when its series is kept (audit), or never: no deeper probing now
                      **({"audit_probes": CAUSAL_PROBES} if pending.trial.audit_at_keep else {}))
    evaluation = evaluator.run(request, on_start=evaluator_started)
    if pending.trial.audit_at_keep:
        evaluation["audit_at_keep"] = True
    evaluation["outside_s"] = round(facts.took - facts.budget, 3)
    evaluation["allowance_s"] = facts.allowance
    status, reason = "ok", ""
    if "refused" in evaluation:
        status, reason = "refused", evaluation["refused"]
    elif "error" in evaluation:
        status, reason = "crash", evaluation["error"]
    elif result.get("val_bpb") is not None and \
            abs(result["val_bpb"] - evaluation["val_bpb"]) > scoring.CHECK_TOLERANCE[result["dtype"]]:
        status, reason = "refused", (f"train.py reported val_bpb {result['val_bpb']:.6f}, the harness measured "
                                     f"{evaluation['val_bpb']:.6f}")
    state.atomic_json(attempt.run_dir / state.EVALUATION, evaluation)
    return Execution(status, reason, result, evaluation, facts.training)


def checked_source(repo: Path, config: Tag, run_dir: Path, commit: str | None) -> str | None:
    """train.py read once, checked, and kept in run_dir (sandbox.SOURCE) for the training: what runs is what was
    checked, and what was committed. Why not, or None. A confined agent can rewrite the work tree's train.py at
    any moment (`autoresearch agent`): between the run's own check and its commit, or while it trains."""
    source = untrusted.work_tree_source(repo)
    (run_dir / sandbox.SOURCE).write_bytes(source)
    committed = git.git(repo, "rev-parse", f"{commit}:{state.EDITABLE}") if commit else None
    if committed and git.blob_id(repo, state.EDITABLE, source) != committed:
        return (f"{state.EDITABLE} changed after it was checked and committed ({commit[:7]}); leave it alone "
                "while a run starts or trains")
    base = git.git(repo, "show", f"{config.base_commit}:{state.EDITABLE}", strip=False).encode()
    return heldout.problem(source, config, base)


def outside_seconds(config: Tag, training: supervise.Training) -> float:
    """Seconds the training ran beyond its budget until its process ended, on the tag's clock (cpu: CPU seconds
    per thread)."""
    if config.clock == "cpu":
        took = (training.cpu_at_done or 0.0) / config.threads_per_run()
    else:
        took = training.done_after if training.done_after is not None else training.wall
    return round(took - config.budget_s, 3)
