"""benchmarks/research.py's schedule: lanes share the machine's minutes equally (a night is wall time), the one
that has spent the least runs next, baselines first, and a lane out of its share, at its cap or with no move left
starts nothing more. Pure Python: each lane's ledger progress and loop seconds are set by hand, as a resumed work
directory would hold them."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import research  # noqa: E402


class Progress(research.Lane):
    """A lane whose ledger says `started` and `experiments` (the real Lane reads them from results.tsv)."""

    def __init__(self, work, arm, seconds=0.0, started=True, experiments=0):
        super().__init__(work, "night", arm, "")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.spent.add(seconds)
        self._started, self._experiments = started, experiments

    def started(self):
        return self._started

    def experiments(self):
        return self._experiments


def test_the_lane_that_spent_least_goes_next_and_baselines_first(tmp_path):
    quick = Progress(tmp_path, "builtin", seconds=300, experiments=5)
    slow = Progress(tmp_path, "random", seconds=900, experiments=2)
    assert research.next_lane([slow, quick], share=1200, cap=30) is quick
    new = Progress(tmp_path, "tpe", seconds=0, started=False)
    assert research.next_lane([slow, quick, new], share=1200, cap=30) is new


def test_a_lane_stops_at_its_share_its_cap_or_when_it_begins_nothing(tmp_path):
    spent = Progress(tmp_path, "builtin", seconds=1200, experiments=9)
    capped = Progress(tmp_path, "random", seconds=100, experiments=30)
    stuck = Progress(tmp_path, "tpe", seconds=50, experiments=3)
    stuck.stuck = 3
    assert research.next_lane([spent, capped, stuck], share=1200, cap=30) is None
    stuck.stuck = 2
    assert research.next_lane([spent, capped, stuck], share=1200, cap=30) is stuck


def test_seconds_spent_survive_a_restart(tmp_path):
    Progress(tmp_path, "builtin", seconds=412.5)
    again = research.Lane(tmp_path, "night", "builtin", "")
    assert again.spent.seconds == 412.5
    again.spent.add(10)
    assert research.Lane(tmp_path, "night", "builtin", "").spent.seconds == 422.5
