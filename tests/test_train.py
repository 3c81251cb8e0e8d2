"""train.py end to end on tiny data with a budget of a few seconds."""

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import prepare
from autoresearch import fixed
from autoresearch.sites import read_constants
from conftest import FIXED, ROOT, STALL_ROOM, eager_train_source, reviewed_train_source

pytestmark = pytest.mark.slow  # every test here trains through the real harness

def run_train(tmp_path: Path, cache: Path, budget: float, replace: dict | None = None, prepare_suffix: str = ""):
    work = tmp_path / "work"
    work.mkdir()
    source = eager_train_source()
    for pattern, line in (replace or {}).items():
        source, n = re.subn(pattern, line, source, flags=re.M)
        assert n == 1, pattern
    (work / "train.py").write_text(source)
    (work / "prepare.py").write_text((ROOT / "prepare.py").read_text() + prepare_suffix)
    shutil.copy(ROOT / "runtime.py", work / "runtime.py")
    env = dict(os.environ, AUTORESEARCH_CACHE=str(cache), AUTORESEARCH_TIME_BUDGET=str(budget),
               AUTORESEARCH_RUN_DIR=str(work / "run"))
    proc = subprocess.run([sys.executable, "train.py"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    result_path = work / "run" / "result.json"
    result = json.loads(result_path.read_text()) if result_path.exists() else None
    return proc, result, work / "run"


def test_a_short_run_trains_exports_and_the_harness_reproduces_its_val_bpb(small_cache, tmp_path, monkeypatch):
    """Run by hand (the validation split visible), train.py reports val_bpb; the harness's evaluator, in its own
    process with a clean prepare.py, scores the exported model and gets the same number to 1e-6."""
    budget = 4
    proc, result, run_dir = run_train(tmp_path, small_cache, budget)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"val_bpb=(\d+\.\d{4}) \| memory_gb=(\d+\.\d) \| steps=(\d+)", last)
    assert m, last
    # the JSON result carries the same numbers at full precision
    assert f"{result['val_bpb']:.4f}" == m.group(1)
    assert f"{result['memory_gb']:.1f}" == m.group(2)
    assert result["num_steps"] == int(m.group(3))
    assert result["time_budget"] == budget and result["device"] == "cpu"
    # the dtype is chosen by measurement, and the run says why: bf16 only where its matmul is >= 2x fp32's
    reason = re.search(r"^dtype: CPU bf16 matmul ([\d,]+) GFLOP/s against fp32 ([\d,]+): (.*)$", proc.stdout, re.M)
    assert reason, proc.stdout[:2000]
    bf16, fp32 = (float(reason.group(i).replace(",", "")) for i in (1, 2))
    assert result["dtype"] == ("bfloat16" if bf16 >= 2 * fp32 else "float32"), reason.group(0)
    steps_tokens = read_constants(eager_train_source(), "cpu")["TOTAL_BATCH_SIZE"]
    assert result["seed"] == 42 and result["total_tokens"] == result["num_steps"] * steps_tokens
    # the budget is honoured: training stops at the first step that ends past it (a stalled machine makes that
    # step as long as the stall: the bound is STALL_ROOM, and the harness's own clock has its tests)
    assert budget <= result["training_seconds"] <= budget + STALL_ROOM
    assert result["startup_seconds"] > 0 and result["eval_seconds"] > 0 and 0 < result["mfu_percent"] < 100
    assert fixed.check_result(result) == [] and "export_error" not in result
    # the model learned: better than uniform guessing over the vocabulary
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(small_cache))
    tok = prepare.Tokenizer.from_directory()
    targets = prepare.evaluation_rows("val")[:, 1:].reshape(-1)
    nbytes = tok.token_byte_lengths[targets]
    uniform = math.log2(tok.get_vocab_size()) * int((nbytes > 0).sum()) / int(nbytes.sum())
    assert result["val_bpb"] < 0.8 * uniform
    # the weights load by name; the harness's evaluation of the export reproduces train.py's numbers
    from safetensors.torch import load_file
    weights = load_file(str(run_dir / prepare.TENSORS_FILE))
    assert weights["wte.weight"].shape == (tok.get_vocab_size(), 128)
    assert "step=     1 | loss=" in proc.stdout
    from autoresearch.evaluator.harness import run_evaluation
    from autoresearch.evaluator.scoring import Request
    from autoresearch.evaluator.scoring import CHECK_TOLERANCE
    request = Request(str(run_dir), result["dtype"], "cpu", result["check_bpb"])
    evaluation = run_evaluation({n: (ROOT / n).read_bytes() for n in FIXED}, small_cache, request)
    tolerance = CHECK_TOLERANCE[result["dtype"]]
    assert abs(evaluation["val_bpb"] - result["val_bpb"]) <= tolerance, (evaluation, result["val_bpb"])
    assert abs(evaluation["check_bpb"] - result["check_bpb"]) <= tolerance
    assert 0 < evaluation["test_bpb"] < 0.8 * uniform and evaluation["test_bpb"] != evaluation["val_bpb"]


def test_nan_loss_fails_fast(small_cache, tmp_path):
    proc, result, _ = run_train(tmp_path, small_cache, 30,
                                replace={r"^MATRIX_LR = .*$": 'MATRIX_LR = float("nan")'})
    assert proc.returncode == 1
    assert any(line.startswith("FAST_FAIL") for line in proc.stdout.splitlines()), proc.stdout
    assert result is None and "val_bpb=" not in proc.stdout


def test_a_model_that_cannot_be_exported_reports_why(small_cache, tmp_path):
    """Data-dependent Python control flow cannot be exported: the run still ends, and says why."""
    proc, result, run_dir = run_train(tmp_path, small_cache, 2, replace={
        r"^    def forward\(self, idx, targets=None, reduction=\"mean\"\):$":
            '    def forward(self, idx, targets=None, reduction="mean"):\n'
            '        if idx.sum().item() % 3 == 1: idx = idx.flip(1)'})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "EXPORT_FAILED" in proc.stdout and result["export_error"]
    assert not (run_dir / prepare.GRAPH_FILE).exists()


def test_imports_without_training(tmp_path):
    """Tools import train.py for the model; importing must not train."""
    (tmp_path / "train.py").write_text(reviewed_train_source())  # never the work tree's (docs/integrity.md)
    for name in FIXED:
        shutil.copy(ROOT / name, tmp_path / name)
    proc = subprocess.run([sys.executable, "-c", "import train; m = train.GPT(train.GPTConfig(300, 32, 2, 64, 32, "
                           "'SL', 0.0)); print(m.num_params(), m.layer_windows(m.cfg))"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split(maxsplit=1)[1].strip() == "[16, 32]"


def test_without_a_cpp_compiler_the_shipped_train_py_runs_eager_and_says_why(small_cache, tmp_path):
    """torch.compile is on by default, and inductor needs a C++ compiler on a CPU: where none is on PATH the run
    does not crash on its first step, it trains eager and its log names the reason."""
    import shutil as sh
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(reviewed_train_source())
    for name in FIXED:
        sh.copy(ROOT / name, work / name)
    bin_dir = tmp_path / "bin"  # a PATH with python and nothing else
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    env.update(PATH=str(bin_dir), AUTORESEARCH_CACHE=str(small_cache), AUTORESEARCH_TIME_BUDGET="2",
               AUTORESEARCH_RUN_DIR=str(work / "run"))
    proc = subprocess.run([sys.executable, "train.py"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "compile: no C++ compiler (g++, c++, clang++ or $CXX) for inductor's CPU kernels" in proc.stdout
    assert "compile=False" in proc.stdout
    assert json.loads((work / "run" / "result.json").read_text())["compiled"] is False
