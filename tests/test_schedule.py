"""The scheduler (study.py) on its own, and the two loops on one night: the sequential loop (loop.py) and the
parallel driver (driver.py, one worker) given the same outcomes must record the same decisions.

The night is real harness code end to end (tags, git commits, the guard, the recorder, the branch moves, the
workers' clones) except for the training: execute.execute is replaced by a deterministic stand-in whose val_bpb is
a function of train.py and the seed, and Ray by an in-process stand-in that runs each actor call at once."""

import argparse
import json
import dataclasses
import re
import sys
from types import SimpleNamespace

import pytest

from autoresearch import descriptions, execute, ledger, loop, record, state, study, supervise, tags
from autoresearch.ledger import Row

TAG = SimpleNamespace(tag="t", fingerprint="f" * 12, budget_s=2, clock="wall")  # what a Study reads of a tag here


def row(status, config, description, decision="", val=0.0, commit="c0ffee0", seed=0, load=None):
    return Row(commit=commit, val_bpb=val, memory_gb=0.0, status=status, description=description, tag="t",
               run_id=f"r{description}", time="", budget_s=2, steps=0, wall_s=0.0, fingerprint="f", seed=seed,
               config=config, decision=decision, load=load)


BASE = [row("keep", "base", "baseline", "baseline 1/3", 1.0)]
FULL_BASE = BASE + [row("keep", "base", "baseline [run 2]", "baseline 2/3", 1.01),
                    row("keep", "base", "baseline [run 3]", "baseline 3/3", 0.99)]


def test_an_empty_ledger_starts_the_baseline_and_counts_it_as_an_experiment():
    step = study.next_run([], [], "stat", True, "base")
    assert (step.kind, step.description, step.new) == ("baseline", "baseline", True)
    assert study.next_run([], [], "stat", False, "base").kind == "wait"  # --max-experiments 0, or stopping


def test_the_baselines_runs_go_out_side_by_side_up_to_three():
    assert study.next_run(BASE, [], "stat", False, "base").description == "baseline [run 2]"  # even when stopping
    assert study.next_run(BASE, ["base"], "stat", True, "base").description == "baseline [run 3]"
    assert study.next_run(BASE, ["base", "base"], "stat", True, "base").kind == "wait"
    # the first run in flight, nothing recorded: two more may start; the naive rule runs it once
    assert study.next_run([], ["base"], "stat", True, "base").description == "baseline [run 2]"
    assert study.next_run([], ["base"], "naive", True, "base").kind == "wait"


def test_a_killed_harness_is_not_the_baselines_crash_and_three_real_crashes_stop_the_loop():
    interrupted = [row("crash", "base", "baseline [interrupted: harness died mid-run]", "interrupted")]
    assert study.next_run(interrupted, [], "stat", True, "base").description == "baseline"
    crashed = [row("crash", "base", "baseline [crash: exit status 1]") for _ in range(2)]
    assert study.next_run(crashed, [], "stat", True, "base").description == "baseline (try 3)"
    # a worker whose harness code failed is recorded with no "interrupted" decision: it counts
    failed = crashed + [row("crash", "base", "baseline [interrupted: w1 failed: boom]")]
    assert study.next_run(failed, [], "stat", True, "base").kind == "stop"
    assert study.next_run(failed, ["base"], "stat", True, "base").kind == "wait"  # a run in flight ends first


def test_a_candidates_confirmation_runs_one_at_a_time_before_new_proposals():
    rows = FULL_BASE + [row("confirm", "cand", "lr up", "P 0.7 after one run", 0.98, commit="abcdef1")]
    step = study.next_run(rows, [], "stat", False, "base")
    assert (step.kind, step.commit, step.description, step.run_no, step.new) == (
        "series", "abcdef1", "lr up [run 2]", 2, False)
    assert study.next_run(rows, ["cand"], "stat", True, "base").kind == "propose"
    assert study.next_run(FULL_BASE, [], "stat", True, "base").kind == "propose"
    assert study.next_run(FULL_BASE, [], "stat", False, "base").kind == "wait"
    assert study.next_run(BASE, ["base", "base"], "stat", True, "base").kind == "wait"  # the champion's mean first


def test_a_series_whose_last_run_was_refused_or_interrupted_resumes_only_as_a_new_experiment():
    """A refusal with a lasting cause would otherwise repeat forever: resuming counts against --max-experiments
    and waits for --hours and the stop button, as a new experiment does; a series in its normal course does not."""
    confirming = FULL_BASE + [row("confirm", "cand", "lr up", "P 0.7 after one run", 0.98, commit="abcdef1")]
    for last in (row("refused", "cand", "lr up [run 2] [refused: the run took 40 s]"),
                 row("crash", "cand", "lr up [run 2] [interrupted: harness died]", "interrupted")):
        step = study.next_run(confirming + [last], [], "stat", True, "base")
        assert (step.kind, step.run_no, step.new) == ("series", 2, True)
        assert study.next_run(confirming + [last], [], "stat", False, "base").kind == "wait"
    interrupted_baseline = BASE + [row("crash", "base", "baseline [run 2] [interrupted: x]", "interrupted")]
    assert study.next_run(interrupted_baseline, [], "stat", False, "base").kind == "wait"  # `loop --max-experiments 0`
    assert study.next_run(interrupted_baseline, [], "stat", True, "base").new


def test_three_baseline_crashes_stop_the_loop_only_when_it_would_try_again():
    crashed = [row("crash", "base", "baseline [crash: exit status 1]") for _ in range(3)]
    assert study.next_run(crashed, [], "stat", True, "base").kind == "stop"
    assert study.next_run(crashed, [], "stat", False, "base").kind == "wait"  # the limit came first: exit 0


def test_a_configurations_kth_run_gets_the_champions_kth_seed_counting_the_runs_in_flight():
    """Paired seeds: run k of any configuration uses seed 42 + k - 1, so a candidate's runs meet the champion's
    on the same seeds; a run with no result (crash, interruption, refusal) leaves its seed to the next, and two
    runs of one configuration never share a seed, in whatever order the parallel driver's runs end."""
    seeded = [dataclasses.replace(r, seed=42 + i) for i, r in enumerate(FULL_BASE)]
    assert study.seed(seeded, "base", [], "stat") == 45
    assert study.seed(seeded, "base", [45, 46], "stat") == 47
    assert study.seed(seeded, "cand", [], "stat") == 42 and study.seed(seeded, "cand", [42], "stat") == 43
    confirming = seeded + [row("confirm", "cand", "lr up", "P 0.7 after one run", 0.98, seed=42)]
    assert study.seed(confirming, "cand", [], "stat") == 43
    killed = confirming + [row("crash", "cand", "lr up [run 2] [interrupted: x]", "interrupted", seed=43),
                           row("refused", "cand", "lr up [run 2] [refused: y]", seed=43)]
    assert study.seed(killed, "cand", [], "stat") == 43
    # the baseline's three runs went out side by side; the one on 42 was lost, 43 and 44 finished: its retry
    # takes 42 (not 44, which would pair a run with itself)
    out_of_order = [row("crash", "base", "baseline [interrupted: worker died]", "interrupted", seed=42),
                    row("keep", "base", "baseline [run 2]", "baseline 1/3", 1.0, seed=43),
                    row("keep", "base", "baseline [run 3]", "baseline 2/3", 1.0, seed=44)]
    assert study.seed(out_of_order, "base", [], "stat") == 42
    assert study.seed(seeded, "base", [], "naive") == 42
    assert study.repeat_number(FULL_BASE, "base", ["base"]) == 5


# --- the control rule: a candidate's repeats beside the champion's control runs ---------------------------------

SEEDED_BASE = [dataclasses.replace(r, seed=42 + i) for i, r in enumerate(FULL_BASE)]  # mean 1.0, noise 0.01


def controlled(rule: str, candidate, base, rows=None, config: str = "cand", load=lambda kind: 0.0) -> list[Row]:
    """A candidate's whole series after `rows` (SEEDED_BASE by default), as both loops run it: what
    study.next_run asks for, judged by study.Study.verdict, one row after another. candidate(seed) and base(seed): the
    val_bpb a run of the candidate and a control run of the tag's base make now; load(kind): the cores others keep
    busy beside a "control" or a "run" of the candidate. Its rows."""
    rows = list(SEEDED_BASE if rows is None else rows)
    start = len(rows)
    step = study.Next("propose")
    while True:
        if step.kind == "control":
            rows.append(row("control", "base", step.description, f"control on seed {step.seed}", base(step.seed),
                            commit=step.commit, seed=step.seed, load=load("control")))
        elif step.kind in ("propose", "series"):
            seed = study.seed(rows, config, [], rule)
            status, stats = study.Study(None, TAG, rule, rows).verdict(step.series, (config, seed, candidate(seed)),
                                                                       load("run"))
            rows.append(row(status, config, step.description or f"try {config}", stats["decision"],
                            candidate(seed), commit=f"{config}0000"[:7], seed=seed, load=load("run")))
        else:
            return rows[start:]
        step = study.next_run(rows, [], rule, False, "base")


def test_under_the_control_rule_a_survivors_runs_are_paired_with_the_champion_on_their_seeds_in_time():
    """The candidate's first run is screened alone; its control (a run of the tag's base) follows; every later
    pair runs its control first, so the candidate's row completes the pair and carries the verdict, judged on the
    pairs alone."""
    series = controlled("control", lambda seed: 0.95 + 0.001 * (seed % 2), lambda seed: 1.0 + 0.001 * (seed % 2))
    assert [(r.status, r.seed) for r in series] == [("confirm", 42), ("control", 42), ("control", 43), ("keep", 43)]
    assert all(descriptions.control_of(r.description) == "cand" for r in series if r.status == "control")
    assert series[-1].decision.endswith("after 2 runs (beside controls)")
    # a clear loss is discarded on its first run, as under the stat rule, with no control run
    assert [r.status for r in controlled("control", lambda seed: 1.1, lambda seed: 1.0)] == ["discard"]


def test_a_drift_that_speeds_up_the_machine_keeps_a_change_that_does_nothing_only_without_controls():
    """Issue 33: a change that does nothing, run while the machine is 3 noise sigmas faster than when the
    champion ran. Compared with the champion's runs from before, it is kept; beside controls made in the same
    minutes, it is not."""
    now = lambda seed: 0.97 + 0.002 * ((seed * 7) % 3)  # noqa: E731 - the champion's train.py, run today
    assert controlled("stat", now, now)[-1].status == "keep"
    series = controlled("control", now, now)
    assert series[-1].status == "discard", [(r.status, r.decision) for r in series]
    assert sum(r.status == "control" for r in series) == sum(r.status != "control" for r in series)


def test_controls_are_evidence_for_one_candidate_never_runs_of_the_champion():
    """A control is the champion's train.py on a seed the champion already ran: as a run of the champion it would
    shrink the noise estimate and move the champion's mean. It counts only in its candidate's pairs, keeps the
    candidate's series open, and a control that crashes closes it (no endless retries of a broken machine)."""
    from autoresearch import baseline, decide
    series = controlled("control", lambda seed: 0.95, lambda seed: 1.0)
    rows = SEEDED_BASE + series
    assert decide.samples(rows)["base"] == [1.0, 1.01, 0.99]
    assert baseline.control_diffs(rows, "base") == {"cand": [pytest.approx(-0.05)] * 2}
    opened = SEEDED_BASE + series[:2]
    assert decide.latest_unfinished(opened).config == "cand"
    step = study.next_run(opened, [], "control", False, "base")
    assert (step.kind, step.seed, step.commit) == ("control", 43, "c0ffee0")
    # in the parallel loop, a control in flight holds its candidate's series: nothing else of it goes out
    assert study.in_flight("base", step.description) == "cand"
    assert study.next_run(opened, ["cand"], "control", True, "base").kind == "propose"
    # an agent cannot write a control's description: its run would join another candidate's series
    assert descriptions.control_of(descriptions.clean(step.description)) == ""
    crashed = opened + [row("crash", "base", step.description + " [crash: exit status 1]", seed=43)]
    refused = SEEDED_BASE + series[:4] + [row("refused", "cand", "try cand [run 3] [refused: ran 40 s past its budget]",
                                              decide.REFUSED_CLOSES, seed=44)]
    assert decide.latest_unfinished(refused) is None  # no redraw on demand: train.py broke a rule after training
    assert decide.latest_unfinished(crashed) is None
    interrupted = opened + [row("crash", "base", step.description + " [interrupted: x]", "interrupted", seed=43)]
    assert study.next_run(interrupted, [], "control", True, "base").kind == "control"
    assert study.next_run(interrupted, [], "control", False, "base").kind == "wait"  # resumes as a new experiment


def test_no_agents_code_runs_as_a_control_so_a_champion_cannot_do_worse_when_it_is_run_again():
    """Red team: the champion is an agent's train.py. Run again as every later candidate's control, one that does
    worse on seeds it never ran (a later command's --seed) or after a given hour got a change that does nothing
    kept 64-67% of the time. Controls run the tag's base (no agent wrote it); a candidate and a champion are
    compared by their effects over it, each measured beside it in time."""
    a = controlled("control", lambda seed: 0.95, lambda seed: 1.0, config="a")
    assert a[-1].status == "keep" and {r.key for r in a if r.status == "control"} == {"base"}
    # b does what a does: no better, whatever a's code would have done as a control
    b = controlled("control", lambda seed: 0.95 + 0.001 * (seed % 2), lambda seed: 1.0, rows=SEEDED_BASE + a,
                   config="b")
    assert b[-1].status == "discard" and {r.key for r in b if r.status == "control"} == {"base"}, \
        [(r.status, r.key, r.decision) for r in b]
    assert all(r.commit == "c0ffee0" for r in b if r.status == "control")
    # a real gain over the champion is still seen: b's effect over the base beside a's
    c = controlled("control", lambda seed: 0.90, lambda seed: 1.0, rows=SEEDED_BASE + a, config="c")
    assert c[-1].status == "keep", [(r.status, r.decision) for r in c]


def test_load_put_beside_a_control_ends_the_series_so_an_agent_gains_nothing_by_it(monkeypatch):
    """Red team: a live agent keeps a process busy while the harness trains a control (it may: the agent runs
    beside the harness). On the wall clock the control trains fewer steps and does worse, so a change that does
    nothing looks better beside it. Every row records `load`, the cores others kept busy; a pair whose two runs'
    loads differ by more than half the load guard's limit ends its candidate's series, whichever run had it."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)  # pairs may differ by 0.25 cores, whatever the guard's limit
    same = lambda seed: 1.0 + 0.001 * (seed % 2)  # noqa: E731 - a no-op: the base's val_bpb on every seed
    loaded = lambda seed: same(seed) + 0.05       # noqa: E731 - the base trained beside the agent's busy process
    won = controlled("control", same, loaded, load=lambda kind: 0.0)  # a load nothing measured: the attack wins
    assert won[-1].status == "keep", [(r.status, r.decision) for r in won]
    lost = controlled("control", same, loaded, load=lambda kind: 0.9 if kind == "control" else 0.02)
    assert lost[-1].status == "discard" and lost[-1].decision.startswith("load-tilted pair on seed 42"), \
        [(r.status, r.decision) for r in lost]
    assert sum(r.status == "control" for r in lost) == 2  # ended at the first verdict the pairs would give
    # load beside the candidate's own run ends it too (a handicapped champion is a later copy's free gain)
    handicapped = controlled("control", lambda seed: 0.95, lambda seed: 1.0,
                             load=lambda kind: 0.9 if kind == "run" else 0.0)
    assert handicapped[-1].decision.startswith("load-tilted"), [(r.status, r.decision) for r in handicapped]
    # load alike on both runs of each pair (a busy neighbour all night) tilts nothing: a real gain is kept
    steady = controlled("control", lambda seed: 0.95, lambda seed: 1.0, load=lambda kind: 0.9)
    assert steady[-1].status == "keep", [(r.status, r.decision) for r in steady]
    # on the cpu clock others' load costs a run no steps: it is not read
    rows = SEEDED_BASE + [row("confirm", "cand", "x", "", 0.99, seed=42, load=0.0),
                          dataclasses.replace(row("control", "base", descriptions.control("cand", "x"), "", 1.0,
                                                  seed=42, load=0.9), clock="cpu")]
    from autoresearch import baseline
    assert baseline.tilted(rows, "cand", "base", (43, 0.0)) is None
    assert baseline.tilted(rows[:-1] + [dataclasses.replace(rows[-1], clock="wall")], "cand", "base") is not None
    # in the parallel loop a sibling worker's training is others' load: its rows (a worker's) are not read
    assert baseline.tilted([dataclasses.replace(r, clock="wall", worker="w1") for r in rows], "cand", "base") is None


def test_a_control_refused_after_it_trained_ends_its_candidates_series():
    """Red team: a control refused after it trained (a file the agent wrote into the work tree while it ran) was
    redrawn on its seed, so the pair could be drawn again until it suited the candidate (simulated: a no-op kept
    15%, 49% with the candidate's own refusals). Its row says REFUSED_CLOSES and the series ends, as a
    candidate's own refusal after training does."""
    from types import SimpleNamespace

    from autoresearch import decide
    opened = SEEDED_BASE + [row("confirm", "cand", "try cand", "P 0.7 after one run", 0.98, seed=42)]
    step = study.next_run(opened, [], "control", False, "base")
    ran = record.Trial("r1", "t", step.commit, step.description, seed=step.seed, config="base")
    ex = SimpleNamespace(status="refused", reason="files other than train.py changed (notes.txt)",
                         training=SimpleNamespace(wall=10.0, load=0.0, done_after=None))
    tag = SimpleNamespace(tag="t", fingerprint="f" * 12, budget_s=2, clock="wall")
    refused = study.Study(None, tag, "control", opened).row(ex, step.series, ran)
    assert (refused.status, refused.decision) == ("refused", decide.REFUSED_CLOSES)
    assert decide.latest_unfinished(opened + [refused]) is None
    # refused before it trained (no training wall time): no result, the control runs again
    early = study.Study(None, tag, "control", opened).row(SimpleNamespace(status="refused", reason="x",
                                                          training=SimpleNamespace(wall=0.0, load=None, done_after=None)),
                                                          step.series, ran)
    assert decide.latest_unfinished(opened + [early]).config == "cand"


def test_a_series_keeps_its_seeds_whatever_seed_a_later_command_gives():
    """Red team: a series begun with --seed 1000 and resumed without it ran its candidate on 42 and its control
    on 1001, and was decided on one pair."""
    started = SEEDED_BASE + [row("confirm", "cand", "lr up", "P 0.7 after one run", 0.98, seed=1000)]
    assert study.series_first(started, "cand") == 1000 and study.series_first(started, "x") == 42
    step = study.next_run(started, [], "control", False, "base")
    assert (step.kind, step.seed) == ("control", 1000)
    paired = started + [row("control", "base", step.description, "", 1.0, seed=1000)]
    assert study.next_run(paired, [], "control", False, "base").seed == 1001


def test_a_train_py_that_ran_before_is_no_new_experiment():
    """Red team (the stat rule too): a repeat of the champion joined its runs, so a champion's train.py that does
    worse when run again (after a given hour) raised its mean at will, and a later no-op was kept every time after
    4 such repeats; a configuration resubmitted after train.py had itself refused (or crashed, or pruned) was
    redrawn on its seed. Both loops refuse it before it trains; an interrupted run is no result."""
    from autoresearch import decide

    def rerun_problem(rows, config_id):
        return study.Study(None, TAG, "stat", rows).rerun_problem(config_id)
    assert "nothing changed" in rerun_problem(FULL_BASE, "base")
    assert rerun_problem(FULL_BASE, "cand") is None and rerun_problem([], "base") is None
    assert rerun_problem([row("crash", "base", "baseline [crash: exit status 1]")], "base") is None  # its retry
    for last in (row("refused", "cand", "x [refused: late]", decide.REFUSED_CLOSES), row("crash", "cand", "x"),
                 row("pruned", "cand", "x"), row("discard", "cand", "x", "", 1.1)):
        assert "ran before" in rerun_problem(FULL_BASE + [last], "cand"), last
    for last in (row("refused", "cand", "x [refused: other files changed]"),
                 row("crash", "cand", "x [interrupted: harness died]", "interrupted")):
        assert rerun_problem(FULL_BASE + [last], "cand") is None, last


# --- one night through both loops ------------------------------------------------------------------------------

LRS = [0.02, 0.5, 0.03, 0.035]  # the agent's proposals, in order: MATRIX_LR (the baseline has 0.04); 0.5 is hopeless


def fake_execute(ctx, attempt):
    """val_bpb as a function of train.py's MATRIX_LR and the seed: best at 0.03, noise of a few thousandths. Its
    step lines' loss too, and the loop's prune check sees them as a real training's (elapsed 0, 1, 2 s of the
    2 s budget): MATRIX_LR 0.5 is pruned at 1 s. The very first run of the night crashes (after one interrupted
    row: the baseline's retry gets the same seed). Every seed moves all configurations alike (0.003 a step) and
    each a little on its own (0.001): what paired seeds take out, and what they cannot."""
    import os
    from pathlib import Path
    import runtime
    trial = attempt.pending.trial
    repo, run_dir, seed, prune = ctx.repo, attempt.run_dir, trial.seed, attempt.prune
    with open(os.environ["PLANS"], "a") as f:  # what was planned for it (study.Plan), as execute receives it
        f.write(json.dumps([seed, trial.repeat, trial.run_no, trial.test_threshold, prune is not None]) + "\n")
    source = (repo / "train.py").read_text()
    lr = float(re.search(r"^MATRIX_LR = ([\d.]+)", source, re.M).group(1))
    log = run_dir / state.RUN_LOG
    log.write_text(f"trained with MATRIX_LR={lr} seed={seed}\n")
    training = supervise.Training(0, False, 1.0, 1.0, done_after=2.5, cpu_at_done=2.0)
    crashed = Path(os.environ["CRASH_ONCE"])
    if not crashed.exists():
        crashed.write_text("")
        return execute.Execution("crash", "exit status 1", None, {}, supervise.Training(1, False, None, 1.0))
    noise = (seed * 7919) % 5 - 2
    for step, elapsed in zip((10, 20, 30), (0, 1, 2)):  # from baseline.MIN_STEP on: judged
        line = runtime.step_line(step, 3 + 1 / (1 + elapsed) + 2 * abs(lr - 0.03) + 0.01 * noise, 1000, 1.0,
                                 elapsed, 1)
        with open(log, "a") as f:
            f.write(line + "\n")
        if prune is not None and (why := prune(float(elapsed), line)):
            return execute.Execution("pruned", why, None, {}, supervise.Training(None, False, None, 1.0, pruned=why))
    val = 2.0 + 20 * abs(lr - 0.03) + 0.003 * noise + 0.001 * ((seed * 31 + round(lr * 1000)) % 3 - 1)
    result = {"memory_gb": 0.1, "num_steps": 10, "compile_seconds": 0.1, "tokens_per_second": 1.0}
    evaluation = {"val_bpb": val, "test_bpb": val + 0.01, "audited": True}  # as if audited when scored: no audit
    state.atomic_json(run_dir / state.EVALUATION, evaluation)               # at the keep (test_audit.py has it)
    return execute.Execution("ok", "", result, evaluation, training)


AGENT = """import os, pathlib, re, sys
counter = pathlib.Path(os.environ["LR_COUNTER"])
n = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(n + 1))
lr = {lrs}[n % {k}]
path = pathlib.Path("train.py")
path.write_text(re.sub(r"^MATRIX_LR = [\\d.]+", f"MATRIX_LR = {{lr}}", path.read_text(), count=1, flags=re.M))
print(f"DESCRIPTION: MATRIX_LR {{lr}}")
"""


class FakeRay:
    """Ray's calls the driver makes, in process: every actor method runs when it is called."""

    class exceptions:
        class RayError(Exception):
            pass

        class RayTaskError(RayError):
            pass

    class Ref:
        def __init__(self, fn):
            try:
                self.value, self.error = fn(), None
            except Exception as e:  # noqa: BLE001 - handed back at get, as Ray does
                self.value, self.error = None, e

    class Actor:
        def __init__(self, obj):
            for name in ("join", "run"):
                method = getattr(obj, name)
                setattr(self, name, SimpleNamespace(remote=lambda *a, m=method: FakeRay.Ref(lambda: m(*a))))

    def remote(self, cls):
        return SimpleNamespace(options=lambda **kw: SimpleNamespace(
            remote=lambda *a: FakeRay.Actor(cls(*a))))

    def wait(self, refs, num_returns=1, timeout=None):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        if ref.error is not None:
            raise self.exceptions.RayTaskError(str(ref.error))
        return ref.value

    def kill(self, actor):
        pass


def night(repo, tmp_path, monkeypatch, parallel: bool, rule: str = "stat") -> list[Row]:
    """Six experiments (the baseline, its retry after a crash, four proposals), one worker, under the decision
    rule `rule`; the ledger they leave."""
    from autoresearch import driver
    monkeypatch.chdir(repo)
    monkeypatch.setattr(execute, "execute", fake_execute)
    monkeypatch.setenv("LR_COUNTER", str(tmp_path / f"counter-{parallel}"))
    monkeypatch.setenv("CRASH_ONCE", str(tmp_path / f"crashed-{parallel}"))
    monkeypatch.setenv("PLANS", str(tmp_path / f"plans-{parallel}"))
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT.format(lrs=LRS, k=len(LRS)))
    config = tags.setup(repo, "night", sandbox_mode="off", rule=rule)
    # a harness killed during the first baseline run: not the baseline's failure, in either loop
    ledger.append(state.results(repo), record.Trial("killed", "night", config.base_commit, "baseline").interrupted(
        config, "harness died"))
    args = argparse.Namespace(agent=f"{sys.executable} {agent}", agent_timeout=60, tag="night", sandbox="off",
                              decision=None, max_experiments=6, hours=None, workers=1, threads=1, ray_address=None)
    if parallel:
        d = driver.Driver(repo, config, args, FakeRay(), gpu=False, log=lambda *a: None)
        assert d.main(1) == 0
    else:
        assert loop.main(repo, args, log=lambda *a: None) == 0
    return ledger.read(state.results(repo), "night")


def both_nights(repo, env, tmp_path, monkeypatch, rule: str) -> tuple[list[Row], list[Row]]:
    """The same night through the sequential loop and the parallel driver: their ledgers, which must agree."""
    for key in ("AUTORESEARCH_CACHE", "AUTORESEARCH_TIME_BUDGET", "AUTORESEARCH_COMPILE_CACHE",
                "AUTORESEARCH_LOAD_LIMIT"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("AUTORESEARCH_PRUNE", "on")
    for key in ("OMP_NUM_THREADS", "AUTORESEARCH_BUDGET_CLOCK"):  # a worker sets them for its process: undone after
        monkeypatch.setenv(key, "1" if key == "OMP_NUM_THREADS" else "wall")
    import shutil
    twin = tmp_path / "twin"
    shutil.copytree(repo, twin)
    sequential = night(repo, tmp_path, monkeypatch, parallel=False, rule=rule)
    parallel = night(twin, tmp_path, monkeypatch, parallel=True, rule=rule)

    def decisions(rows):
        return [(descriptions.base_description(r.description), r.status, r.decision, r.seed, round(r.val_bpb, 6))
                for r in rows]
    assert decisions(sequential) == decisions(parallel)
    # and the same plan for every run (study.Study.plan, the one place both ask; record.Trial, the one shape both
    # execute): seed, repeat, place in its series, test threshold, whether it may be pruned
    plans = [(tmp_path / f"plans-{p}").read_text().splitlines() for p in (False, True)]
    assert plans[0] == plans[1] and len(plans[0]) == len(sequential) - 1, plans  # the killed row never ran here
    return sequential, parallel


@pytest.mark.slow
def test_the_sequential_loop_and_the_parallel_driver_decide_the_same_night(repo, env, tmp_path, monkeypatch):
    sequential, _ = both_nights(repo, env, tmp_path, monkeypatch, "stat")
    statuses = [r.status for r in sequential]
    # interrupted, the baseline's crash, its retry's three runs, then each proposal to its decision
    assert statuses[:5] == ["crash", "crash", "keep", "keep", "keep"], statuses
    assert sequential[2].description == "baseline (try 2)"
    assert {"discard", "keep"} <= set(statuses[5:]), statuses
    proposals = {descriptions.base_description(r.description) for r in sequential[5:]}
    assert proposals == {f"MATRIX_LR {lr}" for lr in LRS}
    # the hopeless proposal is stopped early in both loops (the driver ships the champion's curves to its worker),
    # and nothing else is
    assert [r.description for r in sequential if r.status == "pruned"] == ["MATRIX_LR 0.5"], statuses
    # paired seeds: every configuration's k-th run on seed 42 + k - 1; the crashed baseline's retry reuses 42
    assert [r.seed for r in sequential[1:5]] == [42, 42, 43, 44]
    assert all(r.seed == 42 + r.repeat - 1 for r in sequential[5:]), [(r.seed, r.repeat) for r in sequential]


@pytest.mark.slow
def test_both_loops_run_the_control_rules_pairs_the_same_way(repo, env, tmp_path, monkeypatch):
    """Under the control rule, both loops put each surviving candidate's runs beside control runs of the tag's
    base (its commit, on the same seeds, one right after the other) and decide on those pairs."""
    sequential, parallel = both_nights(repo, env, tmp_path, monkeypatch, "control")
    for rows in (sequential, parallel):
        assert any(r.status == "control" for r in rows), [(r.status, r.description) for r in rows]
        base = next(r for r in rows if r.status == "keep")
        for i, r in enumerate(rows):
            if r.status == "control":  # the tag's base, whatever the champion is by then
                assert (r.commit, r.key) == (base.commit, base.key)
                # its partner, the candidate on its seed, ran right before or right after it
                assert any(p.key == descriptions.control_of(r.description) and p.seed == r.seed
                           for p in rows[max(i - 1, 0):i] + rows[i + 1:i + 2]), (i, [(x.status, x.seed) for x in rows])
        decided = [r for r in rows[5:] if r.status in ("keep", "discard") and r.n >= 2]
        assert decided and all(r.decision.endswith("(beside controls)") for r in decided)


# Columns whose values are the machine's or the moment's (ids, times, hosts), not the harness's decisions; commit
# and config are kept as their order of first appearance (which rows share a commit or a train.py, not its hash)
VOLATILE = ("run_id", "time", "wall_s", "load", "host", "device", "fingerprint")
GOLDEN = "AUTORESEARCH_WRITE_GOLDEN"  # set: the test writes what it records as the expectation (once, reviewed)


def stable_rows(rows: list[Row]) -> str:
    """The ledger's rows, every column but VOLATILE, as results.tsv writes them; commits and configurations
    (in the config column and where a description names one) renamed by their order of first appearance."""
    order: dict[str, dict[str, str]] = {"commit": {}, "config": {}}
    columns = [c for c in ledger.COLUMNS if c not in VOLATILE]
    lines = ["\t".join(columns)]
    for r in rows:
        fields = dict(zip(ledger.COLUMNS, r.to_line().rstrip("\n").split("\t")))
        for key, seen in order.items():
            fields[key] = seen.setdefault(fields[key], f"{key}{len(seen) + 1}") if fields[key] else ""
        lines.append(fields)
    for fields in lines[1:]:  # a control's description names its candidate's configuration (its hash's start)
        for config, name in order["config"].items():
            fields["description"] = fields["description"].replace(config[:12], name)
    lines[1:] = ["\t".join(fields[c] for c in columns) for fields in lines[1:]]
    return "\n".join(lines) + "\n"


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["stat", "control"])
def test_a_short_loops_rows_are_the_ones_recorded_before(repo, env, tmp_path, monkeypatch, rule):
    """The rows of one short night (six experiments, the deterministic training above, the sequential loop) are,
    column by column, the ones tests/data/night-RULE.tsv recorded: a change of the house that moves code (the
    Study, the Trial, a module folded into another) must leave every decision, seed, mean, flag and description
    as it was. A change meant to alter them rewrites the file (AUTORESEARCH_WRITE_GOLDEN=1) in its own commit."""
    import os
    from pathlib import Path
    for key in ("AUTORESEARCH_CACHE", "AUTORESEARCH_TIME_BUDGET", "AUTORESEARCH_COMPILE_CACHE",
                "AUTORESEARCH_LOAD_LIMIT"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("AUTORESEARCH_PRUNE", "on")
    got = stable_rows(night(repo, tmp_path, monkeypatch, parallel=False, rule=rule))
    expected = Path(__file__).parent / "data" / f"night-{rule}.tsv"
    if os.environ.get(GOLDEN):
        expected.parent.mkdir(exist_ok=True)
        expected.write_text(got)
    assert got == expected.read_text()


# --- the package's shape ----------------------------------------------------------------------------------------


def package_imports() -> dict[str, set[str]]:
    """module -> the package's modules it imports, at the top or inside a function. A subpackage's modules are
    named from the package down (evaluator.graph; evaluator, its __init__), relative imports included."""
    import ast
    from pathlib import Path
    root = Path(__file__).parent.parent / "autoresearch"
    modules = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
               for p in root.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name.rsplit(".", 1)[0] if "." in name else ""
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:  # from .x import y, from . import x: within the module's own package
                base = ".".join(filter(None, [package, node.module]))
            elif node.module == "autoresearch" or (node.module or "").startswith("autoresearch."):
                base = node.module.removeprefix("autoresearch").lstrip(".")
            else:
                continue
            deps |= {".".join(filter(None, [base, a.name])) for a in node.names} | {base}
        graph[name] = deps & (set(modules) - {name})
    return graph


def repository_imports() -> dict[str, set[str]]:
    """package_imports() and the repository's top-level files (prepare.py, runtime.py, train.py): what each imports
    of the others and of the package, at the top or inside a function."""
    import ast
    from pathlib import Path
    root = Path(__file__).parent.parent
    graph = package_imports()
    top = {p.stem: p for p in root.glob("*.py")}
    def imported_part(tree):  # a script's `if __name__ == "__main__":` block runs as __main__, which no one imports
        for node in tree.body:
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                continue
            yield from ast.walk(node)
    for name, path in top.items():
        deps = set()
        for node in imported_part(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                mods = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for mod in mods:
                if mod in top:
                    deps.add(f"{mod}.py")
                elif mod.startswith("autoresearch."):
                    deps.add(mod.removeprefix("autoresearch."))
        graph[f"{name}.py"] = {d for d in deps if d in graph or d.removesuffix(".py") in top} - {f"{name}.py"}
    for name, path in package_imports().items():  # the package's imports of the top-level files
        source = (root / "autoresearch" / (name.replace(".", "/") + ".py"))
        if not source.exists():
            source = root / "autoresearch" / name.replace(".", "/") / "__init__.py"
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                graph[name] |= {f"{a.name}.py" for a in node.names if a.name in top}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module in top:
                graph[name].add(f"{node.module}.py")
    return graph


def test_the_package_has_no_import_cycle():
    """No cycle in the package, nor through the repository's top-level files (prepare.py's entry point once
    imported autoresearch.data, which imported confine, which imported prepare for the cache's path)."""
    graph = repository_imports()
    done, path = set(), []

    def visit(name):
        assert name not in path, "import cycle: " + " -> ".join(path[path.index(name):] + [name])
        if name in done:
            return
        path.append(name)
        for dep in sorted(graph[name]):
            visit(dep)
        path.pop()
        done.add(name)
    for name in sorted(graph):
        visit(name)


def test_no_module_uses_another_modules_private_names():
    from pathlib import Path
    root = Path(__file__).parent.parent
    names = "|".join(sorted({re.escape(n.rsplit(".", 1)[-1]) for n in package_imports()}))
    found = []
    for path in [*(root / "autoresearch").rglob("*.py"), *(root / "tests").glob("*.py"), *(root / "benchmarks").glob("*.py")]:
        for n, text in enumerate(path.read_text().splitlines(), 1):
            if re.search(rf"(?<![\w.])({names})\._[a-z]", text):
                found.append(f"{path.relative_to(root)}:{n}: {text.strip()}")
    assert not found, "\n".join(found)


def test_the_architecture_table_is_the_code_s():
    """docs/architecture.md's table of modules names every module of the package once, each in the layer its
    imports give it (one more than the highest it imports): the picture a newcomer reads is the code's."""
    from pathlib import Path
    graph = package_imports()
    layers: dict[str, int] = {}

    def layer(name):
        if name not in layers:
            layers[name] = 1 + max((layer(d) for d in graph[name]), default=-1)
        return layers[name]
    modules = {n for n in graph if n not in ("__init__", "evaluator", "evaluator.__main__")}
    text = (Path(__file__).parent.parent / "docs" / "architecture.md").read_text()
    listed = re.findall(r"^\| (\d+) \| `([\w.]+)` \|", text, re.M)
    names = [name for _, name in listed]
    assert sorted(names) == sorted(set(names)), "listed twice: " + ", ".join(n for n in set(names) if names.count(n) > 1)
    assert set(names) == modules, f"missing: {sorted(modules - set(names))}, not a module: {sorted(set(names) - modules)}"
    wrong = [f"{name}: {given}, the code's {layer(name)}" for given, name in listed if int(given) != layer(name)]
    assert not wrong, "\n".join(wrong)
