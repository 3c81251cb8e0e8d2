"""Shared fixtures: a small corpus prepared with the real prepare() into a temporary cache."""

import os
import random
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoresearch import data, untrusted  # noqa: E402
from autoresearch.state import FIXED  # noqa: E402  (prepare.py and runtime.py)

WORDS = ("the cat dog bird sat ran flew over under near a big small red blue green house tree river "
         "quickly slowly happily and but then café naïve 東京 über").split()


def pytest_configure(config):
    """Under pytest-xdist (`-n 2`, .ci/run's parallel pass) each worker is pinned to a core of its own: every
    training it starts inherits the affinity, so its tag runs at one thread (machine.hardware counts the
    affinity) and two workers never fight over a core. Tests that need the whole machine are marked `serial`."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    cores = sorted(os.sched_getaffinity(0))
    if worker.startswith("gw") and len(cores) > 1:
        os.sched_setaffinity(0, {cores[int(worker[2:]) % len(cores)]})


# The slow tier's longest tests (seconds in a parallel pass on 2 cores, .ci/run at bac2cb7): under pytest-xdist
# they go out first, so that neither worker is left with one of them at the end while the other idles. A name no
# longer in the suite is ignored.
LONGEST_FIRST = ("test_every_run_compiles_warm_from_its_configurations_base",  # 165-198 s
                 "test_an_agent_detaches_a_run_waits_for_it_and_the_morning_commands_show_the_result",  # 47-137
                 "test_the_stop_button_a_report_and_a_venv_next_to_a_real_run",  # 28-106
                 "test_an_agent_started_by_hand_runs_a_short_night_through_the_broker",  # 59-62
                 "test_keep_discard_crash_and_status",  # 56-57
                 "test_sigkill_in_the_middle_of_a_confirmation_series_resumes_with_no_run_lost_or_counted_twice",
                 "test_builtin_loop_runs_resumes_and_keeps_the_baseline")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker collects, in the same order: the same sort
        items.sort(key=lambda item: (item.originalname not in LONGEST_FIRST,
                                     LONGEST_FIRST.index(item.originalname) if item.originalname in LONGEST_FIRST else 0))


def pytest_runtest_setup(item):
    if item.get_closest_marker("serial") and os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("needs the whole machine: run `python -m pytest -m serial` alone (.ci/run does)")


def make_corpus(n_docs: int = 600, seed: int = 0) -> list[str]:
    """Documents of simple repetitive sentences: learnable, with some multi-byte characters."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        sentences = []
        for _ in range(rng.randint(2, 8)):
            n = rng.randint(4, 10)
            sentences.append(" ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + ".")
        docs.append(" ".join(sentences))
    return docs


def prepare_small(cache: Path, corpus_dir: Path, **overrides) -> dict:
    corpus_dir.mkdir(parents=True, exist_ok=True)
    with open(corpus_dir / "docs.jsonl", "w", encoding="utf-8") as f:
        import json
        for doc in make_corpus():
            f.write(json.dumps({"text": doc}) + "\n")
    settings = dict(profile="cpu", dataset="local", path=str(corpus_dir), vocab_size=300, max_seq_len=32,
                    eval_tokens=512, log=lambda *a: None)
    settings.update(overrides)
    old = os.environ.get("AUTORESEARCH_CACHE")
    os.environ["AUTORESEARCH_CACHE"] = str(cache)
    try:
        return data.prepare(**settings)
    finally:  # never leak the variable into the tests that follow
        if old is None:
            os.environ.pop("AUTORESEARCH_CACHE", None)
        else:
            os.environ["AUTORESEARCH_CACHE"] = old


@pytest.fixture(scope="session")
def small_cache(tmp_path_factory):
    """A prepared cache directory (local dataset, vocab 300, sequence 32, 512 evaluation tokens), shared
    read-only by tests."""
    root = tmp_path_factory.mktemp("cache")
    prepare_small(root, tmp_path_factory.mktemp("corpus"))
    return root


@pytest.fixture
def use_cache(small_cache, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(small_cache))
    return small_cache


# --- a repository for harness and loop tests --------------------------------------------------

BUDGET = "2"
STALL_ROOM = 300  # seconds a test gives anything that a stalled machine slows: no timing assertion below this


def with_cache_counters(source: str) -> str:
    """train.py that prints inductor's own count of its cache hits and misses at its end: whether a run compiled
    warm or cold, whatever the machine's load (warm first steps took 5-17 s on a shared 2-core machine, a cold one
    62 s: a time threshold between them fails when the machine stalls)."""
    ending = 'if __name__ == "__main__":\n    main()\n'
    assert ending in source
    return source.replace(ending, ending + (
        "    from torch._dynamo.utils import counters\n"
        "    print('caches:', {k: v for c in ('inductor', 'aot_autograd') for k, v in counters[c].items() "
        "if 'cache' in k}, flush=True)\n"), 1)


def compiled_warm(log: str) -> bool:
    """Whether a run's log (with_cache_counters) shows every graph served from the cache, none compiled."""
    import ast
    import re
    found = re.search(r"^caches: (.*)$", log, re.M)
    counts = ast.literal_eval(found.group(1)) if found else {}
    return any("hit" in k and v for k, v in counts.items()) and not any("miss" in k and v for k, v in counts.items())


@cache
def reviewed_train_source() -> str:
    """The train.py every test runs, imports or edits: the reviewed one (autoresearch/untrusted.py), never the work
    tree's, which is whatever an agent last wrote (a payload at its top ran here as the user, docs/integrity.md)."""
    return untrusted.source(ROOT)


def eager_train_source() -> str:
    """The real train.py with torch.compile off (at a budget of 2 s a cold compile, ~40-70 s on 2 cores, would be
    the whole run; compilation and its cache have their own test in test_harness) and the previous default's
    2048-token steps of 8 rows: the 4096-token default takes only 1-3 steps in 2 s, too few for the harness
    tests' models to learn anything their assertions can see."""
    from autoresearch.sites import set_constants
    source = set_constants(reviewed_train_source(),
                           {"USE_COMPILE": False, "DEVICE_BATCH_SIZE": 8, "TOTAL_BATCH_SIZE": 2048}, "cpu")
    # AdamW imports torch._dynamo, inside the budget (1.9 s on a 2-core AMD EPYC): most of a 2 s budget. Imported
    # first here, the tests' runs get the steps their assertions need on any machine.
    return source.replace("\nimport torch\n", "\nimport torch\nimport torch._dynamo  # outside the tests' 2 s budget\n", 1)


def sh(repo, *args, check=True):
    proc = subprocess.run(args, cwd=repo, capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def cli(repo, *args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "autoresearch.cli", *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def env(small_cache):
    """The harness tests' environment: the small cache, a 2 s budget, no compile phase (their train.py trains
    eager; the compile cache has its own tests, which set AUTORESEARCH_COMPILE_CACHE=champion), and no wait for a
    quiet machine (the tests pass next to other work; the load guard's tests set AUTORESEARCH_LOAD_LIMIT), and no
    early pruning (a 2 s run's loss curve is a handful of points; test_harness's first test turns it on), and
    STALL_ROOM seconds allowed outside the budget: an honest run's process took 20 s to end on a stalled machine,
    past the 10.4 s allowed then, and was refused (the allowance has its own tests, which set it)."""
    return dict(os.environ, AUTORESEARCH_CACHE=str(small_cache), AUTORESEARCH_TIME_BUDGET=BUDGET,
                PYTHONPATH=str(ROOT), AUTORESEARCH_COMPILE_CACHE="off", AUTORESEARCH_LOAD_LIMIT="1000",
                AUTORESEARCH_PRUNE="off", AUTORESEARCH_OUTSIDE_ALLOWANCE=str(STALL_ROOM))


@pytest.fixture
def repo(tmp_path):
    """A fresh clone-like repository with the real train.py, prepare.py and runtime.py."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in (*FIXED, ".gitignore"):
        shutil.copy(ROOT / name, repo / name)
    (repo / "train.py").write_text(eager_train_source())
    sh(repo, "git", "init", "-q", "-b", "main")
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return repo


@pytest.fixture
def bwrap_or_skip():
    """Call it to skip a test that needs bubblewrap where it cannot run; CI installs it (.ci/run), so there the
    test always runs."""
    def check():
        from autoresearch import sandbox
        if not sandbox.bwrap_works():
            if os.environ.get("CI"):
                pytest.fail("bubblewrap is required in CI (.ci/run installs it)")
            pytest.skip("bubblewrap (bwrap) is not available here")
    return check
