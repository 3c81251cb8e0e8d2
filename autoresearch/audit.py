"""The causality audit at the keep: a run that may be kept (its test split scored) is scored at first with the
quick probes only, and audited with the audit's probes when its series is about to be kept (series, asked by
`autoresearch run` and the parallel driver), exactly the runs that would have been audited when scored, so a keep
vouches for the same audits while a series that ends discarded pays none (study.Study.audit_at_keep decides
which runs wait; docs/speed.md has the cost, docs/integrity.md the guarantee)."""

from __future__ import annotations

import json
from pathlib import Path

from autoresearch import descriptions, execute, fixed, heldout, ledger, processes, record, sandbox, state
from autoresearch.evaluator import harness, safe_read, scoring


AUDIT = "audit.json"  # in a run's directory: its audit made at its series' keep (audit), for the reader


def _harness_json(path: Path) -> dict:
    """A JSON object the harness wrote in a run's directory, read as a regular file of bounded size."""
    data = json.loads(safe_read.read_regular(path, safe_read.RESULT_LIMIT))
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} does not hold an object")
    return data


def waited_for_keep(run_dir: Path) -> bool:
    """Whether a run's audit was left for its series' keep (its evaluation says so: study.Study.audit_at_keep).
    The parallel driver asks, for a series that `autoresearch run` began; unreadable: True (audited again)."""
    try:
        evaluation = _harness_json(run_dir / state.EVALUATION)
    except (OSError, ValueError, safe_read.Unsafe):
        return True
    return bool(evaluation.get("audit_at_keep")) and not evaluation.get("audited")


def check(ctx: execute.Context, run_dir: Path, scores: tuple[float, float | None], on_start=None) -> str | None:
    """The causality audit of a finished run that may be kept, made when its series is about to be kept
    (series): its exported model (out/, the contract files the harness accepted, the training long
    ended) scored again by a fresh evaluator with the audit's probes, as it would have been when it was scored.
    It must give the scores recorded for the run, `scores` (val_bpb, test_bpb: its ledger row's, or for the run
    being decided what its evaluation returned), never what a file in its directory says. Writes
    run_dir/audit.json (for the reader: nothing reads it back); returns why the keep is refused, or None."""
    try:
        scored = _harness_json(run_dir / state.EVALUATION)  # how it was evaluated: dtype, device, check_bpb
        out = run_dir / sandbox.OUT_DIR
        if not all((out / name).is_file() and not (out / name).is_symlink() for name in fixed.contract_files()[1:]):
            return f"run {run_dir.name} may be kept, and its exported model is gone: it cannot be audited"
        request = scoring.Request(str(out), str(scored["dtype"]), str(scored["device"]), float(scored["check_bpb"]),
                          float("inf"), draw=heldout.draw(ctx.config))
        evaluation = harness.run_evaluation(ctx.fixed_half.sources, ctx.fixed_half.cache, request, ctx.protection,
                                            on_start)
        if not isinstance(evaluation, dict):
            return f"run {run_dir.name}'s audit returned no verdict"
        state.atomic_json(run_dir / AUDIT, evaluation)
        if "refused" in evaluation or "error" in evaluation:
            return f"run {run_dir.name}'s audit: {evaluation.get('refused') or evaluation.get('error')}"
        tolerance = scoring.CHECK_TOLERANCE.get(request.dtype, 0.0) + 1e-6  # a row keeps 6 decimals
        for split, value in zip(("val_bpb", "test_bpb"), scores):
            if value is not None and not abs(float(evaluation.get(split, "nan")) - value) <= tolerance:
                return (f"run {run_dir.name}'s export scored {split} {evaluation.get(split)} at its audit, {value} "
                        "when it ran")
        if not evaluation.get("audited"):
            return f"run {run_dir.name} was not audited ({evaluation.get('causal_probes')} probes)"
        return None
    except Exception as e:  # whatever fails here refuses the keep; it never leaves the run unrecorded
        return f"run {run_dir.name}'s audit failed ({type(e).__name__}: {descriptions.printable(str(e))[:200]})"


def owed(repo: Path, rows: list[ledger.Row], config_id: str) -> list[tuple]:
    """The runs of a configuration's open series that may be kept (their test split scored) and whose audit is
    due at its keep (waited_for_keep: a series the parallel driver began and `run` finishes was audited when
    scored, its exports on the workers), with the scores their rows recorded: (run_dir, (val_bpb, test_bpb))."""
    return [(state.run_dir(repo, r.run_id), (r.val_bpb, r.test_bpb)) for r in rows
            if r.status == "confirm" and r.config == config_id and r.run_id and r.test_bpb is not None
            and waited_for_keep(state.run_dir(repo, r.run_id))]


def series(ctx: execute.Context, runs: list[tuple], pending: record.Pending | None, log) -> str | None:
    """Before a series is kept: the causality audit of each of its runs that may be kept and was scored without
    it (study.Study.audit_at_keep), exactly the runs that would have been audited when scored, so a keep vouches
    for the same audits as before, and a series that ends discarded pays none. runs: owed()'s, and the deciding
    run's. Why the keep is refused, or None."""
    for i, (run_dir, scores) in enumerate(runs, 1):
        log(f"auditing run {run_dir.name} before the keep ({i} of {len(runs)}: the causality audit)")

        def started(pid):  # a harness killed during the audit: recovery ends its evaluator too
            if pending is not None:
                pending.processes.append(processes.identity(pid) or [pid, 0.0])
                pending.write()
            state.fault_point("auditing")

        problem = check(ctx, run_dir, scores, started)
        if problem:
            return problem
    return None
