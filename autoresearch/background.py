"""Runs apart from the loop: `autoresearch run --detach` and `wait` (below: `autoresearch try`).

`run --detach` and `wait`: an experiment for an agent whose shell tool times out.

A run takes 5-21 minutes; coding agents' shell tools give up after 2-10. A killed `autoresearch run` is recorded as
interrupted and its series must then be finished before the next edit runs, so an agent should not hold a run
in its shell: `run --detach` starts it in its own session (a tool's timeout cannot kill it) and returns once it
holds the repository's lock; `wait` returns when it ends, or after --timeout seconds (default WAIT_S, under
every agent's limit) with exit status STILL_RUNNING, to be called again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from autoresearch import fixed, git, processes, record, sandbox, state, supervise, tagconfig, untrusted
from autoresearch.errors import HarnessError


LOG_FILE = "detached.log"   # under STATE_DIR: the detached run's output
RC_FILE = "detached.rc"     # under STATE_DIR: its exit status, written when it ends
PID_FILE = "detached.pid"   # under STATE_DIR: the identity (pid, start time) of the detached process
RC_ENV = "AUTORESEARCH_DETACHED_RC"  # set for the detached process: where it writes its exit status as it ends
WAIT_S = 240.0
STILL_RUNNING = 3           # `wait`'s exit status when the run is still going at its timeout
START_S = 60.0              # seconds a detached run may take to take the lock (imports, recovery)


def detach(repo: Path, argv: list[str]) -> tuple[int, str]:
    """Start `autoresearch <argv>` in the background; (exit status, what to tell the user)."""
    where = state.state_dir(repo)
    where.mkdir(parents=True, exist_ok=True)
    if state.is_held(where):
        raise state.LockHeld(state.describe_holder(where / state.LOCK_NAME) + "; `autoresearch wait` returns when it "
                            "ends")
    log_path, rc_path = where / LOG_FILE, where / RC_FILE
    rc_path.unlink(missing_ok=True)
    with open(log_path, "w") as out:  # its own session: the caller's shell timeout cannot kill it
        proc = subprocess.Popen([sys.executable, "-m", "autoresearch.cli", *argv], cwd=repo, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1", **{RC_ENV: str(rc_path)}))
    (where / PID_FILE).write_text(json.dumps(processes.identity(proc.pid)))
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline and not state.is_held(where) and proc.poll() is None:
        time.sleep(0.2)
    if proc.poll() is not None and not state.is_held(where):  # it ended at once: an error, said now
        return _status(rc_path), log_path.read_text(errors="replace").rstrip()
    return 0, (f"started in the background (pid {proc.pid}); its output goes to {log_path}. "
               f"`autoresearch wait` returns when it ends (or after {WAIT_S:.0f} s with exit status "
               f"{STILL_RUNNING}: call it again); `autoresearch status` shows it meanwhile")


def record_status(code: int) -> None:
    """Called by the detached process as it ends: its exit status, for `wait` (written whole, then renamed)."""
    path = os.environ.get(RC_ENV)
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{code}\n")
        os.replace(tmp, path)


def _status(rc_path: Path) -> int:
    try:
        return int(rc_path.read_text().strip())
    except (OSError, ValueError):
        return 1


def wait(repo: Path, timeout: float = WAIT_S) -> tuple[int, str]:
    """Wait until no command holds the repository (a detached run, a loop); (exit status, what to tell)."""
    where = state.state_dir(repo)
    deadline = time.monotonic() + timeout
    while state.is_held(where):
        if time.monotonic() >= deadline:
            return STILL_RUNNING, (f"still running: {state.holder(where / state.LOCK_NAME)}; call "
                                   "`autoresearch wait` again (`autoresearch status` shows its progress)")
        time.sleep(1.0)
    log_path, rc_path = where / LOG_FILE, where / RC_FILE
    if not log_path.exists():
        return 0, "nothing is running"
    try:  # the lock is free a moment before the process writes its exit status and ends
        detached = processes.same_process(json.loads((where / PID_FILE).read_text()))
    except (OSError, ValueError):
        detached = None
    while detached is not None and not rc_path.exists() and detached.is_running() and time.monotonic() < deadline + 10:
        time.sleep(0.1)
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-60:])
    if not rc_path.exists():
        return 1, (tail + "\n--- the background run ended without an exit status (it was killed); the next "
                   "`autoresearch run` records it as interrupted and puts the branch back")
    return _status(rc_path), tail


# --- autoresearch try ---------------------------------------------------------------------------------------------
# `autoresearch try`: the work tree's train.py trained once inside the training sandbox, its model scored by the
# harness's evaluator; nothing committed, nothing recorded. What `python train.py` by hand did (a look at a
# train.py: its steps, its val_bpb), without running an agent's code as you: every train.py an agent wrote is
# untrusted code, kept or not (docs/integrity.md).
# 
# The training runs the way a run's does (sandbox.wrap: train.py, the fixed half, the training tokens and its own
# out/, no network, no capability; supervise.run_training: its own process group, a hard timeout, every process
# of it ended before the evaluation); the evaluator, in its own sandbox, scores the export on the whole validation
# split (no tag, so no secret draw). Its directory (run.log, out/) stays under .autoresearch/tries/ for a look.
# Not for agents: the broker does not run it (broker.BROKERED), since an agent's scores are the ledger's.

TRIES = "tries"  # under state.state_dir: one directory per try


def run(repo: Path, seed: int, timeout: float | None, log=print) -> bool:
    """Train and score the work tree's train.py once (see the top); True when it trained and was scored."""
    import prepare
    if not sandbox.bwrap_works():
        raise HarnessError("`autoresearch try` trains train.py inside the training sandbox (bubblewrap), which is "
                           "missing or cannot create namespaces here: install it (`apt-get install bubblewrap`). "
                           "An agent's train.py is untrusted code: never run it by hand (docs/integrity.md).")
    manifest, cache, budget = prepare.require_manifest(), prepare.cache_dir(), fixed.budget()
    run_dir = state.state_dir(repo) / TRIES / time.strftime("%Y%m%d-%H%M%S")
    while run_dir.exists():
        run_dir = run_dir.with_name(run_dir.name + "+")
    (run_dir / sandbox.OUT_DIR).mkdir(parents=True)
    (run_dir / sandbox.SOURCE).write_bytes(untrusted.work_tree_source(repo))  # what the sandbox shows
    view = sandbox.make_view(run_dir, cache, manifest)
    limit = timeout or tagconfig.default_timeout(budget, "wall")
    launch = supervise.Launch(repo, run_dir, seed, limit, view, threads=len(os.sched_getaffinity(0)),
                              wrap=lambda argv: sandbox.wrap(argv, repo, run_dir, cache, manifest))
    log(f"training {state.EDITABLE} in the sandbox for {budget:g} s (seed {seed}, killed after {limit:.0f} s); "
        f"nothing is committed or recorded; log: {run_dir / state.RUN_LOG}", flush=True)
    training = supervise.run_training(launch, record.Pending(run_dir / "pending.json"),
                                      on_progress=lambda elapsed, line: log(line, flush=True))
    tail = state.tail(run_dir / state.RUN_LOG, 20)
    result, problem = (None, "") if training.timed_out or training.code != 0 else fixed.read_result(run_dir)
    if result is None or result.get("export_error"):
        why = ("timed out" if training.timed_out else f"exit status {training.code}" if training.code
               else problem or f"the model could not be exported: {result['export_error'][:300]}")
        log(f"{tail}\nthe training failed: {why}")
        return False
    from autoresearch.evaluator import harness
    from autoresearch.evaluator.scoring import Request
    sources = {name: git.git(repo, "show", f"HEAD:{name}", strip=False).encode() for name in state.FIXED}
    request = Request(str(run_dir / sandbox.OUT_DIR), result["dtype"], result["device"], result["check_bpb"])
    evaluation = harness.run_evaluation(sources, cache, request, protection="bwrap")
    state.atomic_json(run_dir / state.EVALUATION, evaluation)
    if "val_bpb" not in evaluation or "refused" in evaluation or "error" in evaluation:
        log(f"{tail}\nthe evaluation did not score it: {evaluation.get('refused') or evaluation.get('error')}")
        return False
    log(f"val_bpb={evaluation['val_bpb']:.4f} | memory_gb={result['memory_gb']:.1f} | steps={result['num_steps']}"
        f"  (the harness's evaluation of the whole validation split; not recorded)")
    return True
