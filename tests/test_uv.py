"""The uv path (README): uv.lock pins what `pip install -e ".[dev]"` resolves, from PyPI alone, and on a fresh
clone `uv sync` then `uv run autoresearch loop` runs an experiment.

PyPI's torch for Linux is the CUDA build, with 2.7 GB of CUDA libraries to download (5.2 GB installed; 24 s on a
test machine's network): with AUTORESEARCH_UV_TORCH=locked (.ci/run's slow tier) the test runs exactly what a user
runs; otherwise the fresh clone's environment is the lock's but for torch and those libraries, which come from the
Python it is made from (the CPU wheel pip installed on a test machine: `--system-site-packages`)."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, eager_train_source, sh

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
Requirement = pytest.importorskip("packaging.requirements").Requirement


def lock() -> dict:
    return tomllib.loads((ROOT / "uv.lock").read_text())


def test_the_lock_pins_every_dependency_within_pyproject_from_pypi_only():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    packages = lock()["package"]
    locked: dict[str, set[str]] = {}
    for p in packages:
        locked.setdefault(p["name"], set()).add(p["version"])
        source = p.get("source", {})
        # a user has no local index or wheel directory: everything comes from PyPI (the project itself: editable)
        assert source.get("registry") == "https://pypi.org/simple" or source == {"editable": "."}, (p["name"], source)
        for dist in p.get("wheels", []) + ([p["sdist"]] if "sdist" in p else []):
            assert dist["url"].startswith("https://files.pythonhosted.org/") and dist["hash"], (p["name"], dist)
    for line in project["dependencies"] + project["optional-dependencies"]["dev"]:
        req = Requirement(line)
        name = req.name.lower().replace("_", "-")
        assert locked.get(name), f"{name} is not in uv.lock: run `uv lock`"
        assert all(req.specifier.contains(v, prereleases=True) for v in locked[name]), (name, locked[name], line)
    assert locked["torch"] == {"2.13.0"}


def uv_env(env: dict) -> dict:
    """The tests' environment for a clone of its own: its own package, not this checkout's (PYTHONPATH), and no
    virtual environment of the caller's."""
    return {k: v for k, v in env.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}


def sync(clone, env) -> list[str]:
    """`uv sync`, and the `uv run` prefix that goes with it: exactly as locked where AUTORESEARCH_UV_TORCH=locked,
    else torch and its CUDA libraries from the base Python (the module's docstring)."""
    if os.environ.get("AUTORESEARCH_UV_TORCH") == "locked":
        steps, run = [["uv", "sync", "--locked"]], ["uv", "run"]
    else:
        skip = [p["name"] for p in lock()["package"]
                if p["name"] in ("torch", "triton") or p["name"].startswith(("nvidia-", "cuda-"))]
        steps = [["uv", "venv", "--python", sys.executable, "--system-site-packages"],
                 ["uv", "sync", "--locked", *(a for name in skip for a in ("--no-install-package", name))]]
        run = ["uv", "run", "--no-sync"]
    for step in steps:
        proc = subprocess.run(step, cwd=clone, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return run


@pytest.mark.slow
def test_uv_sync_then_uv_run_loop_runs_an_experiment_on_a_fresh_clone(tmp_path, env):
    if shutil.which("uv") is None:
        if os.environ.get("CI"):
            pytest.fail("uv is required in CI (.ci/run installs it from PyPI)")
        pytest.skip("uv is not installed (pip install uv)")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    if not (clone / "uv.lock").exists():
        pytest.fail("uv.lock is not committed")
    # the tests' train.py (eager, 2 s budget: conftest), committed as a user's change would be
    (clone / "train.py").write_text(eager_train_source())
    sh(clone, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "the tests' train.py")
    env = uv_env(env)
    run = sync(clone, env)
    proc = subprocess.run([*run, "python", "-c", "import autoresearch, torch; print(autoresearch.__file__)"],
                          cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.startswith(str(clone)), proc.stdout + proc.stderr[-2000:]
    proc = subprocess.run([*run, "autoresearch", "loop", "--max-experiments", "1", "--decision", "naive"],
                          cwd=clone, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = (clone / "results.tsv").read_text().splitlines()
    assert len(rows) == 2 and "\tbaseline\t" in rows[1] and "\tkeep\t" in rows[1], rows
    shutil.rmtree(clone / ".venv")  # gigabytes with the locked torch; pytest keeps its last temporary directories
