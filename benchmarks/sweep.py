"""Full-budget training runs of train.py with some constants changed, one after another.

    python benchmarks/sweep.py --out sweep.jsonl 'baseline' 'DEPTH=6,MODEL_DIM=192' 'USE_COMPILE=True'

Each argument is one configuration: comma-separated NAME=VALUE (Python literals) applied to the active
profile's constants; 'baseline' changes nothing. Every run writes one JSON line (the run's result.json plus
the configuration) to --out and prints a table row. Uses the prepared data and AUTORESEARCH_TIME_BUDGET.
"""

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoresearch.edit import set_constants  # noqa: E402


def parse_config(text: str) -> dict:
    if text == "baseline":
        return {}
    return {k.strip(): ast.literal_eval(v.strip()) for k, v in (item.split("=", 1) for item in text.split(","))}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("configs", nargs="+")
    parser.add_argument("--out", default="sweep.jsonl")
    parser.add_argument("--profile", default="cpu")
    args = parser.parse_args()
    source = (ROOT / "train.py").read_text()
    print(f"{'config':45s} {'val_bpb':>8s} {'steps':>6s} {'tok/s':>7s} {'mfu%':>5s} {'compile_s':>9s} {'eval_s':>6s}")
    for text in args.configs:
        edited = set_constants(source, parse_config(text), args.profile)
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "train.py").write_text(edited)
            env = dict(os.environ, AUTORESEARCH_RUN_DIR=tmp, PYTHONPATH=str(ROOT))
            proc = subprocess.run([sys.executable, "train.py"], cwd=tmp, env=env, capture_output=True, text=True)
            result_path = Path(tmp) / "result.json"
            if proc.returncode != 0 or not result_path.exists():
                print(f"{text:45s} crashed: {proc.stdout[-500:]} {proc.stderr[-1500:]}")
                continue
            result = json.loads(result_path.read_text()) | {"config": text}
        with open(args.out, "a") as f:
            f.write(json.dumps(result) + "\n")
        print(f"{text:45s} {result['val_bpb']:8.4f} {result['num_steps']:6d} {result['tokens_per_second']:7.0f} "
              f"{result['mfu_percent']:5.1f} {result['compile_seconds']:9.1f} {result['eval_seconds']:6.1f}", flush=True)


if __name__ == "__main__":
    main()
