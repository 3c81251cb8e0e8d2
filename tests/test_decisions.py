"""The decision rule inside `autoresearch run`: a confirmation series, and a SIGKILL in the middle of one (the
baseline's three runs: test_harness.test_keep_discard_crash_and_status)."""

import json

import pytest
from autoresearch import ledger, record, tagconfig
from conftest import cli, sh


pytestmark = pytest.mark.slow  # every test here trains through the real harness

def rows(repo):
    return ledger.read(repo / "results.tsv")


def head(repo):
    return sh(repo, "git", "rev-parse", "HEAD")


def noisy_champion(repo, tag, values):
    """Baseline rows for HEAD's train.py, written as the harness writes them: a champion whose runs spread so
    widely that any candidate's first run is inside the discard margin and gets confirmation runs."""
    config = tagconfig.read(repo / ".autoresearch" / "tags" / f"{tag}.json")
    blob = sh(repo, "git", "rev-parse", "HEAD:train.py")[:12]
    for i, value in enumerate(values):
        ledger.append(repo / "results.tsv", record.make_row(
            config, head(repo), "baseline", f"base{i}", "keep", val_bpb=value, memory_gb=0.1, steps=5, wall=10.0, seed=42 + i, config=blob,
            repeat=i + 1, n=i + 1, decision=f"baseline {i + 1}/3"))


def test_sigkill_in_the_middle_of_a_confirmation_series_resumes_with_no_run_lost_or_counted_twice(repo, env):
    assert cli(repo, "setup", "--tag", "k", env=env).returncode == 0
    base = head(repo)
    noisy_champion(repo, "k", [2.5, 4.5, 3.5])  # mean 3.5, noise 1.0: every candidate gets a second run
    (repo / "train.py").write_text((repo / "train.py").read_text() + "# a candidate\n")
    # the harness kills itself while the evaluator scores the series' second run
    killed = cli(repo, "run", "-m", "candidate", env=dict(env, AUTORESEARCH_KILL_AT="evaluating-run-2"))
    assert killed.returncode == -9
    first = rows(repo)[3:]
    assert [r.status for r in first] == ["confirm"] and first[0].n == 1
    candidate = sh(repo, "git", "rev-parse", "HEAD")
    assert candidate != base and first[0].commit == candidate[:7]
    assert (repo / ".autoresearch" / "pending.json").exists()

    # the agent's next edit cannot run before the series is finished; the next command says so and keeps the edit
    (repo / "train.py").write_text((repo / "train.py").read_text() + "# the agent's next idea\n")
    out = cli(repo, "run", "-m", "next idea", env=env)
    assert out.returncode == 2 and "is unfinished" in out.stderr and "git stash" in out.stderr
    assert "# the agent's next idea" in (repo / "train.py").read_text()  # the edit is not lost
    sh(repo, "git", "checkout", "--", "train.py")

    # the next command records the killed run once, stays on the candidate and finishes its series
    out = cli(repo, "run", "-m", "resume", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "candidate " + candidate[:7] + ": run 2" in out.stdout
    after = rows(repo)[3:]
    assert after[0].run_id == first[0].run_id
    assert after[1].status == "crash" and after[1].decision == "interrupted" and after[1].commit == candidate[:7]
    series = [r for r in after if r.status != "crash"]
    assert all(r.commit == candidate[:7] and r.config == first[0].config for r in series)
    assert [r.n for r in series] == list(range(1, len(series) + 1))  # the killed run is not counted
    assert all(r.status == "confirm" for r in series[:-1]) and series[-1].status in ("keep", "discard")
    assert len({r.run_id for r in rows(repo)}) == len(rows(repo))
    # paired seeds: the series' k-th run on seed 42 + k - 1, the champion's k-th; the killed run's retry reuses it
    assert [r.seed for r in series] == [42 + k for k in range(len(series))]
    assert after[1].seed == series[1].seed
    assert all("[run " in r.description for r in series[1:])
    assert head(repo) == (candidate if series[-1].status == "keep" else base)
    assert not (repo / ".autoresearch" / "pending.json").exists()


def test_the_cpu_clock_counts_only_the_compute_a_process_received(monkeypatch):
    import time

    import runtime
    monkeypatch.setenv("AUTORESEARCH_BUDGET_CLOCK", "cpu")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    clock = runtime.budget_clock()
    c0, t0 = clock(), time.perf_counter()
    time.sleep(0.3)  # the machine gives this time to others: it must not count
    assert clock() - c0 < 0.05 and time.perf_counter() - t0 >= 0.3
    c0 = clock()
    end = time.process_time() + 0.2
    while time.process_time() < end:  # 0.2 s of CPU on one of two threads: 0.1 s of the budget
        pass
    assert 0.09 < clock() - c0 < 0.15
    monkeypatch.setenv("AUTORESEARCH_BUDGET_CLOCK", "wall")
    assert runtime.budget_clock() is time.perf_counter


def test_a_tag_on_the_cpu_clock_records_it_on_every_row(repo, env):
    cpu = dict(env, AUTORESEARCH_BUDGET_CLOCK="cpu")
    assert cli(repo, "setup", "--tag", "c", "--decision", "naive", env=cpu).returncode == 0
    assert json.loads((repo / ".autoresearch" / "tags" / "c.json").read_text())["clock"] == "cpu"
    out = cli(repo, "run", "-m", "baseline", env=cpu)
    assert out.returncode == 0, out.stdout + out.stderr
    [row] = rows(repo)
    assert row.status == "keep" and row.clock == "cpu" and row.load is not None and row.load >= 0
    log = next((repo / ".autoresearch" / "runs").glob("*/run.log")).read_text()
    assert "clock=cpu" in log and "threads=" in log
    out = cli(repo, "run", "-m", "on the wall clock", env=env)  # the other clock: refused, never compared
    assert out.returncode == 1 and "this tag runs on the cpu clock" in out.stderr
