#!/usr/bin/env bash
# The GPU path, measured on a host that reaches no network: train.py's `gpu` profile for 120 s, then one report.
#
#   # 1. On a machine with network (once): prepare the gpu profile's data and fetch the wheels a bare torch
#   #    install lacks (tiktoken, regex, safetensors, and kernels for FA3), for the GPU host's Python version.
#   bash benchmarks/gpu_check.sh pack BUNDLE [--dataset gutenberg|climbmix] [--eval-tokens N] [--python 3.11]
#   # 2. Copy BUNDLE and this checkout to the GPU host, then, there, offline:
#   bash benchmarks/gpu_check.sh run BUNDLE [--budget 120] [--out DIR] [--repo DIR]
#   # 3. An experiment's whole cost on that host, the harness included (benchmarks/overhead.py on the bundle's data):
#   bash benchmarks/gpu_check.sh overhead BUNDLE [--budget 60] [--runs 2] [--worse] [--out FILE.jsonl]
#
# `run` runs the train.py of --repo, unconfined (default: this checkout's reviewed train.py, autoresearch/untrusted.py,
# never its work tree's, which an agent may have written: docs/integrity.md). It installs the missing wheels into BUNDLE/site
# (never into the host's Python), points AUTORESEARCH_CACHE at BUNDLE/cache and TORCHINDUCTOR_CACHE_DIR at
# OUT/inductor, runs `python train.py` by hand (it evaluates val_bpb itself: the validation split is in the
# bundle) under a hard timeout, and prints, and writes to OUT/gpu_check.json: tok/s, MFU against the GPU's
# dense bf16 peak (train.py's table: 989 TFLOP/s for an H200), peak memory, compile seconds, whether FA3 or
# SDPA ran, val_bpb, steps, and the host (GPU, torch, CUDA).
# The goal is MFU >= 40%. FA3 comes from the `kernels` hub, which needs Hugging Face: offline it runs only when
# BUNDLE/hf holds that kernel already (HF_HOME); otherwise SDPA runs and the report says so.
#
# Without a GPU `run` refuses, unless GPU_CHECK_ALLOW_CPU=1 (how tests/test_gpu_check.py runs it on a CPU).
# The data for gutenberg is small (a few M tokens): over 120 s on an H200 the run repeats it (the report gives
# the epoch), which is fine for throughput and MFU but makes val_bpb optimistic; climbmix is the real thing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python}"

usage() { sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }

pack() {
    local bundle="$1"; shift
    local dataset=gutenberg eval_tokens="" pyver
    pyver="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    while [ $# -gt 0 ]; do
        case "$1" in
            --dataset) dataset="$2"; shift 2 ;;
            --eval-tokens) eval_tokens="$2"; shift 2 ;;
            --python) pyver="$2"; shift 2 ;;
            *) echo "pack: unknown option $1" >&2; usage ;;
        esac
    done
    # gutenberg's held-out splits are ~3% of 18 books: too few tokens for the gpu profile's 21 M evaluation tokens
    [ -z "$eval_tokens" ] && [ "$dataset" = gutenberg ] && eval_tokens=65536
    mkdir -p "$bundle/wheels"
    echo "== preparing the gpu profile ($dataset, ${eval_tokens:-the profile default number of} evaluation tokens) into $bundle/cache"
    AUTORESEARCH_CACHE="$bundle/cache" "$PYTHON" "$ROOT/prepare.py" --profile gpu --dataset "$dataset" \
        ${eval_tokens:+--eval-tokens "$eval_tokens"}
    echo "== wheels for Python $pyver on manylinux x86_64 into $bundle/wheels"
    "$PYTHON" -m pip download -q --only-binary=:all: --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --python-version "$pyver" \
        -d "$bundle/wheels" tiktoken regex safetensors kernels huggingface_hub
    ls "$bundle/wheels"
    du -sh "$bundle"
}

run() {
    local bundle="$1"; shift
    local budget=120 out="" repo=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --budget) budget="$2"; shift 2 ;;
            --out) out="$2"; shift 2 ;;
            --repo) repo="$(cd "$2" && pwd)"; shift 2 ;;
            *) echo "run: unknown option $1" >&2; usage ;;
        esac
    done
    bundle="$(cd "$bundle" && pwd)"
    out="${out:-$bundle/out-$(date +%Y%m%d-%H%M%S)}"
    mkdir -p "$out"
    [ -f "$bundle/cache/manifest.json" ] || { echo "no prepared data in $bundle/cache: run \`$0 pack $bundle\` on a machine with network first" >&2; exit 1; }
    if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        if [ "${GPU_CHECK_ALLOW_CPU:-0}" != 1 ]; then
            echo "no CUDA device for torch here; this check is for a GPU host (GPU_CHECK_ALLOW_CPU=1 runs it anyway)" >&2
            exit 1
        fi
    fi
    if [ -z "$repo" ]; then  # this checkout's reviewed train.py, never its work tree's (docs/integrity.md)
        repo="$out/reviewed"
        mkdir -p "$repo"
        cp "$ROOT/prepare.py" "$ROOT/runtime.py" "$repo/"
        (cd "$ROOT" && "$PYTHON" -c 'import sys; from pathlib import Path; from autoresearch import untrusted
untrusted.write(Path("."), Path(sys.argv[1]))' "$repo")
    fi
    # What the host's Python lacks comes from the bundle's wheels, into a directory of the bundle's own.
    # kernels (FA3) is optional: without it (or its wheel) the run takes SDPA and the report says so.
    local missing=""
    for module in numpy tiktoken safetensors kernels; do
        "$PYTHON" -c "import $module" 2>/dev/null && continue
        if [ "$module" = kernels ] && ! ls "$bundle"/wheels/kernels-*.whl >/dev/null 2>&1; then continue; fi
        missing="$missing $module"
    done
    if [ -n "$missing" ]; then
        echo "== installing from $bundle/wheels:$missing"
        "$PYTHON" -m pip install -q --no-index --find-links "$bundle/wheels" --target "$bundle/site" $missing \
            || echo "some wheels did not install (the run goes on; a missing kernels only means SDPA)" >&2
    fi
    export PYTHONPATH="$bundle/site${PYTHONPATH:+:$PYTHONPATH}"
    export AUTORESEARCH_CACHE="$bundle/cache" AUTORESEARCH_TIME_BUDGET="$budget" AUTORESEARCH_RUN_DIR="$out/run"
    export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$out/inductor}" HF_HUB_OFFLINE=1
    [ -d "$bundle/hf" ] && export HF_HOME="$bundle/hf"
    echo "== train.py, gpu profile, budget ${budget} s; log in $out/train.log"
    local started=$SECONDS status=0
    (cd "$repo" && timeout $((budget * 3 + 300)) "$PYTHON" train.py) 2>&1 | tee "$out/train.log" || status=$?
    [ "${PIPESTATUS[0]:-$status}" = 0 ] || status="${PIPESTATUS[0]:-$status}"
    echo "== wall clock of train.py: $((SECONDS - started)) s"
    "$PYTHON" - "$out" "$status" <<'EOF'
import json, pathlib, platform, re, subprocess, sys

out, status = pathlib.Path(sys.argv[1]), int(sys.argv[2])
log = (out / "train.log").read_text(errors="replace")
result_path = out / "run" / "result.json"
if not result_path.exists():
    print(f"FAILED: train.py exited {status} without a result.json; the end of its log:\n{log[-3000:]}")
    sys.exit(1)
r = json.loads(result_path.read_text())
import torch
host = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none (CPU)"}
try:
    host["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=30).stdout.strip()
except OSError:
    pass
attention = "FA3" if r.get("flash_attention_3") else "SDPA"
reason = re.search(r"flash attention 3 unavailable \(([^)]*)\)", log)
report = {
    **host, "attention": attention, "fa3_unavailable_because": reason.group(1) if reason else None,
    "dtype": r["dtype"], "compiled": r.get("compiled"), "compile_seconds": r["compile_seconds"],
    "tokens_per_second": r["tokens_per_second"], "mfu_percent": r["mfu_percent"], "peak_flops": r["peak_flops"],
    "memory_gb": r["memory_gb"], "val_bpb": r["val_bpb"], "num_steps": r["num_steps"],
    "total_tokens": r["total_tokens"], "epoch": r.get("epoch"), "training_seconds": r["training_seconds"],
    "startup_seconds": r["startup_seconds"], "eval_seconds": r.get("eval_seconds"),
    "num_params": r["num_params"], "profile": r["profile"], "mfu_goal_met": r["mfu_percent"] >= 40,
}
(out / "gpu_check.json").write_text(json.dumps(report, indent=1))
print(f"""
GPU check: {report['gpu']} (torch {report['torch']}, CUDA {report['cuda']}, driver {report.get('driver', '?')})
  profile {report['profile']}, {report['num_params']:,} parameters, {report['dtype']}, compiled {report['compiled']}
  attention      {attention}{' (FA3 unavailable: ' + report['fa3_unavailable_because'] + ')' if reason else ''}
  compile        {report['compile_seconds']:.1f} s (the first step, inside the budget)
  throughput     {report['tokens_per_second']:,.0f} tok/s, {report['num_steps']} steps, epoch {report['epoch']}
  MFU            {report['mfu_percent']:.1f}% of {report['peak_flops'] / 1e12:,.1f} TFLOP/s (goal 40%: {'met' if report['mfu_goal_met'] else 'NOT met'})
  memory         {report['memory_gb']:.1f} GB peak
  val_bpb        {report['val_bpb']:.4f}
  written to     {out / 'gpu_check.json'}""")
sys.exit(0 if status == 0 else 1)
EOF
}

overhead() {
    local bundle="$1"; shift
    local budget=60 runs=2 out="" worse=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --budget) budget="$2"; shift 2 ;;
            --runs) runs="$2"; shift 2 ;;
            --out) out="$2"; shift 2 ;;
            --worse) worse="--worse"; shift ;;  # runs after the first discarded: unaudited (overhead.py)
            *) echo "overhead: unknown option $1" >&2; usage ;;
        esac
    done
    bundle="$(cd "$bundle" && pwd)"
    [ -f "$bundle/cache/manifest.json" ] || { echo "no prepared data in $bundle/cache: run \`$0 pack $bundle\` first" >&2; exit 1; }
    # `autoresearch run` on this checkout's committed HEAD, the default train.py, --runs times on one tag with the
    # naive rule (one run per command; a run that beats the best is kept, and audited when scored): the evaluation,
    # the audit, start-up, export and the harness's own work, per experiment, on this host's device.
    AUTORESEARCH_CACHE="$bundle/cache" HF_HUB_OFFLINE=1 "$PYTHON" "$ROOT/benchmarks/overhead.py" --rev HEAD \
        --budget "$budget" --runs "$runs" ${worse} ${out:+--out "$out"}
}

case "${1:-}" in
    overhead) shift; [ $# -ge 1 ] || usage; overhead "$@" ;;
    pack) shift; [ $# -ge 1 ] || usage; pack "$@" ;;
    run) shift; [ $# -ge 1 ] || usage; run "$@" ;;
    *) usage ;;
esac
