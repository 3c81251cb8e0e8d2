"""The honest metric: every attack from issue 8, each run through the real harness (`autoresearch run`), each
caught and recorded with its reason, leaving the branch, the ledger and the data as they were.

Most run with `--sandbox off`, the harder case: nothing stops the training process, and the harness must find
out afterwards. The ones that only the sandbox can stop run with `--sandbox on`.
"""

import json
import re
import shutil
import sys

import pytest

from autoresearch import fixed, ledger
from conftest import ROOT, cli
from test_harness import head, rows

# A tiny honest train.py (a bigram model, causal by construction) and the markers attacks fill in: shared with
# the red-team catalogue of issue 19 (benchmarks/redteam.py).
sys.path.insert(0, str(ROOT / "benchmarks"))
from redteam import attack  # noqa: E402


pytestmark = pytest.mark.slow  # every test here trains through the real harness

def run_attack(repo, env, source, sandbox="off", message="attack"):
    """Set up a tag, commit nothing else, run `source` as train.py. Returns (process, the one row)."""
    assert cli(repo, "setup", "--tag", "t", "--sandbox", sandbox, env=env).returncode == 0
    base = head(repo)
    (repo / "train.py").write_text(source)
    out = cli(repo, "run", "-m", message, env=env)
    recorded = rows(repo)
    assert len(recorded) == 1, [r.description for r in recorded]  # only the harness's own row
    assert head(repo) == base, "the branch must be back on the base commit"
    return out, recorded[0]


def data_intact(cache):
    manifest = json.loads((cache / "manifest.json").read_text())
    return fixed.verify(manifest, cache) == []


@pytest.fixture
def own_cache(small_cache, tmp_path, env):
    """A private copy of the prepared data, for attacks that write to it."""
    copy = tmp_path / "cache"
    shutil.copytree(small_cache, copy)
    env["AUTORESEARCH_CACHE"] = str(copy)
    return copy


def test_an_honest_run_is_kept_with_the_harness_number(repo, env):
    assert cli(repo, "setup", "--tag", "t", "--sandbox", "off", "--decision", "naive", env=env).returncode == 0
    (repo / "train.py").write_text(attack())
    out = cli(repo, "run", "-m", "honest bigram", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    [row] = rows(repo)
    evaluation = json.loads(next((repo / ".autoresearch" / "runs").glob("*/evaluation.json")).read_text())
    assert row.status == "keep" and row.val_bpb == pytest.approx(evaluation["val_bpb"], abs=1e-6)
    assert 0 < evaluation["test_bpb"] and "val_bpb=" in (repo / "run.log").read_text().splitlines()[-1]
    # the evaluation's time in its parts (benchmarks/overhead.py shows them): loading the export, the check rows'
    # forwards, the validation pass, the probes, the test pass (this run may be kept: its test split is scored)
    parts = [evaluation[k] for k in ("load_seconds", "check_seconds", "val_seconds", "causal_seconds", "test_seconds")]
    assert all(t > 0 for t in parts) and sum(parts) <= evaluation["seconds"], evaluation


def test_a_fake_result_without_training_is_a_crash(repo, env):
    fake = '''
import json, os, pathlib
run = pathlib.Path(os.environ["AUTORESEARCH_RUN_DIR"])
json.dump({"val_bpb": 0.1, "memory_gb": 0.1, "num_steps": 1000, "training_seconds": 2.0, "time_budget": 2,
           "check_bpb": 0.1, "device": "cpu", "dtype": "float32", "seed": int(os.environ["AUTORESEARCH_SEED"]),
           "data_seed": int(os.environ["AUTORESEARCH_SEED"])},  # everything the harness checks right, but no model
          open(run / "result.json", "w"))
print("val_bpb=0.1000 | memory_gb=0.1 | steps=1000")
'''
    out, row = run_attack(repo, env, fake)
    assert row.status == "crash" and "no exported model" in row.description and row.val_bpb == 0


def test_a_model_that_reads_the_next_token_is_refused(repo, env):
    out, row = run_attack(repo, env, attack(forward="idx = idx.roll(-1, dims=1)  # the next token"))
    assert row.status == "refused" and "not causal" in row.description


def test_dropping_the_causal_mask_in_the_real_model_is_refused(repo, env):
    source = (repo / "train.py").read_text()
    source, n = re.subn(r"is_causal=True", "is_causal=False", source)
    assert n == 1
    out, row = run_attack(repo, env, source)
    assert row.status == "refused" and "not causal" in row.description


def test_a_model_that_changes_when_exported_is_refused(repo, env):
    out, row = run_attack(repo, env, attack(
        forward="if torch.compiler.is_exporting():\n    return torch.zeros(*idx.shape, V) + self.emb.weight[0, 0]"))
    assert row.status == "refused" and "does not reproduce train.py's" in row.description


def test_patching_the_metric_at_import_is_refused(repo, env):
    prelude = '''
import torch.nn.functional as F
_cross_entropy = F.cross_entropy
F.cross_entropy = lambda *a, **k: 0.5 * _cross_entropy(*a, **k)
prepare.evaluate_bpb = lambda *a, **k: 0.01
'''
    out, row = run_attack(repo, env, attack(prelude=prelude))
    assert row.status == "refused" and "does not reproduce" in row.description


def test_reporting_a_better_val_bpb_than_measured_is_refused(repo, env):
    out, row = run_attack(repo, env, attack(prelude="prepare.evaluate_bpb = lambda *a, **k: 0.01"))
    assert row.status == "refused" and "train.py reported val_bpb 0.010000" in row.description


def test_an_easier_validation_set_through_the_cache_variable_is_refused(repo, env):
    """The attacker builds a 'cache' whose validation split is training data and points prepare at it."""
    before_finish = '''
import pathlib, shutil
view = pathlib.Path(os.environ["AUTORESEARCH_CACHE"])
fake = pathlib.Path(os.environ["AUTORESEARCH_RUN_DIR"]) / "fake"
shutil.copytree(view, fake, symlinks=True)
data_dir = fake / prepare.require_manifest()["data_dir"]
for kind in ("tokens", "offsets"):
    for split in ("val", "test"):
        (data_dir / f"{split}.{kind}.npy").symlink_to((data_dir / f"train_00000.{kind}.npy").resolve())
os.environ["AUTORESEARCH_CACHE"] = str(fake)
'''
    out, row = run_attack(repo, env, attack(before_finish=before_finish))
    assert row.status == "refused" and "train.py reported val_bpb" in row.description


@pytest.mark.parametrize("sandbox", ["off", "on"])
def test_the_validation_split_is_not_visible_to_training(repo, env, sandbox, bwrap_or_skip):
    if sandbox == "on":
        bwrap_or_skip()
    out, row = run_attack(repo, env, attack(prelude="rows = prepare.evaluation_rows('val')"), sandbox)
    assert row.status == "crash" and "exit status 1" in row.description
    assert "The val split is not visible here" in (repo / "run.log").read_text()


def test_reading_validation_files_directly_fails_in_the_sandbox(repo, env, bwrap_or_skip):
    bwrap_or_skip()
    real = env["AUTORESEARCH_CACHE"]
    prelude = f'''
import numpy, pathlib
real = pathlib.Path({real!r})
val = numpy.load(real / prepare.require_manifest()["data_dir"] / "val.tokens.npy")
'''
    out, row = run_attack(repo, env, attack(prelude=prelude), sandbox="on")
    assert row.status == "crash" and "exit status 1" in row.description
    assert "No such file or directory" in (repo / "run.log").read_text()
    assert row.protection == "bwrap"


EDIT_DATA = '''
import pathlib
view = pathlib.Path(os.environ["AUTORESEARCH_CACHE"])
data_dir = view / prepare.require_manifest()["data_dir"]
real_dir = (data_dir / "train_00000.tokens.npy").resolve().parent
for name in ("train_00000.tokens.npy", "val.offsets.npy"):
    path = real_dir / name
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1  # same size: a size check alone would not notice
    path.write_bytes(bytes(raw))
'''


def test_editing_the_data_in_place_is_refused_and_blocks_later_runs(repo, env, own_cache):
    out, row = run_attack(repo, env, attack(prelude=EDIT_DATA))
    assert row.status == "refused" and "the prepared data, prepare.py or runtime.py changed during the run" in row.description
    assert not data_intact(own_cache)
    (repo / "train.py").write_text(attack())
    later = cli(repo, "run", "-m", "honest", env=env)
    assert later.returncode == 1 and "prepare.py --force" in later.stderr
    assert [r.status for r in rows(repo)] == ["refused", "refused"] and "does not match its checksum" in \
        rows(repo)[-1].description


def test_editing_the_data_in_place_fails_in_the_sandbox(repo, env, own_cache, bwrap_or_skip):
    bwrap_or_skip()
    out, row = run_attack(repo, env, attack(prelude=EDIT_DATA), sandbox="on")
    assert row.status == "crash" and "Read-only file system" in (repo / "run.log").read_text()
    assert data_intact(own_cache)


def test_time_before_the_training_clock_starts_counts(repo, env):
    """Seconds slept before train.py starts its own clock are the harness's seconds all the same (training past
    the budget: benchmarks/redteam.py's past-the-budget, in test_redteam)."""
    env["AUTORESEARCH_OUTSIDE_ALLOWANCE"] = "3"
    out, row = run_attack(repo, env, attack(prelude="time.sleep(6)"))
    assert row.status == "refused" and "more than the 2 s budget plus the 3 s allowance" in row.description


TAMPERING = {
    "results.tsv": 'open("results.tsv", "a").write("abc1234\\t0.100000\\t0.1\\tkeep\\tforged\\tt\\tx\\tnow\\t2\\t1\\t1.0\\tf\\t42\\tnone\\n")',
    "tag": 'p = pathlib.Path(".autoresearch/tags/t.json"); p.write_text(p.read_text().replace("\\"budget_s\\": 2", "\\"budget_s\\": 3"))',
    "git hook": 'p = pathlib.Path(".git/hooks/post-commit"); p.write_text("#!/bin/sh\\necho pwned\\n"); p.chmod(0o755)',
    "bytecode": 'pathlib.Path("__pycache__").mkdir(exist_ok=True); pathlib.Path("__pycache__/prepare.cpython-311.pyc").write_bytes(b"forged")',
}


def _harness_state(repo):
    return {"ledger": (repo / "results.tsv").read_text(), "tag": (repo / ".autoresearch/tags/t.json").read_text(),
            "hook": (repo / ".git/hooks/post-commit").exists(), "pycache": (repo / "__pycache__").exists()}


def test_changing_the_harness_state_is_refused_and_undone(repo, env):
    """All four at once (the ledger, the tag file, a git hook, forged bytecode): each is named and undone."""
    assert cli(repo, "setup", "--tag", "t", "--sandbox", "off", env=env).returncode == 0
    state = _harness_state(repo)
    (repo / "train.py").write_text(attack(prelude="import pathlib\n" + "\n".join(TAMPERING.values())))
    out = cli(repo, "run", "-m", "tamper", env=env)
    assert out.returncode == 1 and "refused:" in out.stdout, out.stdout + out.stderr
    [row] = ledger.read(repo / "results.tsv")
    assert row.status == "refused" and "changed files outside its run directory" in row.description
    assert "(restored)" in row.description
    for name in ("results.tsv", ".autoresearch/tags/t.json", ".git/hooks/post-commit", "__pycache__"):
        assert name in row.description, (name, row.description)
    after = _harness_state(repo)
    assert after["tag"] == state["tag"] and not after["hook"] and not (repo / "__pycache__" / "prepare.cpython-311.pyc").exists()
    assert after["ledger"].count("\n") == 2 and "forged" not in after["ledger"]


def test_the_sandbox_stops_every_change_to_the_harness_state(repo, env, bwrap_or_skip):
    bwrap_or_skip()
    prelude = "import pathlib\n" + "\n".join(f"try:\n    {code}\nexcept OSError as e:\n    print('blocked:', e)"
                                             for code in TAMPERING.values())
    assert cli(repo, "setup", "--tag", "t", "--sandbox", "on", "--decision", "naive", env=env).returncode == 0
    state = _harness_state(repo)
    (repo / "train.py").write_text(attack(prelude=prelude))
    out = cli(repo, "run", "-m", "tamper in the sandbox", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    [row] = ledger.read(repo / "results.tsv")
    assert row.status == "keep" and row.protection == "bwrap"  # nothing got through, so nothing to refuse
    after = _harness_state(repo)
    assert after["tag"] == state["tag"] and not after["hook"] and not after["pycache"]
    assert (repo / "run.log").read_text().count("blocked:") >= 2  # results.tsv and the repository are read-only
