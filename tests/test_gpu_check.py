"""benchmarks/gpu_check.sh run, on a CPU (GPU_CHECK_ALLOW_CPU=1): the offline plumbing and the report.

The GPU figures themselves need an NVIDIA host (BENCHMARKS.md); this checks what a CPU can: the bundle's data
is used, nothing is installed when nothing is missing, train.py runs by hand for the budget, and the report has
every figure the issue asks for, taken from the run's result.json.
"""

import json
import os
import shutil
import subprocess

import pytest
from conftest import FIXED, ROOT, STALL_ROOM, eager_train_source


pytestmark = pytest.mark.slow  # every test here trains through the real harness

def test_gpu_check_runs_offline_from_a_bundle_and_reports_every_figure(small_cache, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(small_cache, bundle / "cache")
    out = tmp_path / "out"
    repo = tmp_path / "repo"  # the shipped train.py, eager: a cold compile would be the whole 3 s (tested in
    repo.mkdir()              # test_harness)
    (repo / "train.py").write_text(eager_train_source())
    for name in FIXED:
        shutil.copy(ROOT / name, repo / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTORESEARCH_")}
    script = str(ROOT / "benchmarks" / "gpu_check.sh")
    refused = subprocess.run(["bash", script, "run", str(bundle)], env=env, capture_output=True, text=True,
                             timeout=STALL_ROOM)
    assert refused.returncode == 1 and "GPU_CHECK_ALLOW_CPU=1" in refused.stderr  # no GPU: says how to go on
    proc = subprocess.run(["bash", script, "run", str(bundle), "--budget", "3", "--out", str(out), "--repo", str(repo)],
                          env=dict(env, GPU_CHECK_ALLOW_CPU="1"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "installing" not in proc.stdout  # every module was there: the host's Python is left alone
    report = json.loads((out / "gpu_check.json").read_text())
    result = json.loads((out / "run" / "result.json").read_text())
    assert report["tokens_per_second"] == result["tokens_per_second"] > 0
    assert report["mfu_percent"] == result["mfu_percent"] and report["val_bpb"] == result["val_bpb"] > 0
    assert report["attention"] == "SDPA" and report["gpu"] == "none (CPU)"
    assert report["memory_gb"] > 0 and report["compile_seconds"] >= 0 and report["num_steps"] >= 1
    assert f"val_bpb        {result['val_bpb']:.4f}" in proc.stdout and "MFU " in proc.stdout
    assert (out / "train.log").read_text().count("step=") >= 1
    # a bundle without data names the step that makes it
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.run(["bash", script, "run", str(empty)], env=dict(env, GPU_CHECK_ALLOW_CPU="1"),
                          capture_output=True, text=True, timeout=STALL_ROOM)
    assert proc.returncode == 1 and "gpu_check.sh pack" in proc.stderr
