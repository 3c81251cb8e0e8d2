"""benchmarks/research.py's arms: `ARM@REV` runs a revision's harness, exported once, so that a change of a
proposer is measured before and after in one sitting."""

import sys

import pytest

from conftest import ROOT, sh

sys.path.insert(0, str(ROOT / "benchmarks"))
import research  # noqa: E402


def test_an_arm_at_a_revision_runs_that_revision_s_harness_and_fixed_files(tmp_path):
    head = sh(ROOT, "git", "rev-parse", "--short", "HEAD")
    lane = research.Lane(tmp_path, "night", f"builtin@{head}", "print('a train.py')\n")
    assert lane.agent == "builtin" and lane.name == f"night-builtin-{head}" and "@" not in lane.tag
    assert lane.harness == tmp_path / f"harness-{head}"
    committed = sh(ROOT, "git", "show", f"{head}:autoresearch/proposer.py")
    assert (lane.harness / "autoresearch" / "proposer.py").read_text().rstrip("\n") == committed.rstrip("\n")
    assert research.harness_tree(tmp_path, head) == lane.harness  # exported once, then reused
    assert research.Lane(tmp_path, "night", "builtin@HEAD", "").name == f"night-builtin-{head}"  # by its commit
    repo = research.fresh_repo(lane.dir, lane.start, fixed_from=lane.harness)
    assert (repo / "runtime.py").read_text() == (lane.harness / "runtime.py").read_text()
    assert (repo / "train.py").read_text() == "print('a train.py')\n"
    plain = research.Lane(tmp_path, "night", "random", "")
    assert plain.agent == "random" and plain.harness == ROOT and plain.name == "night-random"
    for bad in ("no-such-rev", "--output=/tmp/x"):
        with pytest.raises(SystemExit, match=f"arm @{bad}: not a revision"):
            research.Lane(tmp_path, "night", f"builtin@{bad}", "")


def test_the_transfer_says_whether_a_night_s_gain_held_at_the_longer_budget():
    """Issue 53: a night at 15 s rewards what is short; the table sets each champion's paired gain at the night's
    budget beside its gain at the longer one, and says whether it held beyond two standard errors, reversed, or
    is within the noise."""
    from types import SimpleNamespace

    def lane(name, champion):
        return SimpleNamespace(mode="night", arm=name, name=f"night-{name}", start="default",
                               champion=lambda: champion)
    lanes = [lane("builtin", "smaller"), lane("random", "default"), lane("tpe", "wider")]
    final = {"default": [2.10, 2.12, 2.08], "night-builtin": [2.04, 2.05, 2.03],
             "night-random": [2.11, 2.11, 2.09], "night-tpe": [2.06, 2.07, 2.05]}
    transfer = {"default": [1.60, 1.62, 1.61, 1.63], "night-builtin": [1.66, 1.68, 1.67, 1.70],
                "night-random": [1.61, 1.61, 1.62, 1.62], "night-tpe": [1.60, 1.63, 1.60, 1.62]}
    assert research.paired_gain([2.0, 2.1], [1.9, 2.1]) == pytest.approx((0.05, 0.05))
    rows = research.transfer_table(lanes, final, transfer, 15, 300)
    assert rows[0].startswith("| arm | gain at 15 s (paired, 3 seeds) | gain at 300 s (paired, 4 seeds)")
    verdicts = {r.split("|")[1].strip(): r.split("|")[-2].strip() for r in rows[2:]}
    assert verdicts == {"builtin": "reversed", "random": "no keep to transfer", "tpe": "not beyond the noise"}
    assert rows[2].startswith("| builtin | +0.0600 +- 0.0058 | -0.0625 +- 0.0025 |")
