"""The `gpu` profile's code paths, run on a CPU (issue 30): data prepared with profile gpu from climbmix-format
shards served on 127.0.0.1; train.py's GPU branch (sliding windows "SSSL" through an attention mask, logit
soft-capping, Muon's weight decay) with only its sizes shrunk, trained, exported, evaluated by the harness and
kept; and the parallel loop on a machine whose nvidia-smi names two (fake) GPUs: the harness starts Ray with
them, and each experiment runs on a GPU of its own."""

import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import BUDGET, FIXED, ROOT, STALL_ROOM, cli, make_corpus, sh, reviewed_train_source

from autoresearch import ledger, sources
from autoresearch.sites import read_constants, set_constants

pytestmark = pytest.mark.slow  # every test here trains through the real harness

SEQ_LEN = 32
# The GPU branch's sizes, shrunk: 4 layers keep the whole "SSSL" pattern (three sliding-window layers; the last
# always sees the full context), 2 heads of 16; steps of 2 micro-batches of 8 rows (gradient accumulation runs).
TINY = {"DEPTH": 4, "MODEL_DIM": 32, "HEAD_DIM": 16, "DEVICE_BATCH_SIZE": 8, "TOTAL_BATCH_SIZE": 2 * 8 * SEQ_LEN,
        "EVAL_BATCH_SIZE": 8}
SHIPPED_GPU = {"WINDOW_PATTERN": "SSSL", "SOFTCAP": 15.0, "WEIGHT_DECAY": 0.2}  # what this test exercises, as shipped
WINDOWS = [SEQ_LEN // 2] * 3 + [SEQ_LEN]  # each layer's attention window under "SSSL" at 4 layers
FAKE_GPU = "NVIDIA FAKE-H100 80GB HBM3"


def gpu_train_source() -> str:
    """The shipped train.py with its GPU values shrunk (TINY), compile off (a cold compile on 2 cores would be the
    whole test's time; compilation has its own tests), and two lines printed at startup: each layer's attention
    window, and the GPUs the run was given (CUDA_VISIBLE_DEVICES)."""
    shipped = reviewed_train_source()
    assert {k: read_constants(shipped, "gpu")[k] for k in SHIPPED_GPU} == SHIPPED_GPU
    source = set_constants(shipped, dict(TINY, USE_COMPILE=False), "gpu")
    anchor = "    model = GPT(cfg).to(run.device)\n"
    assert source.count(anchor) == 1
    source = source.replace(anchor, anchor + "    print('windows:', model.windows, 'grad_accum:', grad_accum, flush=True)\n"
                                             "    print('gpus:', os.environ.get('CUDA_VISIBLE_DEVICES'), flush=True)\n")
    got = read_constants(source, "gpu")
    assert {k: got[k] for k in TINY} == TINY and {k: got[k] for k in SHIPPED_GPU} == SHIPPED_GPU
    assert got["USE_COMPILE"] is False
    assert read_constants(source, "cpu") == read_constants(shipped, "cpu") | {"USE_COMPILE": False}  # cpu untouched
    return source


@pytest.fixture(scope="module")
def gpu_cache(tmp_path_factory):
    """A cache prepared with profile gpu and dataset climbmix, downloaded from shards (parquet with a `text`
    column, as Hugging Face serves them, sha256 as X-Linked-ETag) on a local server: two training shards, the
    test and the validation shard. Vocabulary 300, sequences of 32, 512 evaluation tokens."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from test_prepare import ShardServer

    from autoresearch import data

    def parquet(texts):
        buf = io.BytesIO()
        pq.write_table(pa.table({"text": texts}), buf)
        return buf.getvalue()

    corpus = make_corpus(700, seed=1)
    server = ShardServer({0: parquet(corpus[:250]), 1: parquet(corpus[250:500]),
                          sources.CLIMBMIX_TEST_SHARD: parquet(corpus[500:600]),
                          sources.CLIMBMIX_VAL_SHARD: parquet(corpus[600:])}, {})
    root = tmp_path_factory.mktemp("gpu-cache")
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("AUTORESEARCH_CACHE", str(root))
            mp.setenv("AUTORESEARCH_CLIMBMIX_URL", server.url)
            manifest = data.prepare(profile="gpu", dataset="climbmix", num_shards=2, download_workers=2,
                                    vocab_size=300, max_seq_len=SEQ_LEN, eval_tokens=512, log=lambda *a: None)
    finally:
        server.close()
    assert sorted(server.requests) == [0, 1, sources.CLIMBMIX_TEST_SHARD, sources.CLIMBMIX_VAL_SHARD]
    assert manifest["profile"] == "gpu" and manifest["dataset"] == "climbmix"
    assert manifest["source"]["url"] == server.url and manifest["max_seq_len"] == SEQ_LEN
    return root


def make_repo(path, source: str):
    """conftest's `repo`, with this train.py."""
    path.mkdir()
    for name in (*FIXED, ".gitignore"):
        shutil.copy(ROOT / name, path / name)
    (path / "train.py").write_text(source)
    sh(path, "git", "init", "-q", "-b", "main")
    sh(path, "git", "add", "-A")
    sh(path, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return path


def harness_env(cache, **extra) -> dict:
    """conftest's `env`, on the gpu cache."""
    return dict(os.environ, AUTORESEARCH_CACHE=str(cache), AUTORESEARCH_TIME_BUDGET=BUDGET, PYTHONPATH=str(ROOT),
                AUTORESEARCH_COMPILE_CACHE="off", AUTORESEARCH_LOAD_LIMIT="1000", AUTORESEARCH_PRUNE="off",
                AUTORESEARCH_OUTSIDE_ALLOWANCE=str(STALL_ROOM), **extra)


def printed(log: str, key: str) -> str:
    found = re.findall(rf"^{key}: (.*)$", log, re.M)
    assert len(found) == 1, log[:2000]
    return found[0]


def exported_calls(graph_file) -> list[dict]:
    """The exported graph's operator calls: {"target": "torch.ops.aten....", "inputs": [...]} each."""
    graph = json.loads(graph_file.read_text())["graph_module"]["graph"]
    return [node for node in graph["nodes"] if node["target"].startswith("torch.ops.")]


def test_the_gpu_branch_trains_exports_and_is_kept(gpu_cache, tmp_path):
    repo = make_repo(tmp_path / "repo", gpu_train_source())
    env = harness_env(gpu_cache)
    out = cli(repo, "setup", "--tag", "g", "--decision", "naive", env=env)  # naive: one run decides the baseline
    assert out.returncode == 0, out.stdout + out.stderr
    out = cli(repo, "run", "-m", "baseline", env=env, timeout=2 * STALL_ROOM)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"^keep: val_bpb=", out.stdout, re.M), out.stdout

    [row] = ledger.read(repo / "results.tsv", "g")
    assert row.status == "keep" and row.decision == "naive: first run"
    assert math.isfinite(row.val_bpb) and 0 < row.val_bpb < 20 and row.steps >= 1
    assert sh(repo, "git", "rev-parse", "--short=7", "HEAD") == row.commit  # the branch holds it
    run_dir = repo / ".autoresearch" / "runs" / row.run_id
    evaluation = json.loads((run_dir / "evaluation.json").read_text())
    assert abs(evaluation["val_bpb"] - row.val_bpb) < 1e-6 and math.isfinite(evaluation["check_bpb"])
    assert evaluation["audited"]  # the causality audit passed, sliding windows and all

    # the run was the gpu profile's, at the test's sizes
    result = json.loads((run_dir / "out" / "result.json").read_text())
    assert result["profile"] == "gpu" and result["num_steps"] == row.steps
    assert result["num_params"] < 200_000  # the shipped GPU sizes are ~50M
    log = (run_dir / "run.log").read_text()
    assert re.search(r"^device=\w+ .* profile=gpu ", log, re.M), log[:2000]  # cpu here, cuda on a GPU
    assert printed(log, "windows") == f"{WINDOWS} grad_accum: 2"  # two micro-batches a step

    # the model the harness evaluated: three layers attend through the sliding-window mask, the last causally
    # over the full context, and its logits are soft-capped
    calls = exported_calls(run_dir / "out" / "model.graph.json")
    attention = [c for c in calls if c["target"] == "torch.ops.aten.scaled_dot_product_attention.default"]
    masks = [next((i["arg"] for i in c["inputs"] if i["name"] == "attn_mask"), {"as_none": True}) for c in attention]
    assert ["as_tensor" in m for m in masks] == [True, True, True, False], masks
    assert sum(c["target"] == "torch.ops.aten.tanh.default" for c in calls) == 1


@pytest.mark.serial  # a busy core, or two workers of one thread: the whole machine
def test_the_parallel_loop_places_each_experiment_on_a_gpu_of_its_own(gpu_cache, tmp_path):
    """A machine whose nvidia-smi names two GPUs: the harness sizes the loop for them (a worker per GPU, each with
    half the cores), starts Ray with 2 GPUs, and Ray gives each worker one (CUDA_VISIBLE_DEVICES, which its runs'
    trainings inherit). The trainings themselves run on the CPU: torch sees no GPU here."""
    from test_cluster import ray_processes, wait_for

    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("two workers of one thread need two cores")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\necho '{FAKE_GPU}'\necho '{FAKE_GPU}'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    repo = make_repo(tmp_path / "repo", gpu_train_source())
    env = harness_env(gpu_cache, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "loop.log"
    t0 = time.time()
    # the stat rule's baseline: 3 runs, the first two side by side
    proc = subprocess.Popen([sys.executable, "-m", "autoresearch.cli", "loop", "--workers", "2", "--tag", "gpus",
                             "--max-experiments", "1"], cwd=repo, env=env, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert proc.wait(timeout=2 * STALL_ROOM) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = log.read_text()
    assert f"2 worker(s) of {cores // 2} thread(s)" in out, out
    assert out.count(f": cuda {FAKE_GPU}, ") == 2, out  # both workers joined on the (fake) GPU machine

    rows = ledger.read(repo / "results.tsv", "gpus")
    assert [r.status for r in rows] == ["keep"] * 3 and [r.n for r in rows] == [1, 2, 3], out
    assert all(math.isfinite(r.val_bpb) and r.val_bpb > 0 for r in rows)
    assert {r.device for r in rows} == {f"cuda {FAKE_GPU}"}
    gpus = {}
    for r in rows:
        run_log = (repo / ".autoresearch" / "runs" / r.run_id / "run.log").read_text()
        assert re.search(r" profile=gpu ", run_log) and printed(run_log, "windows").startswith(str(WINDOWS))
        gpus.setdefault(r.worker, set()).add(printed(run_log, "gpus"))
    # every run saw exactly one GPU, always its worker's, and no two workers shared one
    assert all(len(ids) == 1 and next(iter(ids)) in ("0", "1") for ids in gpus.values()), gpus
    assert len({next(iter(ids)) for ids in gpus.values()}) == len(gpus), gpus
    if "loop on autoresearch/gpus with 2 worker(s)" in out:
        # both joined before the first dispatch (a stalled machine may start the loop with one: JOIN_WAIT): the
        # baseline's first two runs went out side by side, one to each worker, so each GPU had one experiment
        lines = out.splitlines()
        first_row = next(i for i, line in enumerate(lines) if line.startswith("#1 "))
        assert sorted(line.split(":")[0].strip() for line in lines[:first_row] if re.match(r"   w\d: ", line)) \
            == ["w1", "w2"], out
        assert sorted(gpus) == ["w1", "w2"]
    wait_for(lambda: not ray_processes(t0), 30, "every Ray process of the loop to end")
