"""The causality audit made when a series is kept (issue 54): a candidate's runs are scored with the probes every
run gets, and audited (the 4,603 probes of evaluator/probes.py) only if their series ends in a keep, before the
keep is recorded; the same export gives the same scores; a keep whose audit fails is refused."""

from __future__ import annotations

import dataclasses
import json
import shutil
from types import SimpleNamespace

import pytest

from autoresearch import decide, study


def plan_of(rule: str, kept: bool, step: study.Next) -> bool:
    rows = [SimpleNamespace(status="keep")] if kept else []
    return study.Study(None, None, rule, rows).audit_at_keep(step)


def test_only_a_candidates_runs_under_a_repeating_rule_wait_for_their_keep():
    """What waits: a candidate's runs (new, or the next of its series) under stat and control once there is a
    champion. What is audited when scored, as before: every baseline run (each is kept as it ends), every run under
    the naive rule (kept exactly when it may be), a control (never scored as a keep), a run before any champion."""
    baseline = decide.Series("baseline", "c0", "b0", "baseline", 1)
    candidate = decide.Series("candidate", "c1", "x1", "an idea", 1)
    for rule in decide.REPEATING:
        assert plan_of(rule, True, study.Next("propose", new=True))
        assert plan_of(rule, True, study.Next("series", series=candidate, run_no=2))
        assert not plan_of(rule, True, study.Next("series", series=baseline, run_no=2))
        assert not plan_of(rule, True, study.Next("control", series=candidate, seed=43))
        assert not plan_of(rule, False, study.Next("baseline"))
        assert not plan_of(rule, False, study.Next("propose", new=True))
    assert not plan_of("naive", True, study.Next("propose", new=True))


def set_lrs(source: str, value: float) -> str:
    from autoresearch.sites import set_constants
    return set_constants(source, {name: value for name in ("MATRIX_LR", "EMBEDDING_LR", "UNEMBEDDING_LR",
                                                            "SCALAR_LR")}, "cpu")


@pytest.mark.slow
def test_a_candidates_runs_are_audited_when_its_series_is_kept_with_the_same_scores(repo, env, monkeypatch):
    """Through the CLI, a stat tag: the base learns nothing (every learning rate 0), the candidate learns, so its
    series ends in a keep. Its runs are scored with 459 probes and audited at the keep: each run's export scored
    again with 4,603 probes, the same val_bpb and test_bpb. The baseline's runs are audited when scored, as before.
    Then the audit itself: an export whose recorded score is not what it scores, or that is gone, refuses."""
    from conftest import cli, sh

    from autoresearch import audit, execute, fixed, ledger, sandbox, state, tags
    from autoresearch.evaluator.probes import AUDIT_PROBES, CAUSAL_PROBES
    learning = (repo / "train.py").read_text()
    (repo / "train.py").write_text(set_lrs(learning, 0.0))
    sh(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "a base that learns nothing")
    assert cli(repo, "setup", "--tag", "a", env=env).returncode == 0
    out = cli(repo, "run", "-m", "baseline", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    (repo / "train.py").write_text(learning)
    out = cli(repo, "run", "-m", "learning rates back", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = ledger.read(repo / "results.tsv")
    base, mine = rows[:3], rows[3:]
    assert [r.status for r in base] == ["keep"] * 3
    assert mine[-1].status == "keep" and all(r.status == "confirm" for r in mine[:-1]), [r.status for r in mine]
    assert out.stdout.count("auditing run") == len(mine), out.stdout
    for r in base:
        evaluation = json.loads((state.run_dir(repo, r.run_id) / state.EVALUATION).read_text())
        assert evaluation["audited"] and evaluation["causal_probes"] > CAUSAL_PROBES
        assert not (state.run_dir(repo, r.run_id) / audit.AUDIT).exists()
        assert not audit.waited_for_keep(state.run_dir(repo, r.run_id))
    for r in mine:
        run_dir = state.run_dir(repo, r.run_id)
        scored = json.loads((run_dir / state.EVALUATION).read_text())
        made = json.loads((run_dir / audit.AUDIT).read_text())
        assert scored["audit_at_keep"] and not scored["audited"] and scored["causal_probes"] <= CAUSAL_PROBES
        assert audit.waited_for_keep(run_dir)  # what the parallel driver asks of a series this loop began
        assert made["audited"] and CAUSAL_PROBES < made["causal_probes"] <= AUDIT_PROBES
        assert (made["val_bpb"], made["test_bpb"]) == (scored["val_bpb"], scored["test_bpb"])
        assert (round(scored["val_bpb"], 6), round(scored["test_bpb"], 6)) == (r.val_bpb, r.test_bpb)

    monkeypatch.setenv("AUTORESEARCH_CACHE", env["AUTORESEARCH_CACHE"])  # the tag's data and secret draw
    config = tags.load_tag(repo)
    ctx = execute.Context(repo, config, "none", fixed.of_tag(repo, config))
    kept = mine[-1]
    copy = repo.parent / "copy"
    shutil.copytree(state.run_dir(repo, kept.run_id), copy)
    assert audit.check(ctx, copy, (kept.val_bpb, kept.test_bpb)) is None  # the recorded scores: it passes
    # the scores it is held to are the row's, never a file in the run's directory (a training without a sandbox
    # could write one there): an evaluation.json that says anything else changes nothing
    scored = json.loads((copy / state.EVALUATION).read_text())
    (copy / state.EVALUATION).write_text(json.dumps(dict(scored, val_bpb=1.0, test_bpb=1.0, audited=True)))
    assert audit.check(ctx, copy, (kept.val_bpb, kept.test_bpb)) is None
    assert "scored val_bpb" in audit.check(ctx, copy, (kept.val_bpb - 0.1, kept.test_bpb))
    (copy / sandbox.OUT_DIR / fixed.contract_files()[2]).unlink()
    assert "exported model is gone" in audit.check(ctx, copy, (kept.val_bpb, kept.test_bpb))


@pytest.mark.slow
def test_a_series_begun_by_run_and_kept_by_the_parallel_driver_gets_its_audits(repo, env, monkeypatch):
    """`autoresearch run` leaves a candidate's audits for its keep; if the harness dies mid-series and the parallel
    loop finishes it, its driver makes them before the keep (Driver.audit_begun_series), here without Ray: the
    first run waits for its audit, the driver's check audits it with 4,603 probes against its row's scores."""
    from conftest import cli, sh

    from autoresearch import audit, driver, ledger, state, tags
    from autoresearch.evaluator.probes import CAUSAL_PROBES
    learning = (repo / "train.py").read_text()
    (repo / "train.py").write_text(set_lrs(learning, 0.0))
    sh(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "a base that learns nothing")
    assert cli(repo, "setup", "--tag", "d", env=env).returncode == 0
    assert cli(repo, "run", "-m", "baseline", env=env).returncode == 0
    (repo / "train.py").write_text(learning)
    killed = cli(repo, "run", "-m", "learning rates back", env=dict(env, AUTORESEARCH_KILL_AT="evaluating-run-2"))
    assert killed.returncode == -9, killed.stdout + killed.stderr
    rows = ledger.read(repo / "results.tsv")
    first = rows[-1]
    assert first.status == "confirm" and first.test_bpb is not None, [(r.status, r.decision) for r in rows]
    assert audit.waited_for_keep(state.run_dir(repo, first.run_id))

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = tags.load_tag(repo)
    logged = []
    fake = type("D", (), {"repo": repo, "config": config, "log": logged.append})()
    assert driver.Driver.audit_begun_series(fake, rows, first.config) is None, logged
    made = json.loads((state.run_dir(repo, first.run_id) / audit.AUDIT).read_text())
    assert made["audited"] and made["causal_probes"] > CAUSAL_PROBES and len(logged) == 1
    assert round(made["val_bpb"], 6) == first.val_bpb
    # an export that no longer gives its row's score refuses the keep
    lying = [r if r.run_id != first.run_id else dataclasses.replace(r, val_bpb=r.val_bpb - 0.1) for r in rows]
    assert "scored val_bpb" in driver.Driver.audit_begun_series(fake, lying, first.config)
