"""Recording a finished run: its row (judged against the rows before it by decide.py), its log, the ledger.

Both loops record through here: `autoresearch run` (run.py) after executing in the repository, and the parallel
driver (driver.py) after a worker returns, so a run's row does not depend on where it ran. result_row judges,
record writes; the branch is the caller's (a sequential run resets it on a discard, the driver fast-forwards it
on a keep).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from statistics import fmean

from autoresearch import decide, execute, fixed, ledger, sandbox, state, supervise
from autoresearch.evaluator import safe_read


def make_row(tag_config, commit, description, run_id, status, val_bpb=0.0, memory_gb=0.0, steps=0, wall=0.0, seed=0,
         protection="none", **stats):
    return ledger.Row(commit=commit[:7], val_bpb=val_bpb, memory_gb=memory_gb, status=status,
                      description=description, tag=tag_config["tag"], run_id=run_id, time=state.now(),
                      budget_s=tag_config["budget_s"], steps=steps, wall_s=wall,
                      fingerprint=tag_config["fingerprint"][:12], seed=seed, protection=protection,
                      clock=tag_config.get("clock", "wall"), **stats)


def interrupted_row(config: dict, job: dict, reason: str) -> ledger.Row:
    """The row of a run whose harness, driver or worker died before it was recorded."""
    return make_row(config, job.get("commit") or job["parent"], f"{job['description']} [interrupted: {reason}]",
                    job["run_id"], "crash", seed=job.get("seed", 0), protection=job.get("protection", "none"),
                    config=job.get("config", ""), repeat=job.get("repeat", 1), decision="interrupted",
                    worker=job.get("worker", ""), host=job.get("host", ""), device=job.get("device", ""))


def test_threshold(rows: list[ledger.Row], config: dict, rule: str) -> float | None:
    """The val_bpb below which a run may be a new best, so the held-out test split is scored for it: the best
    single run (naive) or the champion's mean (stat)."""
    champ_row = decide.champion(rows)
    values = decide.samples(rows).get(champ_row.key, []) if champ_row else []
    if rule == "stat" and values:
        return fmean(values)
    best_row = ledger.best(rows, config["fingerprint"], config["budget_s"])
    return best_row.val_bpb if best_row else None


def judge(rows, rule, series, champ_row, config_id, seed, val_bpb, best_before,
          cold: bool = False) -> tuple[str, dict]:
    """The status of a finished run (configuration config_id, seed, val_bpb) and the statistics its row carries
    (decide.py)."""
    values = decide.samples(rows)
    values[config_id] = values.get(config_id, []) + [val_bpb]
    mine = values[config_id]
    noise = decide.pooled_noise(values)
    stats = {"mean": fmean(mine), "n": len(mine), "sem": decide.sem(mine, noise) if noise else None}
    if rule == "naive":
        better = best_before is None or val_bpb < best_before
        return ("keep" if better else "discard"), dict(stats, decision="naive: " + (
            "first run" if best_before is None else f"{'below' if better else 'not below'} the best {best_before:.6f}"))
    if champ_row is None or (series is not None and series.kind == "baseline"):
        return "keep", dict(stats, decision=f"baseline {len(mine)}/{decide.BASELINE_RUNS}")
    if config_id == champ_row.key:
        return "keep", dict(stats, decision="a repeat of the champion")
    comparison = decide.compare(decide.seeded(rows) + [(config_id, seed, val_bpb)], config_id, champ_row.key)
    verdict = decide.rule(len(mine), comparison, cold=cold)
    return verdict.status, dict(stats, p_better=verdict.p, decision=verdict.reason)


def result_row(config: dict, ex: execute.Execution, rows: list[ledger.Row], rule: str, series: decide.Series | None,
               commit: str, description: str, run_id: str, seed: int, protection: str, config_id: str,
               repeat: int, **where) -> ledger.Row:
    """The ledger row of a finished execution, judged against the rows recorded before it."""
    common = dict(seed=seed, protection=protection, config=config_id, repeat=repeat, load=ex.training.load,
                  wall=ex.training.wall, outside_s=execute.outside_seconds(config, ex.training) if ex.training.wall else None,
                  **where)
    if ex.status == "refused":
        return make_row(config, commit, f"{description} [refused: {ex.reason}]", run_id, "refused", **common)
    if ex.status == "pruned":
        return make_row(config, commit, description, run_id, "pruned", decision=ex.reason, **common)
    if ex.status == "crash":
        return make_row(config, commit, f"{description} [crash: {ex.reason}]", run_id, "crash", decision=(
            "crashed during its confirmation: discarded" if series is not None and series.kind == "candidate"
            else ""), **common)
    champ_row = decide.champion(rows)
    best_row = ledger.best(rows, config["fingerprint"], config["budget_s"])
    val_bpb = ex.evaluation["val_bpb"]
    cold = (ex.result.get("compile_seconds") or 0) > decide.cold_after(config["budget_s"])  # a new shape's first run
    status, stats = judge(rows, rule, series, champ_row, config_id, seed, val_bpb,
                          best_row.val_bpb if best_row else None, cold)
    test_bpb = ex.evaluation.get("test_bpb")
    flags = [decide.identical_flag(rows, config_id, val_bpb, seed)]
    if status == "keep":
        flags.append(decide.test_gap_flag(rows, val_bpb, test_bpb, decide.pooled_noise(decide.samples(rows))))
    return make_row(config, commit, description, run_id, status, val_bpb=val_bpb, memory_gb=ex.result["memory_gb"],
                steps=ex.result["num_steps"], test_bpb=test_bpb, flags="; ".join(f for f in flags if f), **stats,
                **common)


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


def append_line(path: Path, line: str) -> None:
    """Append to a harness file, never through a link."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    except OSError:
        return
    with os.fdopen(fd, "a") as f:
        f.write(line + "\n")


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
    if log_path is not None and row.status in ("keep", "discard", "confirm"):
        append_line(log_path, fixed.contract().final_line(row.val_bpb, row.memory_gb, row.steps))
    state.fault_point("recording")
    ledger.append(state.results(repo), row)
    state.fault_point("recorded")
    if log_path is not None:
        publish_log(repo, log_path)
