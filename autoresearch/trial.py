"""`autoresearch try`: the work tree's train.py trained once inside the training sandbox, its model scored by the
harness's evaluator; nothing committed, nothing recorded. What `python train.py` by hand did (a look at a
train.py: its steps, its val_bpb), without running an agent's code as you: every train.py an agent wrote is
untrusted code, kept or not (docs/integrity.md).

The training runs the way a run's does (sandbox.wrap: train.py, the fixed half, the training tokens and its own
out/, no network, no capability; supervise.run_training: its own process group, a hard timeout, every process
of it ended before the evaluation); the evaluator, in its own sandbox, scores the export on the whole validation
split (no tag, so no secret draw). Its directory (run.log, out/) stays under .autoresearch/tries/ for a look.
Not for agents: the broker does not run it (broker.BROKERED), since an agent's scores are the ledger's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from autoresearch import fixed, git, sandbox, state, supervise, tags
from autoresearch.errors import HarnessError

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
    (run_dir / sandbox.SOURCE).write_bytes((repo / state.EDITABLE).read_bytes())  # what the sandbox shows
    view = sandbox.make_view(run_dir, cache, manifest)
    limit = timeout or tags.default_timeout(budget, "wall")
    launch = supervise.Launch(repo, run_dir, seed, limit, view, threads=len(os.sched_getaffinity(0)),
                              wrap=lambda argv: sandbox.wrap(argv, repo, run_dir, cache, manifest))
    log(f"training {state.EDITABLE} in the sandbox for {budget:g} s (seed {seed}, killed after {limit:.0f} s); "
        f"nothing is committed or recorded; log: {run_dir / state.RUN_LOG}", flush=True)
    training = supervise.run_training(launch, {"processes": []}, run_dir / "pending.json",
                                      on_progress=lambda elapsed, line: log(line, flush=True))
    tail = state.tail(run_dir / state.RUN_LOG, 20)
    result, problem = (None, "") if training.timed_out or training.code != 0 else fixed.read_result(run_dir)
    if result is None or result.get("export_error"):
        why = ("timed out" if training.timed_out else f"exit status {training.code}" if training.code
               else problem or f"the model could not be exported: {result['export_error'][:300]}")
        log(f"{tail}\nthe training failed: {why}")
        return False
    from autoresearch.evaluator import harness
    from autoresearch.evaluator.request import Request
    from autoresearch.execute import EVAL_TIMEOUT
    sources = {name: git.git(repo, "show", f"HEAD:{name}", strip=False).encode() for name in state.FIXED}
    request = Request(str(run_dir / sandbox.OUT_DIR), result["dtype"], result["device"], result["check_bpb"])
    evaluation = harness.run_evaluation(sources, cache, request, EVAL_TIMEOUT, protection="bwrap")
    state.atomic_json(run_dir / state.EVALUATION, evaluation)
    if "val_bpb" not in evaluation or "refused" in evaluation or "error" in evaluation:
        log(f"{tail}\nthe evaluation did not score it: {evaluation.get('refused') or evaluation.get('error')}")
        return False
    log(f"val_bpb={evaluation['val_bpb']:.4f} | memory_gb={result['memory_gb']:.1f} | steps={result['num_steps']}"
        f"  (the harness's evaluation of the whole validation split; not recorded)")
    return True
