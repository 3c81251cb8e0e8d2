"""A night that survives the people around it (issue 20): what users legitimately do next to a running loop (the
stop button, a second terminal, a venv in the clone, another process on the machine, an agent with a short shell
timeout) never costs them a run, and the morning's commands tell them what they got."""

import os
import subprocess
import sys
import time

import pytest
from conftest import cli, sh

from autoresearch import guard, ledger, load


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


def test_the_stop_button_a_report_and_a_venv_next_to_a_real_run(repo, env):
    """The loop runs its second experiment; meanwhile someone presses the dashboard's stop button in a browser,
    runs `autoresearch report` and `git status` in a second terminal, and the clone has a .venv with a FIFO in
    it (read whole, it would hang the guard). The run is recorded normally, and the loop stops after it."""
    from selenium.webdriver.common.by import By
    from test_dashboard import browser, start_dashboard, wait_until

    os.mkfifo(_venv(repo) / "fifo")
    loop_proc = subprocess.Popen([sys.executable, "-m", "autoresearch.cli", "loop", "--tag", "night", "--decision",
                                  "naive", "--max-experiments", "3"], cwd=repo, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
    driver = browser()
    dash, url = start_dashboard(repo, env)
    try:
        runs = repo / ".autoresearch" / "runs"
        wait_until(lambda: sum("step=" in p.read_text() for p in runs.glob("*/run.log")) == 2, timeout=240,
                   what="the second run in flight")  # after the first, so that there is something to report
        driver.get(url)
        wait_until(lambda: driver.find_element(By.ID, "stop").is_displayed(), what="the stop button")
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
    assert [r.status in ("keep", "discard") for r in rows] == [True, True], [r.description for r in rows]
    assert not (repo / ".autoresearch" / "stop").exists()  # read once: the next loop is not stopped by it


def _venv(repo):
    venv = repo / ".venv" / "lib"
    venv.mkdir(parents=True)
    (venv / "site.py").write_text("# a package\n")
    return repo / ".venv"
