"""The harness's own evaluation of a finished run: val_bpb (and test_bpb) of the exported model.

It runs in a fresh process that never imports train.py: `python -I -B evaluate.py`, with a clean copy of
prepare.py taken from git into a new private directory (so no edited file and no forged bytecode can stand in
for it). It loads the exported graph (JSON) and its tensors (safetensors) with no
pickle and no code from the run, allows only ATen operators and no state mutation, checks that the model is
causal (later tokens never change earlier logits), checks that it reproduces train.py's own score on the fixed
check rows, and then scores the validation rows, and the test rows when asked. It prints one JSON object.

This file is both the script and the harness's way to call it (Evaluator, run_evaluation); it imports nothing
of the autoresearch package, so it runs the same from any directory.

The harness starts the evaluator before the training (Evaluator): it imports torch and torch.export (~2.7 s on
2 CPU cores) while train.py starts, at the lowest priority, then sleeps on its stdin until the harness hands it the
finished run's arguments. Those seconds leave the time outside the budget (BENCHMARKS.md). The training
cannot reach it: it is the harness's child, not the training's, and reads nothing before the training ended.
"""

from __future__ import annotations

import json
import operator
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# How far the harness's score of the exported model may be from train.py's score of the live model on the
# same rows. float32 on the CPU agrees to ~1e-7 (BENCHMARKS.md); reduced precision on a GPU uses other kernels
# (FA3 in training, SDPA in the export), so its tolerance is wide (not yet measured on a GPU).
CHECK_TOLERANCE = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 1e-2}
# Largest change allowed in an earlier position's logits when later tokens change, relative to the logits'
# scale: float noise, far below anything that could carry information about the future.
CAUSAL_TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-2}
# On a CPU, reduced precision changes nothing there: an honest model exported under bf16 autocast drifted by
# exactly 0 (measured with random weights, so that attention matters), so a CPU run gets float32's tolerance.
CPU_CAUSAL_TOLERANCE = CAUSAL_TOLERANCE["float32"]
CAUSAL_TRIALS = 4


class Refused(Exception):
    """The model breaks a rule (reads the future, mutates state, runs non-ATen code)."""


class Broken(Exception):
    """The run left no usable model (the export is missing, unreadable or does not run)."""


def load_program(prepare, run_dir: Path, device: str):
    """The exported program, from JSON and safetensors only, checked against the rules."""
    import torch
    from safetensors.torch import load_file
    from torch._export.serde.serialize import SerializedArtifact, deserialize

    graph, tensors = run_dir / prepare.GRAPH_FILE, run_dir / prepare.TENSORS_FILE
    if not graph.is_file() or not tensors.is_file():
        raise Broken(f"no exported model ({prepare.GRAPH_FILE} and {prepare.TENSORS_FILE} in the run directory); "
                     "train.py must end with prepare.finish(model, stats, batch_size)")
    try:
        loaded = load_file(str(tensors), device=device)
        state = {k: torch.nn.Parameter(v, requires_grad=False) if v.is_floating_point() else v
                 for k, v in loaded.items() if not k.startswith(prepare.CONSTANT_PREFIX)}
        constants = {k[len(prepare.CONSTANT_PREFIX):]: v for k, v in loaded.items()
                     if k.startswith(prepare.CONSTANT_PREFIX)}
        program = deserialize(SerializedArtifact(graph.read_bytes(), state, constants, None))
    except Exception as e:
        raise Broken(f"the exported model could not be loaded ({type(e).__name__}: {str(e)[:500]})") from None
    signature = program.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
        raise Refused("the exported forward pass mutates state (buffers or its input); a forward pass must be "
                      "a pure function of the tokens")
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        namespace = getattr(target, "namespace", None)
        if target is operator.getitem or namespace == "aten":
            continue
        raise Refused(f"the exported graph calls {target}, which is not an ATen operator; only ATen operators "
                      "are evaluated (custom kernels must have an ATen fallback under torch.export)")
    inputs = [s for s in signature.input_specs if s.kind.name == "USER_INPUT"]
    if len(inputs) != 1:
        raise Broken(f"the exported forward pass takes {len(inputs)} inputs; it must take the tokens alone")
    placeholder = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == inputs[0].arg.name)
    shape = tuple(placeholder.meta["val"].shape)
    return program.module(), shape


def causality(forward, x, base, tolerance: float, rng) -> None:
    """Changing the tokens from position j on must leave the logits before j as they were. x: the check rows'
    inputs, base: their logits. One batch holds several rows, each perturbed from several positions: the last
    two (a look at the next token) and random ones the model cannot anticipate."""
    import torch

    B, T = x.shape
    rows_per_trial = max(1, B // CAUSAL_TRIALS)
    trials = min(CAUSAL_TRIALS, B)
    positions = [T - 1, T - 2] + [int(rng.integers(1, T - 2)) for _ in range(trials - 2)]
    changed = x.clone()
    source, starts = [], []
    for t, j in enumerate(positions):
        for r in range(rows_per_trial):
            i = t * rows_per_trial + r
            src = (i + 1) % B  # another row's tokens: real text, not noise
            changed[i, :j] = x[r, :j]
            changed[i, j:] = x[src, j:] if not torch.equal(x[src, j:], x[r, j:]) else (x[r, j:] + 1) % base.shape[-1]
            source.append(r)
            starts.append(j)
    out = forward(changed).float()
    for i, (r, j) in enumerate(zip(source, starts)):
        drift = (out[i, :j] - base[r, :j].float()).abs().max().item()
        scale = 1.0 + base[r, :j].float().abs().max().item()
        if not drift <= tolerance * scale:
            raise Refused(f"the model is not causal: changing the tokens from position {j} on changed the logits "
                          f"of earlier positions by {drift:.3g}; a prediction may only use earlier tokens")


def evaluate(prepare, run_dir: Path, dtype: str, device: str, check_bpb: float, test_below: float) -> dict:
    import numpy as np
    import torch

    t0 = time.time()
    module, shape = load_program(prepare, run_dir, device)
    batch_size, seq_len = shape if len(shape) == 2 else (None, None)
    manifest = prepare.require_manifest()
    if seq_len != manifest["max_seq_len"]:
        raise Broken(f"the model was exported for inputs of shape {shape}; it must take (batch, "
                     f"{manifest['max_seq_len']}) tokens")
    token_bytes = prepare.Tokenizer.from_directory().get_token_bytes()
    out = {"batch_size": batch_size, "device": device, "dtype": dtype}

    seen = {}

    def forward(x):
        seen["logits"] = module(x.to(device))
        return seen["logits"]

    with torch.no_grad(), prepare.autocast_for(torch.device(device).type, dtype):
        try:
            check = prepare.check_rows(batch_size)
            out["check_bpb"] = prepare.rows_bpb(forward, check, token_bytes, batch_size, device)
            tolerance = CPU_CAUSAL_TOLERANCE if torch.device(device).type == "cpu" else CAUSAL_TOLERANCE[dtype]
            causality(forward, torch.from_numpy(check[:, :-1]), seen.pop("logits"), tolerance,
                      np.random.default_rng(secrets.randbits(64)))
            if not abs(out["check_bpb"] - check_bpb) <= CHECK_TOLERANCE[dtype]:
                raise Refused(f"the exported model does not reproduce train.py's: check_bpb {out['check_bpb']:.6f} "
                              f"(harness) vs {check_bpb:.6f} (train.py)")
            t1 = time.time()
            out["val_bpb"] = prepare.rows_bpb(forward, prepare.evaluation_rows("val"), token_bytes, batch_size, device)
            out["val_seconds"] = time.time() - t1
            if out["val_bpb"] < test_below:
                out["test_bpb"] = prepare.rows_bpb(forward, prepare.evaluation_rows("test"), token_bytes,
                                                   batch_size, device)
        except (Refused, prepare.PrepareError):
            raise
        except Exception as e:
            raise Broken(f"the exported model failed to run ({type(e).__name__}: {str(e)[:500]})") from None
    out["seconds"] = time.time() - t0
    return out


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--prepare-dir", required=True, help="a directory holding the clean prepare.py alone")
    parser.add_argument("--wait", action="store_true",
                        help="import everything, then read the other arguments as one JSON object from stdin")
    parser.add_argument("--run-dir")
    parser.add_argument("--dtype")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--check-bpb", type=float)
    parser.add_argument("--test-below", type=float, default=float("inf"),
                        help="also score the test split when val_bpb is below this")
    args = parser.parse_args(argv)
    if args.wait:  # importing beside a training that starts: yield the cores to it. This process has its own
        os.nice(19)  # session, hence its own autogroup where Linux has them, and nice only counts within one:
        try:         # the autogroup's nice too (a bf16 matmul next to it: 789 GFLOP/s, with it 1,900, alone 1,950)
            with open("/proc/self/autogroup", "w") as f:
                f.write("19")
        except OSError:  # no autogroups (or not Linux): the plain nice is what counts
            pass
    sys.path.insert(0, args.prepare_dir)
    import prepare
    if args.wait:
        import numpy  # noqa: F401  everything evaluate() and load_program() import, so that they find it loaded
        import safetensors.torch  # noqa: F401
        import torch  # noqa: F401
        import torch._export.serde.serialize  # noqa: F401
        line = sys.stdin.readline()
        if not line:  # the harness needs no evaluation (the run crashed) or is gone
            return 0
        vars(args).update(json.loads(line))
    if args.run_dir is None or args.dtype is None or args.check_bpb is None:
        parser.error("--run-dir, --dtype and --check-bpb are required")
    try:
        if args.dtype not in CHECK_TOLERANCE:
            raise Broken(f"result.json names dtype {args.dtype!r}; it must be one of {sorted(CHECK_TOLERANCE)}")
        if args.device not in ("cpu", "cuda", "mps"):
            raise Broken(f"result.json names device {args.device!r}; it must be cpu, cuda or mps")
        out = evaluate(prepare, Path(args.run_dir), args.dtype, args.device, args.check_bpb, args.test_below)
    except Refused as e:
        out = {"refused": str(e)}
    except (Broken, prepare.PrepareError) as e:
        out = {"error": str(e)}
    print(json.dumps(out))
    return 0

# --- the harness side --------------------------------------------------------------------------------------


class Evaluator:
    """This file as a script in a fresh, isolated interpreter with prepare_source as its prepare.py, started
    now and importing while the caller trains; run() hands it a finished run. One run per Evaluator; close()
    ends it if run() never came (the training crashed)."""

    def __init__(self, prepare_source: bytes, cache: Path):
        self.private = Path(tempfile.mkdtemp(prefix="autoresearch-eval-"))
        (self.private / "fixed").mkdir()
        (self.private / "fixed" / "prepare.py").write_bytes(prepare_source)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AUTORESEARCH_"))}
        env["AUTORESEARCH_CACHE"] = str(cache)
        # -I: no PYTHON* variables, no user site, no script directory on sys.path; -B: no bytecode written. The
        # fresh private directory has no __pycache__, so prepare is compiled from the clean source.
        argv = [sys.executable, "-I", "-B", str(Path(__file__).resolve()),
                "--prepare-dir", str(self.private / "fixed"), "--wait"]
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     stdin=subprocess.PIPE, start_new_session=True)

    def run(self, run_dir: Path, dtype: str, device: str, check_bpb: float, test_below: float, timeout: float,
            on_start=None) -> dict:
        """Its JSON: val_bpb (and test_bpb, check_bpb, seconds), or refused / error with a reason. on_start(pid)
        is called first, so that a harness killed meanwhile can be cleaned up after."""
        args = {"run_dir": str(run_dir), "dtype": dtype, "device": device, "check_bpb": check_bpb,
                "test_below": test_below if test_below != float("inf") else 1e308}
        try:
            if on_start:
                on_start(self.proc.pid)
            stdout, stderr = self.proc.communicate(json.dumps(args) + "\n", timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"the evaluation took longer than {timeout:.0f} s"}
        finally:
            self.close()
        lines = stdout.strip().splitlines()
        try:
            return json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            return {"error": f"the evaluation failed (exit {self.proc.returncode}): {stderr.strip()[-800:]}"}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        shutil.rmtree(self.private, ignore_errors=True)


def run_evaluation(prepare_source: bytes, run_dir: Path, dtype: str, device: str, check_bpb: float,
                   test_below: float, cache: Path, timeout: float, on_start=None) -> dict:
    """Start an Evaluator and hand it run_dir at once (Evaluator.run)."""
    return Evaluator(prepare_source, cache).run(run_dir, dtype, device, check_bpb, test_below, timeout, on_start)


if __name__ == "__main__":
    if sys.platform.startswith("linux"):  # die with the harness or worker that started it (lock.tied_to_parent)
        import ctypes
        import signal
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
    code = main(sys.argv[1:])
    sys.stdout.flush()  # the harness waits for this process to end: skip torch's teardown (~0.9 s on 2 cores)
    sys.stderr.flush()
    os._exit(code)
