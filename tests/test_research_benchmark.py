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
