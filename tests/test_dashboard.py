"""The dashboard in a real browser (headless Chromium, driven by Selenium), and its facts as JSON and as a static
report. CI installs Chromium (.ci/run); where no browser can be installed the browser test is skipped, never in
CI."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import STALL_ROOM, cli

from autoresearch import git, ledger, loop, record, state, tags, tokens

pytestmark = pytest.mark.slow  # every test here trains through the real harness

ARTIFACTS = Path(os.environ.get("AUTORESEARCH_TEST_ARTIFACTS", "/tmp/autoresearch-test-artifacts"))


def add_runs(repo, config, specs):
    """Rows as a loop writes them: (status, val_bpb, description, change); a change is a new train.py commit
    off the base, so that its diff is real."""
    base = config.base_commit
    source = (repo / "train.py").read_text()
    ledger.create(repo / "results.tsv")
    for i, (status, value, description, change) in enumerate(specs):
        commit = base
        if change:
            commit = git.commit_with(repo, base, "train.py", source.replace("DEPTH = ", f"{change}\nDEPTH = ", 1),
                                     description)
        run_id = f"20261130-0000{i:02d}-{i:06x}"
        row = record.make_row(config, commit, description, run_id, status, val_bpb=value,
                       memory_gb=0.4 if value else 0.0, steps=40 if value else 0, wall=8.0, seed=42 + i, config=git.git(repo, "rev-parse", f"{commit}:train.py")[:12],
                       mean=value or None, n=1 if value else 0, decision="baseline 1/3" if i == 0 else "",
                       worker="w1", device="cpu x1")
        ledger.append(repo / "results.tsv", row)
        if status == "crash":
            log = state.state_dir(repo) / "runs" / run_id / "run.log"
            log.parent.mkdir(parents=True)
            log.write_text("Traceback (most recent call last):\nRuntimeError: shapes do not match\n")


@pytest.fixture
def tag(repo, env, monkeypatch):
    for key in ("AUTORESEARCH_CACHE", "AUTORESEARCH_TIME_BUDGET"):
        monkeypatch.setenv(key, env[key])
    config = tags.setup(repo, "dash")
    (repo / "results.tsv").unlink()  # the dashboard must cope with no ledger yet
    return config


def browser():
    """Headless Chromium through Selenium, or a skip (a failure in CI) saying what is missing."""
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    missing = [name for name, path in (("chromium", chrome), ("chromedriver", driver)) if not path]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("selenium (pip)")
    if missing:
        message = f"no browser for the dashboard test: {', '.join(missing)} missing (apt-get install chromium " \
                  "chromium-driver; pip install -e '.[dev]')"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = chrome
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


def start_dashboard(repo, env):
    proc = subprocess.Popen([sys.executable, "-m", "autoresearch.cli", "dashboard", "--port", "0"], cwd=repo,
                            env=dict(env, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    assert match, line + proc.stdout.read() if proc.poll() is not None else line
    return proc, f"http://127.0.0.1:{match.group(1)}/"


def wait_until(condition, timeout=120, what="the page"):
    end = time.time() + timeout
    while time.time() < end:
        try:
            value = condition()
        except Exception:  # noqa: BLE001 - an element not there yet
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_dashboard_renders_updates_live_and_asks_the_loop_to_stop(repo, env, tag):
    from selenium.webdriver.common.by import By
    driver = browser()
    proc, url = start_dashboard(repo, env)
    try:
        driver.get(url)
        empty = wait_until(lambda: driver.find_element(By.ID, "empty"), what="the page")
        wait_until(lambda: empty.is_displayed(), what="'no experiments yet'")
        assert "no experiments yet" in empty.text
        add_runs(repo, tag, [("keep", 1.60, "baseline", None), ("discard", 1.70, "deeper model", "DEPTH_NOTE = 1"),
                             ("crash", 0.0, "wider model [crash: exit status 1]", "WIDTH_NOTE = 1")])
        wait_until(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#runs tr.run")) == 3,
                   what="three rows, without a reload")
        assert not empty.is_displayed()
        wait_until(lambda: driver.find_elements(By.CSS_SELECTOR, "#plot .main-svg"), what="the plot")
        points = driver.find_elements(By.CSS_SELECTOR, "#plot .scatterlayer .point")
        assert len(points) >= 3, "every run a point"
        text = driver.find_element(By.ID, "runs").text
        assert "deeper model" in text and "1.700000" in text and "+0.100000" in text  # delta to the champion
        assert "champion: 1.600000" in driver.find_element(By.ID, "tags").text
        # a row appended now appears without a reload
        add_runs(repo, tag, [("keep", 1.55, "shorter warmdown", "WARMDOWN_NOTE = 1")])
        wait_until(lambda: "shorter warmdown" in driver.find_element(By.ID, "runs").text, what="the new row")
        # a loop turn's tokens (tokens.py), as the loop records them: the tag's line shows the night's
        from test_tokens import M1, claude_session
        claude_session(repo.parent / "agent-home", [M1])
        turn = tokens.record(repo, "turn", "claude", state.now(), repo.parent / "agent-home", tag="dash")
        tokens.add_run(turn, "20261130-000001-000001")  # the deeper model's
        night = f"agent tokens {sum(M1.values()):,} | {sum(M1.values()):,} per experiment (1) | no keep yet"
        wait_until(lambda: night in driver.find_element(By.ID, "tags").text, what="the agent's tokens")
        # a row's diff, and a crash's log tail
        driver.find_element(By.XPATH, "//tr[contains(@class,'run')][td[contains(.,'wider model')]]").click()
        detail = wait_until(lambda: (d := driver.find_element(By.CSS_SELECTOR, "tr.detail pre")).text != "…" and d,
                            what="the diff")
        assert "+WIDTH_NOTE = 1" in detail.text and "shapes do not match" in detail.text
        # the stop button only writes the file the loop reads
        driver.find_element(By.ID, "stop").click()
        wait_until(lambda: state.stop_file(repo).exists(), what="the stop file")
        wait_until(lambda: "stop requested" in driver.find_element(By.ID, "stop").text, what="the button's state")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "dashboard.png"))
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        driver.quit()
        proc.kill()
        proc.wait()
    # read-only but that (agent-tokens: the test's)
    assert sorted(p.name for p in state.state_dir(repo).iterdir()) == ["agent-tokens", "runs", "stop", "tags"]


def test_the_loop_reads_the_stop_file_once_and_forgets_a_stale_one(repo):
    path = state.stop_file(repo)
    path.parent.mkdir(parents=True)
    path.write_text("left from yesterday")
    requested = loop.dashboard_stop(repo)
    assert not path.exists() and not requested()
    path.write_text("from the dashboard")
    assert requested() and not path.exists() and not requested()


def test_status_and_report_as_json_and_a_self_contained_html_report(repo, env, tag, tmp_path):
    add_runs(repo, tag, [("keep", 1.60, "baseline", None), ("discard", 1.70, "deeper", "DEPTH_NOTE = 1")])
    with open(repo / "results.tsv", "a") as f:
        f.write("abc1234\t1.5\t0.4\tkeep\ttorn")  # a write cut short
    out = cli(repo, "status", "--json", env=env)
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout)
    [t] = facts["tags"]
    assert t["tag"] == "dash" and t["champion"]["mean"] == 1.6 and t["counts"]["discard"] == 1
    assert [r["description"] for r in t["rows"]] == ["baseline", "deeper"] and t["rows"][1]["worker"] == "w1"
    assert any("torn" in w for w in facts["warnings"])
    # what train.py may still carry beyond the base: the work tree's, with a line added
    (repo / "train.py").write_text((repo / "train.py").read_text() + "EXTRA = 1\n")
    room = json.loads(cli(repo, "status", "--json", env=env).stdout)["carried"]
    assert 0 < room["carried_bytes"] < 100 and room["left_bytes"] == room["limit_bytes"] - room["carried_bytes"]
    text = cli(repo, "status", env=env).stdout
    assert f"train.py carries {room['carried_bytes']:,} of the {room['limit_bytes']:,} bytes" in text
    report = json.loads(cli(repo, "report", "--json", env=env).stdout)
    assert report["tags"][0]["rows"] == t["rows"]
    page = tmp_path / "night.html"
    out = cli(repo, "report", "--html", str(page), env=env)
    assert out.returncode == 0 and str(page) in out.stdout
    html = page.read_text()
    assert "Plotly" in html and "+DEPTH_NOTE = 1" in html and "/*FACTS*/null" not in html
    assert not re.search(r"<script[^>]+src=", html), "a report must not load anything"


def test_a_port_in_use_is_a_clear_error(repo, env, tag):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = cli(repo, "dashboard", "--port", str(port), env=env, timeout=STALL_ROOM)
    assert out.returncode == 2 and f"port {port} on 127.0.0.1 is in use" in out.stderr and "--port" in out.stderr


def test_a_static_report_s_page_holds_no_markup_of_a_row_s_text():
    """The red team's: `report --html` escaped only `</`; a description holding `<!--<script ` put the page's parser
    in a state where its own `</script>` no longer ended the script. Every `<` of the facts is escaped."""
    from autoresearch import facts
    html = facts.page({"tags": [{"rows": [{"description": "x <!--<script </script>"}]}]})
    facts = html.split("<!--<script", 1)
    assert len(facts) == 1 and "\\u003c!--\\u003cscript \\u003c/script>" in html
