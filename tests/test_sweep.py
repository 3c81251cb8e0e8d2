"""benchmarks/sweep.py, the full-budget comparison of configurations: what a configuration names becomes the
train.py that runs, and a sweep started again does not repeat a run it already has."""

import json
import sys

import pytest

from conftest import ROOT, reviewed_train_source

sys.path.insert(0, str(ROOT / "benchmarks"))
import sweep  # noqa: E402

from autoresearch import ideas  # noqa: E402
from autoresearch.sites import read_constants  # noqa: E402


def test_a_configuration_sets_constants_and_ideas_of_the_catalog():
    rev, changes = sweep.parse_config("mlp_ratio.ratio=2,DEPTH=3")
    assert rev is None and changes == {("mlp_ratio", "ratio"): 2, "DEPTH": 3}
    source = sweep.edited(rev, changes, "cpu")
    assert read_constants(source, "cpu")["DEPTH"] == 3
    assert ideas.current(ideas.IDEAS["mlp_ratio"], source, "cpu") == {"ratio": 2}
    shipped = reviewed_train_source()
    assert sweep.edited(*sweep.parse_config("baseline"), "cpu") == shipped
    with pytest.raises(SystemExit, match="no_such_idea: no such idea"):
        sweep.edited(None, {("no_such_idea", "x"): 1}, "cpu")


def test_a_sweep_started_again_skips_what_it_already_ran(tmp_path):
    out = tmp_path / "sweep.jsonl"
    assert sweep.already_run(out, ["baseline"], [1]) == []
    rows = [{"config": "baseline", "seed": 1, "val_bpb": 1.6}, {"config": "DEPTH=3", "seed": 1, "val_bpb": 1.7},
            {"config": "baseline", "seed": 9, "val_bpb": 1.5}]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    assert sweep.already_run(out, ["baseline", "DEPTH=3"], [1, 2]) == rows[:2]
