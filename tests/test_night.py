"""A night that survives the people around it (issue 20): what users legitimately do next to a running loop (the
stop button, a second terminal, a venv in the clone, another process on the machine, an agent with a short shell
timeout) never costs them a run, and the morning's commands tell them what they got."""

import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import ROOT, cli, sh

from autoresearch import guard, ledger, machine, processes, tags


# --- the guard: what the training could touch, not what people do ------------------------------------------


def _clone_like(tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    (repo / ".gitignore").write_text(".venv/\n.autoresearch/\nresults.tsv\nprogress.png\n__pycache__/\n")
    (repo / "train.py").write_text("x = 1\n")
    sh(repo, "git", "init", "-q", "-b", "main")
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    (repo / "results.tsv").write_text("header\n")
    (repo / ".autoresearch" / "tags").mkdir(parents=True)
    (repo / ".autoresearch" / "tags" / "t.json").write_text("{}")
    return repo


def test_the_stop_file_report_outputs_a_venv_and_git_status_are_not_tampering(tmp_path):
    repo = _clone_like(tmp_path)
    venv = repo / ".venv" / "lib"
    venv.mkdir(parents=True)
    (venv / "big.so").write_bytes(b"x" * 1000)
    os.mkfifo(repo / ".venv" / "fifo")  # read whole, it would block the guard forever
    unreadable = venv / "secret"
    unreadable.write_text("no")
    unreadable.chmod(0)
    watch = guard.Guard(repo, exclude=[])
    assert not any(rel.startswith(".venv") for rel in watch.before), "a .venv is not read on every run"
    # what the user and the harness do meanwhile
    (repo / ".autoresearch" / "stop").write_text("")
    (repo / "progress.png").write_bytes(b"png")
    (venv / "new.py").write_text("installed meanwhile")
    index = (repo / ".git" / "index").read_bytes()
    os.utime(repo / "train.py", (time.time() + 5, time.time() + 5))  # same content: `git status` refreshes
    sh(repo, "git", "status")                                         # the index's stat data, not its meaning
    assert (repo / ".git" / "index").read_bytes() != index  # the bytes did change
    assert watch.changes() == []


def test_the_record_bytecode_and_the_index_s_meaning_are_still_guarded(tmp_path):
    repo = _clone_like(tmp_path)
    watch = guard.Guard(repo, exclude=[])
    (repo / "results.tsv").write_text("forged\n")
    (repo / ".autoresearch" / "tags" / "t.json").write_text('{"budget_s": 1}')
    (repo / "__pycache__").mkdir()
    (repo / "__pycache__" / "prepare.cpython-312.pyc").write_bytes(b"forged")
    (repo / "sneaky.py").write_text("")
    sh(repo, "git", "add", "sneaky.py")  # staged: the next commit would carry it
    os.mkfifo(repo / "pipe")
    changed = watch.changes()
    assert changed == [".autoresearch/tags/t.json (changed)", ".git/index (changed)",
                       "__pycache__/prepare.cpython-312.pyc (added)", "pipe (added)", "results.tsv (changed)",
                       "sneaky.py (added)"]
    watch.restore()
    assert (repo / "results.tsv").read_text() == "header\n" and not (repo / "pipe").exists()
    assert sh(repo, "git", "ls-files") == ".gitignore\ntrain.py"


def test_ignoring_a_file_during_the_run_does_not_hide_it(tmp_path):
    repo = _clone_like(tmp_path)
    watch = guard.Guard(repo, exclude=[])
    with open(repo / ".git" / "info" / "exclude", "a") as f:
        f.write("planted.txt\n")
    (repo / "planted.txt").write_text("")
    assert watch.changes() == [".git/info/exclude (changed)", "planted.txt (added)"]


def test_a_package_hidden_behind_its_own_ignore_rule_is_found(tmp_path):
    """`python -m autoresearch.cli` runs with the repository first on sys.path: a planted numpy/ would run there."""
    repo = _clone_like(tmp_path)
    watch = guard.Guard(repo, exclude=[])
    (repo / "numpy").mkdir()
    (repo / "numpy" / ".gitignore").write_text("*\n")
    (repo / "numpy" / "__init__.py").write_text("import os; os.system('echo pwned')\n")
    (repo / "progress.png").write_bytes(b"png")  # ignored by a rule that was there: not a change
    assert watch.changes() == ["numpy/.gitignore (added)", "numpy/__init__.py (added)"]
    watch.restore()
    assert not (repo / "numpy" / "__init__.py").exists() and (repo / "progress.png").exists()


# --- next to a running loop: the stop button, a report, `git status`, a venv in the clone ----------------------


@pytest.mark.slow
def test_the_stop_button_a_report_and_a_venv_next_to_a_real_run(repo, env):
    """The loop runs its second experiment; meanwhile someone presses the dashboard's stop button in a browser,
    runs `autoresearch report` and `git status` in a second terminal, and the clone has a .venv with a FIFO in
    it (read whole, it would hang the guard). The run is recorded normally, and the loop stops after it."""
    from selenium.webdriver.common.by import By
    from test_dashboard import browser, start_dashboard, wait_until

    os.mkfifo(_venv(repo) / "fifo")
    # A browser, a dashboard and a report share 2 cores with the training: the tag gets room outside its budget
    # (this test is about the guard, not the allowance, which test_integrity covers).
    env = dict(env, AUTORESEARCH_OUTSIDE_ALLOWANCE="120")
    loop_proc = subprocess.Popen([sys.executable, "-m", "autoresearch.cli", "loop", "--tag", "night", "--decision",
                                  "naive", "--max-experiments", "5"], cwd=repo, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
    driver = browser()
    dash, url = start_dashboard(repo, env)
    try:
        runs = repo / ".autoresearch" / "runs"
        driver.get(url)  # the page and its button ready before the second run: only the click waits for it
        wait_until(lambda: driver.find_element(By.ID, "stop").is_displayed(), what="the stop button")
        wait_until(lambda: sum("step=" in p.read_text() for p in runs.glob("*/run.log")) >= 2, timeout=240,
                   what="the second run in flight")  # after the first, so that there is something to report
        driver.find_element(By.ID, "stop").click()
        wait_until(lambda: (repo / ".autoresearch" / "stop").exists(), what="the stop file")
        report = cli(repo, "report", env=env)
        assert report.returncode == 0 and (repo / "progress.png").exists(), report.stderr
        sh(repo, "git", "status")
        out, _ = loop_proc.communicate(timeout=300)
    finally:
        driver.quit()
        dash.kill()
        loop_proc.kill()
    assert loop_proc.returncode == 0, out
    assert "stopping: asked to" in out
    rows = ledger.read(repo / "results.tsv")
    # stopped after the experiment in flight when the button was pressed: the second, or on a slow machine the
    # third (a run of 2 s may end before the click lands), never all five
    assert len(rows) in (2, 3) and all(r.status in ("keep", "discard") for r in rows), [r.description for r in rows]
    assert not (repo / ".autoresearch" / "stop").exists()  # read once: the next loop is not stopped by it


def _venv(repo):
    venv = repo / ".venv" / "lib"
    venv.mkdir(parents=True)
    (venv / "site.py").write_text("# a package\n")
    return repo / ".venv"


# --- the sandbox wherever the interpreter lives -------------------------------------------------------------


@pytest.mark.slow
def test_a_venv_under_tmp_runs_in_the_sandbox(repo, env, tmp_path, bwrap_or_skip):
    """The sandbox's /tmp is private: a venv there, and a PYTHONPATH entry there that train.py imports from, must
    be mounted into it."""
    bwrap_or_skip()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
    # this interpreter's packages, wherever they are: --system-site-packages alone gives a venv made from a venv
    # (the README's .venv in the clone) the base Python's, without the project's dependencies
    import site
    (next(venv.glob("lib/python*/site-packages")) / "parent.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    python = str(venv / "bin" / "python")
    extra = tmp_path / "extra"  # a PYTHONPATH entry under /tmp with a module train.py imports
    extra.mkdir()
    (extra / "helper_for_train.py").write_text("LR_SCALE = 1.0\n")
    env = dict(env, PYTHONPATH=f"{env['PYTHONPATH']}{os.pathsep}{extra}")
    source = (repo / "train.py").read_text()
    (repo / "train.py").write_text(source.replace("\nimport torch\n", "\nimport torch\nimport helper_for_train\n", 1))
    sh(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "uses a helper")
    assert cli(repo, "setup", "--tag", "v", "--sandbox", "on", "--decision", "naive", env=env).returncode == 0
    out = subprocess.run([python, "-m", "autoresearch.cli", "run", "-m", "from a venv in /tmp"], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    [row] = ledger.read(repo / "results.tsv")
    assert row.status == "keep" and row.protection == "bwrap"


# --- a busy machine delays the night, it does not end it ----------------------------------------------------


def test_the_wait_threshold_scales_with_the_cores(monkeypatch):
    monkeypatch.delenv("AUTORESEARCH_LOAD_LIMIT", raising=False)
    assert machine.limit(2) == 0.5 and machine.limit(8) == pytest.approx(0.8) and machine.limit(64) == pytest.approx(6.4)
    monkeypatch.setenv("AUTORESEARCH_LOAD_LIMIT", "3")
    assert machine.limit(2) == 3.0
    monkeypatch.setenv("AUTORESEARCH_LOAD_LIMIT", "lots")
    with pytest.raises(machine.Settings, match="AUTORESEARCH_LOAD_LIMIT='lots' is not a number"):
        machine.limit(2)


@pytest.mark.slow
@pytest.mark.serial  # a busy core, or two workers of one thread: the whole machine
def test_a_busy_machine_delays_the_loop_and_the_run_follows(repo, env):
    """A process keeps a core busy: the loop says so (and `status` too), waits, and runs once it is gone. With
    AUTORESEARCH_LOAD_WAIT=1 each wait gives up after a second, and the loop waits again instead of ending."""
    busy = dict(env, AUTORESEARCH_LOAD_LIMIT="0.5", AUTORESEARCH_LOAD_WAIT="1", PYTHONUNBUFFERED="1")
    hog = subprocess.Popen(processes.tied_to_parent([sys.executable, "-c", "while True: pass"]))  # dies with pytest
    proc = subprocess.Popen([sys.executable, "-m", "autoresearch.cli", "loop", "--tag", "b", "--decision", "naive",
                             "--max-experiments", "1"], cwd=repo, env=busy, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if sum("still busy" in s for s in seen) >= 2:
                break
        assert proc.poll() is None, "".join(seen)  # still there, waiting
        for _ in range(20):  # `status` says so too (between two waits it may not: try a few times)
            status = cli(repo, "status", env=busy)
            if "waiting for a quiet machine" in status.stdout:
                break
        assert "waiting for a quiet machine" in status.stdout and f"pid {hog.pid}" in status.stdout, status.stdout
    finally:
        hog.kill()
        hog.wait()
    rest, _ = proc.communicate(timeout=300)
    out = "".join(seen) + rest
    assert proc.returncode == 0, out
    assert "waiting for a quiet machine" in out and f"pid {hog.pid}" in out
    [row] = ledger.read(repo / "results.tsv")
    assert row.status == "keep"


# --- the morning: exit codes, best, sample, clean, stop, and an agent's detached run ------------------------


@pytest.mark.slow
def test_every_command_checks_its_environment_and_exit_codes_say_what_happened(repo, env):
    out = cli(repo, "--version", env=env)
    assert out.returncode == 0 and out.stdout.startswith("autoresearch 0.")
    assert cli(repo, "setup", "--tag", "e", env=env).returncode == 0
    for command in (["status"], ["status", "--json"], ["report"], ["best"], ["clean"], ["wait"]):
        out = cli(repo, *command, env=dict(env, AUTORESEARCH_TIME_BUDGET="abc"))
        assert out.returncode == 2 and "AUTORESEARCH_TIME_BUDGET" in out.stderr, (command, out.stderr)
        assert "Traceback" not in out.stderr
    out = cli(repo, "status", env=dict(env, AUTORESEARCH_LOAD_WAIT="soon"))
    assert out.returncode == 2 and "AUTORESEARCH_LOAD_WAIT='soon' is not a number" in out.stderr
    plain, as_json = cli(repo, "report", env=env), cli(repo, "report", "--json", env=env)
    assert plain.returncode == as_json.returncode == 2 and "no experiments for tag e yet" in as_json.stderr
    out = cli(repo, "best", env=env)
    assert out.returncode == 2 and "no kept run yet" in out.stderr
    out = cli(repo, "stop", env=env)
    assert out.returncode == 0 and "no loop is running" in out.stdout
    assert not (repo / ".autoresearch" / "stop").exists()  # a later loop would not be stopped by it anyway
    out = cli(repo, "wait", env=env)
    assert out.returncode == 0 and "nothing is running" in out.stdout
    (repo / "notes.txt").write_text("x")  # a refusal is a refused experiment (1), not a usage error (2)
    out = cli(repo, "run", "-m", "x", env=env)
    assert out.returncode == 1 and "only train.py may be edited" in out.stderr


@pytest.mark.slow
def test_a_crash_names_its_commit_and_the_command_that_brings_it_back(repo, env):
    assert cli(repo, "setup", "--tag", "c", "--decision", "naive", env=env).returncode == 0
    broken = (repo / "train.py").read_text().replace("\nimport torch\n", "\nimport torch\nraise SystemExit('typo here')\n", 1)
    (repo / "train.py").write_text(broken)
    out = cli(repo, "run", "-m", "a typo", env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    [row] = ledger.read(repo / "results.tsv")
    assert row.status == "crash" and f"the train.py that crashed is commit {row.commit}" in out.stdout
    command = f"git show {row.commit}:train.py > train.py"
    assert command in out.stdout and "typo here" not in (repo / "train.py").read_text()
    subprocess.run(command, shell=True, cwd=repo, check=True)
    assert (repo / "train.py").read_text() == broken


@pytest.mark.slow
def test_an_agent_detaches_a_run_waits_for_it_and_the_morning_commands_show_the_result(repo, env):
    """The stat baseline (three runs) in the background; `wait` in steps; then `best`, `sample` and `clean`."""
    assert cli(repo, "setup", "--tag", "d", env=env).returncode == 0
    out = cli(repo, "run", "-m", "baseline", "--detach", env=env)
    assert out.returncode == 0 and "started in the background" in out.stdout, out.stdout + out.stderr
    out = cli(repo, "wait", "--timeout", "1", env=env)  # still running: `run --detach` returned before it
    assert out.returncode == 3 and "still running: `autoresearch run`" in out.stdout
    out = cli(repo, "wait", "--timeout", "600", env=env, timeout=700)
    assert out.returncode == 0, out.stdout
    assert out.stdout.count("keep: val_bpb=") == 3  # the three runs' summaries
    rows = ledger.read(repo / "results.tsv")
    assert [r.status for r in rows] == ["keep"] * 3

    best = cli(repo, "best", env=env)
    assert best.returncode == 0, best.stderr
    assert "champion of tag d: val_bpb" in best.stdout and "over 3 run(s)" in best.stdout
    assert f".autoresearch/runs/{rows[-1].run_id}/out/model.graph.json" in best.stdout
    assert "no change yet" in best.stdout and "test_bpb" in best.stdout
    one = cli(repo, "sample", "--tokens", "12", "--temperature", "0", "--prompt", "The cat", env=env)
    two = cli(repo, "sample", "--tokens", "12", "--temperature", "0", "--prompt", "The cat", env=env)
    assert one.returncode == 0 and one.stdout == two.stdout and one.stdout.startswith("The cat"), one.stderr
    assert len(one.stdout.strip()) > len("The cat")

    dry = cli(repo, "clean", env=env)
    older = [r.run_id for r in rows[:2]]
    assert dry.returncode == 0 and "would delete" in dry.stdout, dry.stdout  # (and any unused compile base)
    assert sum(f"/{r}/out/model." in dry.stdout for r in older for _ in (0,)) == 2 and dry.stdout.count("/out/model.") == 4
    assert all(run_id in dry.stdout for run_id in older) and rows[-1].run_id not in dry.stdout
    assert all((repo / ".autoresearch/runs" / r / "out/model.safetensors").exists() for r in older)
    out = cli(repo, "clean", "--yes", env=env)
    assert out.returncode == 0 and "deleted" in out.stdout and out.stdout.count("/out/model.") == 4
    assert not any((repo / ".autoresearch/runs" / r / "out/model.safetensors").exists() for r in older)
    assert all((repo / ".autoresearch/runs" / r.run_id / "run.log").exists() for r in rows)  # records stay
    assert len(ledger.read(repo / "results.tsv")) == 3 and cli(repo, "best", env=env).stdout == best.stdout


@pytest.mark.slow
def test_the_loop_gives_its_agent_the_rules_and_one_instruction_not_the_cli_driver_s_manual(repo, env):
    from autoresearch import agents
    shutil.copy(ROOT / "program.md", repo / "program.md")
    ledger.create(repo / "results.tsv")
    prompt = agents.build_prompt(repo, "t")
    assert "## The rules" in prompt and "prepare.finish(model, stats, EVAL_BATCH_SIZE)" in prompt
    assert "exactly ONE change to `train.py`" in prompt and "then stop" in prompt
    for contradiction in ("Never stop", "forever", "autoresearch run -m", "--detach"):
        assert contradiction not in prompt, contradiction
    program = (ROOT / "program.md").read_text()  # the agent that drives the CLI itself gets what it needs
    assert "AUTORESEARCH_CACHE" in program and "--detach" in program and "autoresearch wait" in program
    assert "~/.cache/autoresearch/manifest.json" not in program


def test_an_unsandboxed_run_cannot_slip_past_the_guard(tmp_path):
    """What a fresh-eyed attack on the guard found: an fsmonitor hook in .git/config (git runs it on every read
    of the index, the guard's own git calls included), a directory left where the tag file was, package metadata
    at the repository's root (import torch loads entry points from it), a hidden skip-worktree bit."""
    repo = _clone_like(tmp_path)
    (repo / "pkg.egg-info").mkdir()
    (repo / "pkg.egg-info" / "PKG-INFO").write_text("Name: pkg\n")
    with open(repo / ".gitignore", "a") as f:
        f.write("*.egg-info/\nbuild/\n")
    sh(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "ignore")
    watch = guard.Guard(repo, exclude=[])
    sh(repo, "git", "update-index", "--skip-worktree", "train.py")  # before the hook: this git would run it
    sh(repo, "git", "config", "core.fsmonitor", "echo FORGED >> results.tsv; true")
    (repo / ".autoresearch" / "tags" / "t.json").unlink()
    (repo / ".autoresearch" / "tags" / "t.json").mkdir()
    (repo / "pkg.egg-info" / "entry_points.txt").write_text("[torch.backends]\nx = build:f\n")
    (repo / "build").mkdir()
    (repo / "build" / "__init__.py").write_text("def f(): print('pwned')\n")  # ignored by an old rule: still found
    changed = watch.changes()
    assert "FORGED" not in (repo / "results.tsv").read_text()  # the hook never ran
    for path in (".git/config", ".autoresearch/tags/t.json", "pkg.egg-info/entry_points.txt", "build/__init__.py",
                 ".git/index"):
        assert any(c.startswith(path + " ") for c in changed), (path, changed)
    assert watch.restore() == []
    assert (repo / ".autoresearch" / "tags" / "t.json").read_text() == "{}"
    assert not (repo / "build" / "__init__.py").exists() and not (repo / "pkg.egg-info" / "entry_points.txt").exists()
    assert "fsmonitor" not in (repo / ".git" / "config").read_text()


@pytest.mark.slow
def test_an_agent_that_edits_the_record_is_restored_and_named(repo, env, tmp_path, monkeypatch):
    from autoresearch import agents
    for key in ("AUTORESEARCH_CACHE", "AUTORESEARCH_TIME_BUDGET"):
        monkeypatch.setenv(key, env[key])
    tags.setup(repo, "a")
    ledger_before = (repo / "results.tsv").read_text()
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\necho '# tweak' >> train.py\necho forged >> results.tsv\n"
                      "echo 'DESCRIPTION: a tweak'\n")
    script.chmod(0o755)
    description = agents.ExternalAgent(repo, "a", str(script), timeout=60).propose()
    from autoresearch import sandbox
    if sandbox.bwrap_works():  # confined: the record is read-only to it, its write failed
        assert description == "a tweak"
    else:  # checked afterwards: restored and named
        assert description.startswith("a tweak [agent changed results.tsv (changed): restored")
    assert (repo / "results.tsv").read_text() == ledger_before
    assert (repo / "train.py").read_text().endswith("# tweak\n")  # its one legitimate change stays
