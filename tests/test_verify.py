"""`autoresearch verify` (verify.py, verified.py): the champion without each keep, and beside the tag's base at a
longer budget, through the real CLI on a short tag; a kill during it and the resume; the table in status --json,
report and the dashboard's page."""

import dataclasses
import json
import re
import subprocess
import sys

import pytest

from conftest import STALL_ROOM, cli, sh
from test_dashboard import browser, wait_until

from autoresearch import descriptions, ledger, record, tagconfig, verified


def deterministic(source: str) -> str:
    """The tests' train.py trained for a fixed 3 steps at a constant learning rate, never by its clock: the same
    train.py on the same seed then scores the same, however loaded the machine (under a budget of 20 s that the 3
    steps end long before: at 4 s a loaded machine cut some runs at 2), so a keep that changes nothing contributes
    exactly nothing."""
    source = source.replace("    while budget.running():\n", "    while budget.running() and budget.steps < 3:\n", 1)
    return source.replace("multiplier = lr_multiplier(budget.progress)", "multiplier = lr_multiplier(0.0)", 1)


def commit(repo, message):
    sh(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", message)
    return sh(repo, "git", "rev-parse", "HEAD")


def rows_of(repo, verification=True):
    return ledger.read(repo / "results.tsv", "v", verification=verification)


def night(repo, env):
    """A short tag: its baseline and three keeps recorded as a night would have (the rows written here, the commits
    real): MATRIX_LR 0.04 -> 0.05, then 0.05 -> 0.06 (so the first no longer reverts), then a comment (a no-op)."""
    (repo / "train.py").write_text(deterministic((repo / "train.py").read_text()))
    commit(repo, "deterministic")
    assert cli(repo, "setup", "--tag", "v", env=env).returncode == 0
    config = tagconfig.read(repo / ".autoresearch/tags/v.json")
    base = sh(repo, "git", "rev-parse", "HEAD")
    results = repo / "results.tsv"

    def rows(commit_, description, decisions, values):
        blob = sh(repo, "git", "rev-parse", f"{commit_}:train.py")[:12]
        for i, (decision, value) in enumerate(zip(decisions, values)):
            ledger.append(results, record.make_row(
                config, commit_, descriptions.repeated(description, i + 1) if i else description, f"r{commit_[:5]}{i}",
                "keep", val_bpb=value, seed=42 + i, config=blob, repeat=i + 1, decision=decision))

    rows(base, "baseline", ["baseline 1/3", "baseline 2/3", "baseline 3/3"], [3.0, 3.01, 2.99])
    for old, new, text in (("MATRIX_LR = 0.04", "MATRIX_LR = 0.05", "MATRIX_LR 0.04 -> 0.05"),
                           ("MATRIX_LR = 0.05", "MATRIX_LR = 0.06", "MATRIX_LR 0.05 -> 0.06"),
                           ("\ndef main():", "\n# a comment: changes nothing\ndef main():", "a no-op")):
        source = (repo / "train.py").read_text()
        assert old in source
        (repo / "train.py").write_text(source.replace(old, new, 1))
        rows(commit(repo, text), text, ["P 0.99 >= 0.98 after 2 runs"] * 2, [2.9, 2.91])
    return base


def test_the_plan_reverts_each_keep_that_applies_and_names_the_one_that_does_not(repo, env, monkeypatch):
    from autoresearch import verify
    monkeypatch.setenv("AUTORESEARCH_CACHE", env["AUTORESEARCH_CACHE"])
    night(repo, env)
    config = tagconfig.read(repo / ".autoresearch/tags/v.json")
    champion = sh(repo, "git", "rev-parse", "HEAD")
    plan = verify.plan(repo, config, rows_of(repo), verify.Options(seeds=2, budget=5, scale="DEPTH=3"))
    assert plan.champion == champion
    assert len(plan.notes) == 1 and "MATRIX_LR 0.04 -> 0.05" in plan.notes[0] and "does not revert" in plan.notes[0]
    ablate = [p for p in plan.runs if p.budget == config.budget_s and "transfer" not in p.description]
    # seed by seed: the champion beside each keep it carries, reverted
    assert [(p.seed, descriptions.parse_verification(p.description)["kind"]) for p in ablate] == \
        [(42, "champion"), (42, "ablate"), (42, "ablate"), (43, "champion"), (43, "ablate"), (43, "ablate")]
    without_second = next(p for p in ablate if "MATRIX_LR 0.05 -> 0.06" in p.description)
    assert "MATRIX_LR = 0.05" in without_second.source and "# a comment" in without_second.source
    without_noop = next(p for p in ablate if "a no-op" in p.description)
    assert "MATRIX_LR = 0.06" in without_noop.source and "# a comment" not in without_noop.source
    transfer = [p for p in plan.runs if "transfer" in p.description]
    assert [(p.budget, p.seed) for p in transfer] == [(b, s) for b in (2, 5, 5) for s in (1000, 1000, 1001, 1001)]
    scaled = [p for p in transfer if "scaled DEPTH=3" in p.description]
    assert len(scaled) == 4 and all(re.search(r"^DEPTH = 3\b", p.source, re.M) for p in scaled)
    assert all(p.budget == 5 for p in scaled)
    with pytest.raises(Exception, match="at most"):
        verify.plan(repo, config, rows_of(repo), verify.Options(budget=301))
    # what `loop --verify --hours` keeps free: the default plan's runs (6 ablation runs at 2 s, 4 transfer runs at
    # 2 s and 4 at 4 s: twice as long) and one experiment's two runs, at 1.5 x budget + 30 s each (the rows given
    # the same second: no spacing to measure; written here they straddle a second on a slow machine)
    rows = rows_of(repo)
    same_second = [dataclasses.replace(r, time=rows[0].time) for r in rows]
    assert verify.seconds(repo, config, same_second) == (2 + 6 + 4 + 4 * 2) * 33


def test_the_table_pairs_seeds_and_says_what_is_not_distinguishable():
    assert verified.paired({1: 3.0, 2: 3.0}, {1: 3.0, 2: 3.0})["distinguishable"] is False  # a no-op: exactly 0
    real = verified.paired({1: 3.1, 2: 3.2, 3: 3.3}, {1: 3.0, 2: 3.1, 3: 3.2, 4: 9.0})
    assert real["n"] == 3 and abs(real["mean"] - 0.1) < 1e-9 and real["distinguishable"]
    one = verified.paired({1: 3.5}, {1: 3.0})
    assert one["sem"] is None and not one["distinguishable"]


def test_a_recorded_run_is_never_planned_again_an_interrupted_one_is():
    from autoresearch import verify
    p = verify.Planned(descriptions.verification("a" * 40, "champion"), "", 42, 20)

    def row(description, decision="verification", seed=42, budget=20.0, status="verify"):
        return ledger.Row("abc1234", 0.0, 0.0, status, description, "v", "r", "t", budget, 0, 0.0, "f", seed,
                          decision=decision)
    assert verify.done([row(p.description)], p)
    assert verify.done([row(descriptions.noted(p.description, descriptions.CRASH, "exit status 1"))], p)
    assert not verify.done([row(descriptions.noted(p.description, descriptions.INTERRUPTED, "killed"),
                                decision="interrupted")], p)
    assert not verify.done([row(p.description, seed=43)], p) and not verify.done([row(p.description, budget=40)], p)
    assert not verify.done([row(p.description, status="keep")], p)


@pytest.mark.slow
def test_verify_ablates_two_keeps_survives_a_kill_and_shows_its_table(repo, env):
    env = dict(env, AUTORESEARCH_TIME_BUDGET="20")
    night(repo, env)
    champion = sh(repo, "git", "rev-parse", "HEAD")
    before = rows_of(repo, verification=False)

    # killed while the first run's model is evaluated: recorded as interrupted, train.py put back
    killed = cli(repo, "verify", "--seeds", "2", "--no-transfer", env=dict(env, AUTORESEARCH_KILL_AT="evaluating"))
    assert killed.returncode == -9, killed.stdout + killed.stderr
    out = cli(repo, "verify", "--seeds", "2", "--no-transfer", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "recovered an interrupted experiment" in out.stdout and "6 runs planned, 0 already recorded" in out.stdout
    assert "does not revert" in out.stdout and "verify 6/6" in out.stdout

    rows = rows_of(repo)
    verify_rows = [r for r in rows if r.status == "verify"]
    interrupted = [r for r in verify_rows if r.decision == "interrupted"]
    done = [r for r in verify_rows if r.decision != "interrupted"]
    assert len(interrupted) == 1 and len(done) == 6 and all(r.val_bpb > 0 for r in done), out.stdout
    assert len({(descriptions.move_text(r.description), r.seed) for r in done}) == 6  # nothing ran twice
    # the branch never moved, train.py is the champion's, the night's rows are what they were
    assert sh(repo, "git", "rev-parse", "HEAD") == champion and not sh(repo, "git", "status", "--porcelain")
    assert rows_of(repo, verification=False) == before
    assert all(sh(repo, "git", "cat-file", "-t", r.commit) == "commit" for r in done)  # kept reachable

    table = verified.table(rows)
    noop = next(a for a in table["ablation"] if a["move"] == "a no-op")
    assert noop["n"] == 2 and noop["mean"] == 0.0 and not noop["distinguishable"], table  # deterministic: exactly 0
    assert len(table["ablation"]) == 2

    again = cli(repo, "verify", "--seeds", "2", "--no-transfer", env=env)  # all recorded: nothing runs
    assert again.returncode == 0 and "6 runs planned, 6 already recorded" in again.stdout, again.stdout
    assert len([r for r in rows_of(repo) if r.status == "verify"]) == 7

    facts = json.loads(cli(repo, "status", "--json", env=env).stdout)["tags"][0]
    assert facts["verification"]["champion"] == champion[:7] and facts["verification"]["finished"] == 6
    assert facts["experiments"] == 4 and facts["counts"]["verify"] == 7  # never counted as experiments
    status = cli(repo, "status", env=env).stdout
    assert "verification of champion" in status and "not distinguishable from zero" in status
    report = cli(repo, "report", "--out", str(repo.parent / "p.png"), env=env)
    assert report.returncode == 0 and "ablation, each keep's contribution" in report.stdout, report.stderr
    html = cli(repo, "report", "--html", str(repo.parent / "r.html"), env=env)
    assert html.returncode == 0, html.stderr
    page = browser()  # the report's page, in a real browser: the verification's table rendered
    try:
        page.get((repo.parent / "r.html").as_uri())
        shown = wait_until(lambda: page.find_element("id", "verification").text, what="the verification table")
        assert "without " in shown and "a no-op" in shown and "not distinguishable from zero" in shown, shown
        assert "does not revert" in shown and f"champion {champion[:7]}" in shown, shown
        assert not [e for e in page.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        page.quit()

    # the end of a loop: `loop --hours --verify` begins no experiment the verification's time would not leave room
    # for (its 8 transfer runs, 4 at twice the budget, and 2 runs of an experiment, at the ledger's spacing of ~4 s
    # a run: about 1 min, more than the 18 s given), then runs the
    # verification's defaults, whose ablation is recorded already
    night_end = cli(repo, "loop", "--hours", "0.005", "--verify", env=env)
    assert night_end.returncode == 0, night_end.stdout + night_end.stderr
    assert "stopping: the verification (--verify) needs about" in night_end.stdout, night_end.stdout
    assert "14 runs planned, 6 already recorded" in night_end.stdout and "verify 14/14" in night_end.stdout
    transfer = [r for r in rows_of(repo) if r.status == "verify" and "transfer" in r.description]
    assert sorted((r.budget_s, r.seed) for r in transfer) == sorted([(b, s) for b in (20, 40) for s in (1000, 1001)] * 2)
    assert sh(repo, "git", "rev-parse", "HEAD") == champion and rows_of(repo, verification=False) == before


@pytest.mark.slow
def test_verify_transfers_to_a_longer_budget_and_a_larger_model_on_fresh_seeds(repo, env):
    env = dict(env, AUTORESEARCH_TIME_BUDGET="20")
    night(repo, env)
    command = ["verify", "--no-ablation", "--scale", "DEPTH=2"]
    # stopped by `autoresearch stop` (the dashboard's button) after its first run; then it continues
    proc = subprocess.Popen([sys.executable, "-m", "autoresearch.cli", *command], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = proc.stdout.readline()
    while first and not first.startswith("verify 1/12"):
        first = proc.stdout.readline()
    assert "asked `autoresearch verify`" in cli(repo, "stop", env=env).stdout
    rest = proc.stdout.read()
    assert proc.wait(timeout=STALL_ROOM) == 0 and "stopping: asked to" in rest, rest
    assert len([r for r in rows_of(repo) if r.status == "verify"]) == 1
    out = cli(repo, *command, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "12 runs planned, 1 already recorded" in out.stdout
    rows = [r for r in rows_of(repo) if r.status == "verify"]
    arms = [(r.budget_s, r.seed, descriptions.parse_verification(r.description)["arm"],
             descriptions.parse_verification(r.description)["scale"]) for r in rows]
    assert sorted(arms) == sorted((b, s, a, scale) for b, scale in ((20, ""), (40, ""), (40, "DEPTH=2"))
                                  for s in (1000, 1001) for a in ("base", "champion"))
    assert all(r.val_bpb > 0 for r in rows), out.stdout
    logs = {r.run_id: (repo / ".autoresearch/runs" / r.run_id / "run.log").read_text() for r in rows}
    assert all("budget=40s" in logs[r.run_id] for r in rows if r.budget_s == 40)  # trained at the longer budget
    params = {r.run_id: int(re.search(r"params=([\d,]+)", logs[r.run_id])[1].replace(",", "")) for r in rows}
    scaled = [params[r.run_id] for r in rows if "scaled" in r.description]
    assert max(scaled) < min(params[r.run_id] for r in rows if "scaled" not in r.description)  # 2 layers, not 4
    table = verified.table(rows_of(repo))
    assert [(t["budget_s"], t["scale"], t["recorded"], t["n"]) for t in table["transfer"]] == [
        (20, "", True, 2), (20, "", False, 2), (40, "", False, 2), (40, "DEPTH=2", False, 2)]
    assert re.search(r"at 40 s, fresh seeds: [+-]\d\.\d{6}", out.stdout), out.stdout
    assert re.search(r"at 40 s scaled DEPTH=2, fresh seeds: [+-]\d\.\d{6}", out.stdout), out.stdout


def test_what_cannot_be_verified_is_a_clear_error_and_nothing_runs(repo, env):
    assert cli(repo, "setup", "--tag", "v", env=env).returncode == 0
    config = tagconfig.read(repo / ".autoresearch/tags/v.json")
    base = sh(repo, "git", "rev-parse", "HEAD")
    blob = sh(repo, "git", "rev-parse", "HEAD:train.py")[:12]
    ledger.append(repo / "results.tsv", record.make_row(config, base, "baseline", "r0", "keep", val_bpb=3.0, seed=42,
                                                        config=blob, decision="baseline 1/3"))
    out = cli(repo, "verify", env=env)  # the baseline's series is unfinished (1 run of 3)
    assert out.returncode == 2 and "series is unfinished" in out.stderr, out.stderr
    for i in (2, 3):
        ledger.append(repo / "results.tsv", record.make_row(config, base, descriptions.repeated("baseline", i),
                                                            f"r{i}", "keep", val_bpb=3.0, seed=41 + i, config=blob,
                                                            decision=f"baseline {i}/3"))
    out = cli(repo, "verify", env=env)
    assert out.returncode == 2 and "kept nothing beyond its baseline: nothing to verify" in out.stderr, out.stderr
    (repo / "train.py").write_text((repo / "train.py").read_text().replace("MATRIX_LR = 0.04", "MATRIX_LR = 0.05"))
    kept = commit(repo, "MATRIX_LR 0.04 -> 0.05")
    ledger.append(repo / "results.tsv", record.make_row(
        config, kept, "MATRIX_LR 0.04 -> 0.05", "r4", "keep", val_bpb=2.9, seed=42,
        config=sh(repo, "git", "rev-parse", "HEAD:train.py")[:12], decision="P 0.99 >= 0.98 after 2 runs"))
    out = cli(repo, "verify", "--budget", "301", env=env)
    assert out.returncode == 2 and "runs at most 300 s" in out.stderr, out.stderr
    out = cli(repo, "verify", "--scale", "NO_SUCH=3", env=env)
    assert out.returncode == 2 and "--scale NO_SUCH=3: train.py has no constant NO_SUCH" in out.stderr, out.stderr
    edited = (repo / "train.py").read_text() + "# mine, not committed\n"
    (repo / "train.py").write_text(edited)
    out = cli(repo, "verify", env=env)
    assert out.returncode == 2 and "git stash" in out.stderr, out.stderr
    assert (repo / "train.py").read_text() == edited  # never overwritten
    assert not [r for r in rows_of(repo) if r.status == "verify"]
