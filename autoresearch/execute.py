"""Executing one run: train repo's train.py under the tag's protocol, check what it left, evaluate its model.

The checks come in this order, each a refusal (the run broke a rule) or a crash (it failed): files outside the
run directory and the fixed half as they were (guard.py), the exit status and the hard timeout, FAST_FAIL, the
result file against the contract's schema, the budget, the seed and the time outside the budget; then the
harness's own evaluation of the exported model (evaluator/), whose val_bpb is the one recorded. Nothing here
writes the ledger or moves the branch: `autoresearch run` (run.py) and a parallel worker (worker.py) both call
execute, and record.py turns what it returns into a row.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from autoresearch import compiled, fixed, git, guard, heldout, processes, sandbox, state, supervise, tags
from autoresearch.errors import HarnessError
from autoresearch.evaluator import harness, scoring
from autoresearch.evaluator.request import Request

EVAL_TIMEOUT = 1200   # seconds for the harness's evaluation of one model


@dataclass
class Execution:
    status: str               # ok, crash, refused or pruned
    reason: str               # why it crashed or was refused
    result: dict | None       # train.py's result.json
    evaluation: dict          # the harness's evaluation
    training: supervise.Training


def execute(repo: Path, config: dict, run_dir: Path, seed: int, pending: dict, pending_path: Path,
            protection: str, fixed_half: fixed.FixedHalf, timeout: float | None = None, on_progress=None,
            test_threshold: float | None = None, run_no: int = 1, compile_base: Path | None = None,
            prune=None) -> Execution:
    """Train repo's train.py once under the tag's protocol (sandbox, hard timeout, process group, the
    integrity checks) and evaluate the model it exported. Writes nothing but run_dir and pending; the caller
    records the result. `autoresearch run` calls it in the repository, a worker (worker.py) in its own copy.
    compile_base: the compile cache the run gets a private copy of (compiled.py), None for none. prune: see
    supervise.run_training (prune.py); a pruned run is checked for integrity like any other, and not evaluated."""
    clock, threads, budget = config["clock"], tags.threads_per_run(config), config["budget_s"]
    out = run_dir / sandbox.OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    problem = checked_source(repo, config, run_dir, pending.get("commit"))
    if problem:
        return Execution("refused", problem, None, {}, supervise.Training(None, False, None, 0.0))
    view = sandbox.make_view(run_dir, fixed_half.cache, fixed_half.manifest, config.get("peak_flops"))
    if compile_base is not None:
        compiled.private_copy(compile_base, run_dir)
        base_before = compiled.state(compile_base) if protection != "bwrap" else None
    wrap = ((lambda argv: sandbox.wrap(argv, repo, run_dir, fixed_half.cache, fixed_half.manifest)) if protection == "bwrap"
            else None)
    watch = guard.Guard(repo, exclude=[run_dir, pending_path])
    timeout = min(timeout or config.get("timeout_s") or tags.default_timeout(budget, clock),
                  config.get("timeout_s") or float("inf"))
    # Under bubblewrap the evaluator imports torch while train.py starts (harness.Evaluator says why that is safe
    # there, and only there); closed unused if the run fails.
    with contextlib.closing(harness.Evaluator(fixed_half.source, fixed_half.cache, out, protection)) as evaluator:
        try:
            training = supervise.run_training(repo, run_dir, seed, timeout, pending, pending_path, view, wrap,
                                              on_progress, clock, threads, [evaluator.proc.pid] if evaluator.proc
                                              else [], prune=prune)
        finally:
            shutil.rmtree(run_dir / sandbox.COMPILE_DIR, ignore_errors=True)  # throwaway: no run reads it again
        log_text = (run_dir / state.RUN_LOG).read_text(errors="replace")

        # Integrity first: the harness's state and the data must be as they were, whatever the run reports.
        tampered = watch.changes()
        refusal = crash = None
        evaluation = {}
        if training.survivors:  # nothing of the training may run beside its evaluation
            refusal = (f"{training.survivors} process(es) of the training could not be ended; the evaluation "
                       "does not start beside them")
        elif tampered:
            lost = watch.restore()
            refusal = ("the run changed files outside its run directory: " + ", ".join(tampered[:5]) +
                       (" (restored)" if not lost else f" (restored, but not {', '.join(lost[:3])})"))
        elif compile_base is not None and base_before is not None and compiled.state(compile_base) != base_before:
            compiled.discard(fixed_half.cache, compile_base.name)
            refusal = "the run wrote into the shared compile cache (thrown away; the next run fills a new one)"
        else:
            try:
                fingerprint_after = fixed.fingerprint(repo)
            except HarnessError as e:
                fingerprint_after = str(e)
            if fingerprint_after != config["fingerprint"]:
                refusal = ("the prepared data or prepare.py changed during the run; every later run is refused until "
                           "`python prepare.py --force` restores it")
        result = None
        allowance = config["allowance_s"]
        took = budget + outside_seconds(config, training)
        if refusal is None and training.pruned:
            return Execution("pruned", training.pruned, None, {}, training)
        if refusal is None:
            result, problem = (None, "") if training.timed_out or training.code != 0 else fixed.read_result(run_dir)
            if training.timed_out:
                crash = f"timeout after {timeout:.0f} s, killed"
            elif fixed.contract().FAST_FAIL in log_text:
                crash = "FAST_FAIL (loss NaN, infinite or exploding)"
            elif protection == "bwrap" and log_text.startswith("bwrap:"):  # the sandbox itself failed to start
                crash = (f"the sandbox could not start the training ({log_text.splitlines()[0][:300]}): a path it "
                         f"needs is not mounted in it. The sandbox mounts /usr, /etc, the interpreter's prefixes "
                         f"({', '.join(map(str, sandbox.python_dirs()))}) and PYTHONPATH; put what is missing there, "
                         "or set up a tag with --sandbox off (no enforcement)")
            elif training.code != 0:
                crash = f"exit status {training.code}"
            elif result is None:
                crash = problem
            elif result.get("export_error"):
                crash = f"the model could not be exported: {result['export_error'][:300]}"
            elif training.rewritten:
                refusal = (f"{', '.join(training.rewritten)} changed after result.json first appeared; "
                           "prepare.finish writes the result and the model once, when training is over")
            elif result["time_budget"] != budget:
                refusal = f"the run used a {result['time_budget']} s budget, not {budget} s"
            elif result["seed"] != seed or result.get("data_seed") not in (None, seed):
                refusal = (f"the run used seed {result['seed']} (data order: {result.get('data_seed')}), not the "
                           f"harness's {seed}: train.py must seed from AUTORESEARCH_SEED, so that repeats are "
                           "independent samples")
            elif took > budget + allowance:
                first_step = result.get("compile_seconds")
                if isinstance(first_step, (int, float)) and first_step > budget:
                    crash = (f"the first step (compilation and warm-up) took {first_step:.0f} s, more than the "
                             f"whole {budget:g} s budget: this budget is too short for this train.py. Use a longer "
                             f"budget, or USE_COMPILE = False for smoke tests")
                else:
                    refusal = (f"the run took {took:.0f} s {'of CPU per thread ' if clock == 'cpu' else ''}until "
                               f"its process ended, more than the {budget:g} s budget plus the {allowance:g} s "
                               "allowance for startup and export")
        if refusal is None and crash is None:
            def evaluator_started(pid):  # recorded, so that recovery also ends an evaluator left by a killed harness
                pending["processes"].append(processes.identity(pid) or [pid, 0.0])
                state.atomic_json(pending_path, pending)
                state.fault_point("evaluating")
                state.fault_point(f"evaluating-run-{run_no}")  # the n-th run of a series

            request = Request(str(out), result["dtype"], result["device"], result["check_bpb"],
                              test_threshold if test_threshold is not None else float("inf"),
                              draw=heldout.draw(config))
            evaluation = evaluator.run(request, EVAL_TIMEOUT, on_start=evaluator_started)
            evaluation["outside_s"] = round(took - budget, 3)
            evaluation["allowance_s"] = allowance
            if "refused" in evaluation:
                refusal = evaluation["refused"]
            elif "error" in evaluation:
                crash = evaluation["error"]
            elif result.get("val_bpb") is not None and abs(result["val_bpb"] - evaluation["val_bpb"]) > \
                    scoring.CHECK_TOLERANCE[result["dtype"]]:
                refusal = (f"train.py reported val_bpb {result['val_bpb']:.6f}, the harness measured "
                           f"{evaluation['val_bpb']:.6f}")
            state.atomic_json(run_dir / state.EVALUATION, evaluation)
        status = "refused" if refusal is not None else "crash" if crash is not None else "ok"
        return Execution(status, refusal or crash or "", result, evaluation, training)


def checked_source(repo: Path, config: dict, run_dir: Path, commit: str | None) -> str | None:
    """train.py read once, checked, and kept in run_dir (sandbox.SOURCE) for the training: what runs is what was
    checked, and what was committed. Why not, or None. A confined agent can rewrite the work tree's train.py at
    any moment (`autoresearch agent`): between the run's own check and its commit, or while it trains."""
    source = (repo / state.EDITABLE).read_bytes()
    (run_dir / sandbox.SOURCE).write_bytes(source)
    committed = git.git(repo, "rev-parse", f"{commit}:{state.EDITABLE}") if commit else None
    if committed and git.blob_id(repo, state.EDITABLE, source) != committed:
        return (f"{state.EDITABLE} changed after it was checked and committed ({commit[:7]}); leave it alone "
                "while a run starts or trains")
    base = git.git(repo, "show", f"{config['base_commit']}:{state.EDITABLE}", strip=False).encode()
    return heldout.problem(source, config, base)


def outside_seconds(config: dict, training: supervise.Training) -> float:
    """Seconds the training ran beyond its budget until its process ended, on the tag's clock (cpu: CPU seconds
    per thread)."""
    if config["clock"] == "cpu":
        took = (training.cpu_at_done or 0.0) / tags.threads_per_run(config)
    else:
        took = training.done_after if training.done_after is not None else training.wall
    return round(took - config["budget_s"], 3)
