"""Every attack of benchmarks/redteam.py (issue 19), one test each, through the real `autoresearch run`: caught,
recorded with its reason, and the branch, the ledger, the data and the files outside the run directory left as
they were."""

import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import redteam  # noqa: E402


@pytest.mark.parametrize("attack", redteam.ATTACKS, ids=[a.name for a in redteam.ATTACKS])
def test_the_attack_is_caught(attack, small_cache, env, tmp_path, bwrap_or_skip):
    if attack.bwrap:
        bwrap_or_skip()
    outcome = redteam.execute(attack, tmp_path, small_cache, env)
    assert outcome["ok"], outcome["problems"]
