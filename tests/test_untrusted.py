"""Every train.py an agent wrote, kept or not, is untrusted code (docs/integrity.md): the project's own tests never
run the work tree's train.py, or an experiment branch's, only the reviewed one (autoresearch/untrusted.py)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autoresearch import untrusted
from conftest import ROOT, cli, sh

PAYLOAD = "import pathlib; pathlib.Path({marker!r}).write_text('ran as the user')  # an agent's\n"


def project(tmp_path: Path) -> Path:
    """This checkout's tracked and new files as a fresh repository on main, its train.py the reviewed one."""
    clone = tmp_path / "project"
    files = sh(ROOT, "git", "ls-files", "-co", "--exclude-standard").splitlines()
    for name in files:
        if (ROOT / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    (clone / "train.py").write_text(untrusted.source(ROOT))
    sh(clone, "git", "init", "-q", "-b", "main")
    sh(clone, "git", "add", "-A")
    sh(clone, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "reviewed")
    return clone


def plant(clone: Path, marker: Path) -> None:
    train = clone / "train.py"
    train.write_text(PAYLOAD.format(marker=str(marker)) + train.read_text())


def run_tests(clone: Path, *selection: str) -> subprocess.CompletedProcess:
    """The clone's own tests, as a developer runs them there."""
    env = dict(os.environ, PYTHONPATH=str(clone))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0",
                           *selection], cwd=clone, env=env, capture_output=True, text=True, timeout=600)


# the tests that import train.py without training (seconds each): one imports it, one exports its model
IMPORTERS = ("tests/test_train.py::test_imports_without_training",
             "tests/test_evaluate.py::test_an_honest_export_loads_and_computes_what_the_model_does")


def test_a_payload_an_agent_left_in_the_work_trees_train_py_never_runs_in_the_tests(tmp_path):
    """The attack: an agent's session wrote a payload at the top of train.py and ran nothing; the developer ran
    the tests. They pass on the reviewed train.py and the payload never ran."""
    clone, marker = project(tmp_path), tmp_path / "marker"
    plant(clone, marker)
    proc = run_tests(clone, *IMPORTERS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert not marker.exists()


def test_a_payload_kept_on_an_experiment_branch_never_runs_in_the_tests(tmp_path):
    """The same payload committed on autoresearch/TAG (as the harness commits a kept train.py), tests run with
    that branch checked out: they run the train.py of the commit the tag started from."""
    clone, marker = project(tmp_path), tmp_path / "marker"
    sh(clone, "git", "checkout", "-q", "-b", "autoresearch/night")
    plant(clone, marker)
    sh(clone, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "kept")
    plant(clone, marker)  # and again, uncommitted
    assert untrusted.commit(clone) == sh(clone, "git", "rev-parse", "main")
    proc = run_tests(clone, *IMPORTERS)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert not marker.exists()


def test_the_reference_is_the_newest_commit_a_users_branch_reaches(tmp_path):
    """untrusted.commit: HEAD on a user's branch (or with none but experiment branches); on an experiment
    branch, detached at one of its commits, or a branch of it a user made, what the user's branches reach."""
    repo = tmp_path / "r"
    repo.mkdir()
    commit = ("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m")
    sh(repo, "git", "init", "-q", "-b", "main")
    sh(repo, "git", *commit, "base")
    base = sh(repo, "git", "rev-parse", "HEAD")
    assert untrusted.commit(repo) == base
    sh(repo, "git", "checkout", "-q", "-b", "autoresearch/a")
    sh(repo, "git", *commit, "kept 1")
    sh(repo, "git", *commit, "kept 2")
    agents = sh(repo, "git", "rev-parse", "HEAD")
    assert untrusted.commit(repo) == base
    sh(repo, "git", "checkout", "-q", "--detach", "HEAD~1")
    assert untrusted.commit(repo) == base
    sh(repo, "git", "checkout", "-q", "main")
    sh(repo, "git", *commit, "reviewed later")
    assert untrusted.commit(repo) == sh(repo, "git", "rev-parse", "HEAD")
    sh(repo, "git", "checkout", "-q", "-b", "adopted", agents)  # the user made the champion a branch of theirs
    assert untrusted.commit(repo) == agents
    sh(repo, "git", "checkout", "-q", "autoresearch/a")
    sh(repo, "git", "branch", "-q", "-D", "main", "adopted")  # only experiment branches left: none to trust
    with pytest.raises(untrusted.NoReference, match="no branch of yours"):
        untrusted.commit(repo)
    sh(repo, "git", "checkout", "-q", "--detach", base)  # a CI job's checkout: no branch at all
    sh(repo, "git", "branch", "-q", "-D", "autoresearch/a")
    assert untrusted.commit(repo) == base


# how a test or benchmark read or ran the work tree's train.py before (each one of them did)
WORK_TREE_TRAIN = re.compile(r'\b(ROOT|root) / "train\.py"|"train\.py"\], cwd=(ROOT|root)\b')


def test_no_test_or_benchmark_reads_the_work_trees_train_py():
    """A guard on what the two tests above cannot run (the training tests, the benchmarks): none names the work
    tree's train.py, and whatever imports train does so from the reviewed copy it wrote first."""
    found = []
    for path in sorted([*ROOT.glob("tests/*.py"), *ROOT.glob("benchmarks/*.py"), *ROOT.glob("docs/*.py")]):
        if path.name == "test_untrusted.py":
            continue
        text = path.read_text()
        found += [f"{path.name}:{i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1)
                  if WORK_TREE_TRAIN.search(line)]
        imported = re.search(r"^import train\b", text, re.M)
        if imported and "untrusted.write(" not in text[:imported.start()]:
            found.append(f"{path.name}: imports train without writing the reviewed one first")
    assert not found, found


@pytest.mark.slow  # a real training (the 2 s budget) and its evaluation
def test_try_trains_the_work_trees_train_py_in_the_sandbox_scores_it_and_records_nothing(repo, env, tmp_path,
                                                                                      bwrap_or_skip):
    """`autoresearch try`, what the docs say instead of `python train.py`: the payload an agent left runs in the
    training sandbox, where it reaches nothing of the user's, the training is scored by the harness, and nothing
    is committed or recorded."""
    bwrap_or_skip()
    marker = tmp_path / "marker"
    plant(repo, marker)
    train = (repo / "train.py").read_text()
    train = train.replace("import pathlib; pathlib.Path(", "import pathlib, contextlib\nwith contextlib.suppress(OSError): pathlib.Path(", 1)
    (repo / "train.py").write_text(train)
    head = sh(repo, "git", "rev-parse", "HEAD")
    proc = cli(repo, "try", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not marker.exists()
    assert re.search(r"^val_bpb=\d+\.\d{4} \| memory_gb=[\d.]+ \| steps=\d+ ", proc.stdout, re.M), proc.stdout[-2000:]
    assert "step=" in proc.stdout  # the training's step lines, as by hand
    assert sh(repo, "git", "rev-parse", "HEAD") == head and sh(repo, "git", "status", "--porcelain") == "M train.py"
    assert (repo / "train.py").read_text() == train and not (repo / "results.tsv").exists()
    tried = list((repo / ".autoresearch" / "tries").glob("*/run.log"))
    assert len(tried) == 1 and str(tried[0]) in proc.stdout


def test_an_agent_cannot_ask_the_broker_for_a_try(repo):
    """`try` scores a train.py outside the ledger: an agent in `autoresearch agent` gets its scores from runs
    only, so the broker refuses it."""
    from autoresearch import broker
    from autoresearch.cli import build_parser
    with pytest.raises(broker.BrokerError, match="does not run inside"):
        broker.check(["try"], repo, build_parser())
