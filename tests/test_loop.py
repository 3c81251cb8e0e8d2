"""The autonomous loop: built-in proposer, external agents, report."""

import ast
import difflib
import json
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from autoresearch import ledger, record, tags
from autoresearch.sites import EditError, read_constants, set_constants
from conftest import ROOT, STALL_ROOM, cli, reviewed_train_source, sh
from test_harness import rows

# --- editing constants -----------------------------------------------------------------------


def test_set_constants_rewrites_only_the_active_profile_literal():
    source = reviewed_train_source()
    edited = set_constants(source, {"DEPTH": 6, "MATRIX_LR": 0.031, "WINDOW_PATTERN": "SSL"}, "cpu")
    diff = [l for l in difflib.unified_diff(source.splitlines(), edited.splitlines(), lineterm="", n=0)
            if l[:1] in "+-" and not l.startswith(("+++", "---"))]
    assert len(diff) == 6
    assert read_constants(edited, "cpu")["DEPTH"] == 6 and read_constants(edited, "gpu")["DEPTH"] == 8
    assert read_constants(edited, "cpu")["WINDOW_PATTERN"] == "SSL"
    gpu = set_constants(source, {"DEPTH": 12}, "gpu")
    assert read_constants(gpu, "gpu")["DEPTH"] == 12 and read_constants(gpu, "cpu")["DEPTH"] == 4
    with pytest.raises(EditError, match="no constant"):
        set_constants(source, {"NOT_A_CONSTANT": 1})

# --- the built-in proposer, without training -------------------------------------------------------


def test_the_tpe_proposer_edits_only_assignments_and_never_repeats(repo, env, tmp_path, monkeypatch):
    from autoresearch.proposer import TPEProposer

    monkeypatch.setenv("AUTORESEARCH_CACHE", env["AUTORESEARCH_CACHE"])
    monkeypatch.setenv("AUTORESEARCH_TIME_BUDGET", env["AUTORESEARCH_TIME_BUDGET"])
    config = tags.setup(repo, "p")
    base = (repo / "train.py").read_text()
    seen = set()
    for i in range(12):
        proposer = TPEProposer(repo, "p", "cpu", seq_len=32, seed=i)  # a fresh process each time
        description = proposer.propose()
        new = (repo / "train.py").read_text()
        ast.parse(new)
        changed = [l for l in difflib.unified_diff(base.splitlines(), new.splitlines(), lineterm="", n=0)
                   if l.startswith("+") and not l.startswith("+++")]
        assert 1 <= len(changed) <= 4 and all(l[1:].split("=")[0].strip().isupper() for l in changed)
        assert " -> " in description
        key = repr(sorted(read_constants(new).items()))
        assert key not in seen
        seen.add(key)
        # record it as if it had run, so the next proposer learns it from results.tsv and git
        sh(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", description)
        head = sh(repo, "git", "rev-parse", "HEAD")
        ledger.append(repo / "results.tsv", record.make_row(config, head, description, f"r{i}", "discard", val_bpb=3.0 + i / 100,
                                                      memory_gb=0.1, steps=5, wall=10.0, seed=42))
        sh(repo, "git", "reset", "-q", "--hard", config.base_commit)
    study = TPEProposer(repo, "p", "cpu", seq_len=32)
    study.sync()
    assert len([t for t in study.study.get_trials() if t.state.name == "COMPLETE"]) == 12

# --- the loop end to end ----------------------------------------------------------------------


@pytest.mark.slow
def test_builtin_loop_runs_resumes_and_keeps_the_baseline(repo, env):
    """The built-in proposer's night, under the naive rule (one run per experiment: the stat rule's series, through
    both loops, are tests/test_schedule.py's and test_harness's)."""
    from autoresearch import descriptions
    out = cli(repo, "loop", "--tag", "night", "--max-experiments", "2", "--decision", "naive", env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    first = rows(repo)
    # not a terminal: plain lines (the training's step lines among them), no progress bar's carriage returns
    assert "\r" not in out.stdout + out.stderr and re.search(r"^  step=\s*1 \| loss=", out.stdout, re.M)
    assert [r.description for r in first][:1] == ["baseline"] and first[0].status == "keep"
    from autoresearch import proposer
    assert len(first) == 2 and proposer.parse_move(first[1].description)[0] and first[1].status in ("keep", "discard")
    # restart: the same tag continues with its history (and its rule), no proposal repeats
    out = cli(repo, "loop", "--max-experiments", "1", env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    all_rows = rows(repo)
    assert len({r.config for r in all_rows}) == 3 and sum(r.description == "baseline" for r in all_rows) == 1
    assert len({descriptions.base_description(r.description) for r in all_rows}) == 3
    assert all(r.decision.startswith("naive:") for r in all_rows)
    ast.parse((repo / "train.py").read_text())
    assert sh(repo, "git", "rev-parse", "--short=7", "HEAD") == [r for r in all_rows if r.status == "keep"][-1].commit


AGENT = textwrap.dedent('''
    import re, sys
    prompt = sys.stdin.read()
    assert "Results so far" in prompt and "DESCRIPTION:" in prompt
    src = open("train.py").read()
    src = re.sub(r"^WARMDOWN_RATIO = .*$", "WARMDOWN_RATIO = 0.3", src, flags=re.M)
    open("train.py", "w").write(src)
    if "--sneaky" in sys.argv:
        try:  # read-only in the agent's confinement; where there is none, the loop reverts it afterwards
            open("prepare.py", "a").write("# easier metric\\n")
        except OSError as e:
            print("prepare.py:", e.strerror)
    print("thinking...")
    print("DESCRIPTION: shorter warmdown (0.3)")
''')


@pytest.mark.slow
def test_external_agent_drives_the_loop_and_is_kept_to_train_py(repo, env, tmp_path):
    (tmp_path / "agent.py").write_text(AGENT)
    agent = f"{sys.executable} {tmp_path / 'agent.py'} --sneaky"
    out = cli(repo, "loop", "--tag", "ext", "--agent", agent, "--max-experiments", "2", "--decision", "naive",
              env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    baseline, change = rows(repo)
    assert baseline.description == "baseline"
    assert change.description.startswith("shorter warmdown (0.3)")
    from autoresearch import sandbox
    if sandbox.bwrap_works():  # confined (confine.wrap_agent): the write itself failed
        assert "reverted" not in change.description
    else:
        assert "agent also edited prepare.py: reverted" in change.description
    assert change.status in ("keep", "discard")
    assert (repo / "prepare.py").read_text() == (ROOT / "prepare.py").read_text()


def test_missing_agent_binary_is_a_clear_error(repo, env):
    out = cli(repo, "loop", "--agent", "no-such-agent-binary --flag", "--max-experiments", "1", env=env)
    assert out.returncode == 2 and "not on PATH" in out.stderr and "--agent builtin" in out.stderr
    assert not (repo / "results.tsv").exists()

# --- report ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_report_writes_a_png_and_a_summary(tmp_path):
    path = tmp_path / "results.tsv"
    ledger.create(path)
    data = [("keep", 2.10, "baseline"), ("discard", 2.15, "DEPTH 4 -> 6"), ("keep", 2.05, "MATRIX_LR 0.04 -> 0.06"),
            ("crash", 0.0, "typo"), ("keep", 2.00, "TOTAL_BATCH_SIZE 4096 -> 2048")]
    for i, (status, bpb, desc) in enumerate(data):
        ledger.append(path, ledger.Row(f"c{i:06d}", bpb, 0.5, status, desc, "t", f"r{i}", "now", 300, 10, 310, "f", 42))
    # the harness's evaluation of the kept models, with the held-out test split
    for run_id, test_bpb in (("r0", 2.12), ("r2", 2.09), ("r4", 2.07)):
        run_dir = tmp_path / ".autoresearch" / "runs" / run_id
        run_dir.mkdir(parents=True)
        (run_dir / "evaluation.json").write_text(json.dumps({"val_bpb": 0.0, "test_bpb": test_bpb}))
    out = tmp_path / "progress.png"
    proc = subprocess.run([sys.executable, "-m", "autoresearch.cli", "report", "--results", str(path), "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10000
    assert "baseline val_bpb 2.100000 -> champion 2.000000 at c000004" in proc.stdout and "4.76% better" in proc.stdout
    assert "3 keep, 1 discard, 1 crash" in proc.stdout
    kept_lines = [l.split() for l in proc.stdout.splitlines() if l.startswith("  c")]
    assert [(l[0], l[1], l[4]) for l in kept_lines] == [("c000000", "2.100000", "2.120000"),
                                                        ("c000002", "2.050000", "2.090000"),
                                                        ("c000004", "2.000000", "2.070000")]
    assert "held-out test_bpb 2.120000 -> 2.070000 (+0.050000)" in proc.stdout


@pytest.mark.slow
def test_ctrl_c_records_the_experiment_in_flight(repo, env):
    slow = dict(env, AUTORESEARCH_TIME_BUDGET="60")
    # SIGINT as a terminal's Ctrl-C delivers it: a runner started in the background by a shell without job control
    # (`cmd &` in a script) passes SIGINT down ignored, and the loop would never see it
    loop = subprocess.Popen([sys.executable, "-m", "autoresearch.cli", "loop", "--tag", "cc"], cwd=repo, env=slow,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not any("step=" in p.read_text()
                                                  for p in (repo / ".autoresearch" / "runs").glob("*/run.log")):
            time.sleep(0.2)
        loop.send_signal(signal.SIGINT)
        out, _ = loop.communicate(timeout=STALL_ROOM)
    finally:  # never leave a 60 s training running beside the tests that follow
        if loop.poll() is None:
            loop.kill()
            loop.communicate()
    assert loop.returncode == 130, out
    [row] = rows(repo)
    assert row.status == "crash" and "interrupted by Ctrl-C" in row.description
    pending = repo / ".autoresearch" / "pending.json"
    assert not pending.exists()
    out = cli(repo, "loop", "--max-experiments", "0", env=slow)  # a restart continues the same tag quietly
    assert out.returncode == 0, out.stdout + out.stderr
    assert "loop on autoresearch/cc" in out.stdout and "new tag" not in out.stdout and len(rows(repo)) == 1


@pytest.mark.slow
def test_report_shows_the_noise_and_repeated_configurations(repo):
    """Runs of the same train.py (the same git blob) are one configuration: mean +- sem with the pooled noise."""
    base = sh(repo, "git", "rev-parse", "--short=7", "HEAD")
    (repo / "train.py").write_text((repo / "train.py").read_text() + "\n# a change\n")
    sh(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "change")
    changed = sh(repo, "git", "rev-parse", "--short=7", "HEAD")
    path = repo / "results.tsv"
    ledger.create(path)
    runs = [(base, 2.00), (base, 2.02), (changed, 1.95), (base, 2.01), (changed, 1.97)]
    for i, (commit, bpb) in enumerate(runs):
        status = "keep" if i == 0 or bpb < 1.96 else "discard"
        ledger.append(path, ledger.Row(commit, bpb, 0.5, status, "d", "t", f"r{i}", "now", 300, 10, 310, "f", i))
    proc = subprocess.run([sys.executable, "-m", "autoresearch.cli", "report", "--results", str(path), "--out",
                           str(repo / "p.png")], capture_output=True, text=True, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    # pooled: base 2.00/2.02/2.01 (squares 0.0002), changed 1.95/1.97 (squares 0.0002): sqrt(0.0004 / 3)
    assert "varies by 0.0115 (std, pooled over 3 repeats)" in proc.stdout
    assert f"1.960000 +- 0.008165  n=2  {changed}" in proc.stdout
    assert f"2.010000 +- 0.006667  n=3  {base}" in proc.stdout


def test_the_loop_stops_after_three_failed_proposals_in_a_row(monkeypatch):
    """An agent that fails to propose (its command errors or times out) is asked again; three failures in a row
    stop the loop with exit status 1 and say why, and a proposal that succeeds in between starts the count
    again."""
    from types import SimpleNamespace

    from autoresearch import agents, loop, study

    script = iter(["fail", "fail", "try lr 0.02", "fail", "fail", "fail", "never asked"])
    asked, ran, logged = [], [], []

    class Agent:
        name = "scripted"

        def propose(self):
            answer = next(script)
            asked.append(answer)
            if answer == "fail":
                raise agents.AgentError("the agent's command exited 1")
            return answer

    night = loop.Night.__new__(loop.Night)  # the night's state alone: no tag, no repository
    night.repo, night.args, night.log, night.rule = None, SimpleNamespace(max_experiments=None), logged.append, "stat"
    night.agent, night.deadline, night.begun, night.failures, night.stopping, night.turn = Agent(), None, 0, 0, False, None
    night.stop = lambda: False
    monkeypatch.setattr(night, "rows", lambda: [])
    monkeypatch.setattr(night, "recorded", lambda outcome: None)
    monkeypatch.setattr(loop.study, "next_run", lambda *a: study.Next("propose", new=True))
    monkeypatch.setattr(loop.tags, "config_of", lambda repo, commit: "c" * 12)
    monkeypatch.setattr(loop.git, "head", lambda repo: "0" * 40)
    monkeypatch.setattr(night, "patiently", lambda description: ran.append(description) or "outcome")
    assert night.run() == 1
    assert asked == ["fail", "fail", "try lr 0.02", "fail", "fail", "fail"] and ran == ["try lr 0.02"]
    assert logged.count("three failed proposals in a row: stopping") == 1
    assert sum("agent failed to propose" in line for line in logged) == 5


def test_the_parallel_loop_stops_after_three_failed_proposals_in_a_row():
    """The parallel driver's proposals fail the same way (an agent's command errors): the worker is freed for
    the next ask and the experiment is not counted as begun; the third failure in a row stops the loop."""
    import concurrent.futures
    from types import SimpleNamespace

    from autoresearch import agents, driver

    d = driver.Driver.__new__(driver.Driver)  # its proposal bookkeeping alone: no Ray, no workers running
    logged = []
    d.log, d.failures, d.started, d.free, d.proposing = logged.append, 0, 3, [], {}
    d.workers = {"w1": None, "w2": None, "w3": None}
    d.proposers = SimpleNamespace(session=lambda name: None)

    def failed(name):
        future = concurrent.futures.Future()
        future.set_exception(agents.AgentError("the agent's command exited 1"))
        d.proposing[future] = name
        return future

    d.proposed(failed("w1"))
    d.proposed(failed("w2"))
    assert (d.free, d.started, d.failures, d.proposing) == (["w1", "w2"], 1, 2, {})
    assert sum("agent failed to propose" in line for line in logged) == 2
    with pytest.raises(driver.Stop, match="three failed proposals in a row"):
        d.proposed(failed("w3"))
