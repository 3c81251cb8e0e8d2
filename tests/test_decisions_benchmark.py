"""benchmarks/decisions.py resumes a measurement stopped midway (issue 33: every benchmark fits in one sitting,
and a sitting can end): no experiment with a record runs again, the one in flight goes on in its tag."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import decisions  # noqa: E402


class FakeHarness:
    """`autoresearch setup` and `run` as decisions.py calls them: each run appends rows to its tag's ledger (a
    baseline 2, an A/A experiment a confirm then a discard); `stop_at` (repository, message) is interrupted after
    its first row, as a killed benchmark leaves it."""

    def __init__(self, stop_at=None):
        self.rows: dict[str, list] = {}
        self.runs: list[tuple[str, str, str]] = []  # (repository, message, the train.py it ran)
        self.stop_at = stop_at

    def cli(self, repo, env, *args):
        if args[0] == "run":
            message = args[2]
            self.runs.append((repo.name, message, (repo / "train.py").read_text()))
            rows = self.rows.setdefault(repo.name, [])
            statuses = ["keep", "keep"] if message == "baseline" else ["confirm", "discard"]
            if rows and rows[-1].status == "confirm":  # the series in flight goes on
                statuses = ["discard"]
            for status in statuses:
                rows.append(SimpleNamespace(status=status, val_bpb=1.0, decision="d", p_better=0.5, mean=1.0,
                                            description=message))
                if (repo.name, message) == self.stop_at and status == "confirm":
                    raise KeyboardInterrupt
        return SimpleNamespace(returncode=0)

    def tag_rows(self, repo, tag):
        return list(self.rows.get(repo.name, []))


def test_a_stopped_aa_measurement_resumes_without_running_a_finished_experiment_again(tmp_path, monkeypatch):
    out = tmp_path / "dec.jsonl"
    fake = FakeHarness(stop_at=("aa-control", "A/A 2"))
    monkeypatch.setattr(decisions, "cli", fake.cli)
    monkeypatch.setattr(decisions, "tag_rows", fake.tag_rows)
    monkeypatch.setattr(decisions, "RECORDS", [])
    with pytest.raises(KeyboardInterrupt):
        decisions.aa(tmp_path, {}, {"control": 3, "stat": 2}, str(out))
    done = [(r["kind"], r["rule"]) for r in map(json.loads, out.read_text().splitlines())]
    assert done == [("aa-baseline", "control"), ("aa-baseline", "stat"), ("aa", "control"), ("aa", "stat")]

    # run again: the records read back, the rows and repositories as the stop left them
    monkeypatch.setattr(decisions, "RECORDS", [json.loads(line) for line in out.read_text().splitlines()])
    fake.runs.clear()
    fake.stop_at = None
    decisions.aa(tmp_path, {}, {"control": 3, "stat": 2}, str(out))
    assert [(repo, message) for repo, message, _ in fake.runs] == [("aa-control", "A/A 2"), ("aa-stat", "A/A 2"),
                                                                     ("aa-control", "A/A 3")]
    assert fake.runs[0][2].count("# A/A change 2:") == 1  # the interrupted change, not written twice
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["kind"], r["rule"]) for r in records[4:]] == [("aa", "control"), ("aa", "stat"), ("aa", "control")]
    assert records[4]["runs"] == 2 and records[4]["status"] == "discard"  # its run before the stop is counted
    assert records[5]["runs"] == records[6]["runs"] == 2


def test_a_measurement_resumed_with_other_settings_is_refused(tmp_path, monkeypatch):
    out = tmp_path / "dec.jsonl"
    out.write_text(json.dumps({"kind": "aa", "rule": "stat", "budget": "10", "drift": None, "settings": {}}) + "\n")
    monkeypatch.setattr(sys, "argv", ["decisions.py", "--budget", "30", "--out", str(out), "--keep",
                                      str(tmp_path / "k")])
    with pytest.raises(SystemExit, match="other settings.*budget='10'"):
        decisions.main()
    monkeypatch.setattr(sys, "argv", ["decisions.py", "--out", str(out)])
    with pytest.raises(SystemExit, match="give --keep DIR"):
        decisions.main()
