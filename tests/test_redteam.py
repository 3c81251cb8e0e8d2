"""Every attack of benchmarks/redteam.py (issue 19), one test each, through the real `autoresearch run`: caught,
recorded with its reason, and the branch, the ledger, the data and the files outside the run directory left as
they were."""

import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import redteam  # noqa: E402


pytestmark = pytest.mark.slow  # every test here trains through the real harness

@pytest.mark.parametrize("attack", redteam.ATTACKS, ids=[a.name for a in redteam.ATTACKS])
def test_the_attack_is_caught(attack, small_cache, env, tmp_path, bwrap_or_skip):
    if attack.bwrap:
        bwrap_or_skip()
    outcome = redteam.execute(attack, tmp_path, small_cache, env)
    assert outcome["ok"], outcome["problems"]


def test_a_first_step_longer_than_a_short_budget_is_a_crash_that_says_so_not_a_broken_rule(repo, env):
    """An honest train.py whose compilation alone outlasts a smoke test's budget: told what to do, never that it
    broke the rules."""
    from conftest import cli
    from test_harness import rows
    env = dict(env, AUTORESEARCH_OUTSIDE_ALLOWANCE="1")
    assert cli(repo, "setup", "--tag", "short", "--sandbox", "off", env=env).returncode == 0
    slow_first_step = redteam.attack(prelude="time.sleep(4)  # a cold compile", stats=', "compile_seconds": 4.0')
    (repo / "train.py").write_text(slow_first_step)
    out = cli(repo, "run", "-m", "smoke", env=env)
    [row] = rows(repo)
    assert row.status == "crash" and out.returncode == 1, row.description
    assert "the first step (compilation and warm-up) took 4 s, more than the whole 2 s budget" in row.description
    assert "USE_COMPILE = False" in row.description and "rules" not in out.stdout


def test_a_bad_compile_cache_setting_names_the_choices(repo, env):
    from conftest import cli
    out = cli(repo, "setup", "--tag", "c", env=dict(env, AUTORESEARCH_COMPILE_CACHE="sometimes"))
    assert out.returncode == 2 and "AUTORESEARCH_COMPILE_CACHE='sometimes': use champion (the default) or off" in out.stderr
