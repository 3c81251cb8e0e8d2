"""The evaluator script: what the harness asks (Request, on the script's command line or, from a script started
early, as one JSON line on its stdin), the scoring of one exported model (evaluate: it must reproduce train.py's
check_bpb, then its val_bpb is scored with the causality probes recording, checked, and for a run that may be kept
the test split is scored too), and the script's body (main): one JSON object on stdout, the scores, or refused /
error with a reason. __main__.py starts it."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .graph import load_program
from .probes import AUDIT_PROBES, CAUSAL_PROBES, CAUSAL_TOLERANCE, CPU_CAUSAL_TOLERANCE, CausalProbes
from .safe_read import Broken, Refused

# How far the harness's score of the exported model may be from train.py's score of the live model on the
# same rows. float32 on the CPU agrees to ~1e-7 (BENCHMARKS.md); reduced precision on a GPU uses other kernels
# (FA3 in training, SDPA in the export), so its tolerance is wide (not yet measured on a GPU).
CHECK_TOLERANCE = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 1e-2}


def evaluate(prepare, request: Request) -> dict:
    import numpy as np
    import torch

    t0 = time.time()
    device, dtype = request.device, request.dtype
    module, shape = load_program(prepare, Path(request.run_dir), device)  # on a GPU: its context made here too
    out = {"device": device, "dtype": dtype, "load_seconds": time.time() - t0}
    batch_size, seq_len = shape if len(shape) == 2 else (None, None)
    if seq_len != prepare.require_manifest()["max_seq_len"]:
        raise Broken(f"the model was exported for inputs of shape {shape}; it must take (batch, "
                     f"{prepare.require_manifest()['max_seq_len']}) tokens")
    token_bytes = prepare.Tokenizer.from_directory().get_token_bytes()
    out["batch_size"] = batch_size

    def forward(x):
        return module(x.to(device))

    vocab = int(token_bytes.shape[0])
    with torch.no_grad(), prepare.autocast_for(torch.device(device).type, dtype):
        try:
            t1 = time.time()
            check = prepare.check_rows(batch_size)
            out["check_bpb"] = finite(prepare.rows_bpb(forward, check, token_bytes, batch_size, device), "check_bpb")
            if not abs(out["check_bpb"] - request.check_bpb) <= CHECK_TOLERANCE[dtype]:
                raise Refused(f"the exported model does not reproduce train.py's: check_bpb {out['check_bpb']:.6f} "
                              f"(harness) vs {request.check_bpb:.6f} (train.py)")
            out["check_seconds"] = time.time() - t1  # the first forwards: on a GPU, its kernels' first loads
            t1 = time.time()
            drawn = {} if request.draw is None else {"draw": request.draw}  # a tag from before draws: its prepare.py
            val = prepare.evaluation_rows("val", **drawn)
            probes = CausalProbes(val, batch_size, vocab, np.random.default_rng(secrets.randbits(64)), request.probes)

            def scored(x):
                logits = forward(x)
                probes.record(logits)
                return logits

            out["val_bpb"] = finite(prepare.rows_bpb(scored, val, token_bytes, batch_size, device), "val_bpb")
            out["val_seconds"] = time.time() - t1
            t1 = time.time()
            tolerance = CPU_CAUSAL_TOLERANCE if torch.device(device).type == "cpu" else CAUSAL_TOLERANCE[dtype]
            may_keep = out["val_bpb"] < request.test_below  # it may be kept: the test split is scored
            out["audited"] = may_keep and request.audit_probes > request.probes  # and audited deeper, every such run
            out["causal_probes"] = probes.check(forward, tolerance, request.audit_probes if out["audited"] else None)
            out["causal_seconds"] = time.time() - t1
            if may_keep:
                t1 = time.time()
                test = prepare.evaluation_rows("test", **drawn)
                out["test_bpb"] = finite(prepare.rows_bpb(forward, test, token_bytes, batch_size, device), "test_bpb")
                out["test_seconds"] = time.time() - t1
        except (Refused, Broken, prepare.PrepareError):
            raise
        except Exception as e:
            if isinstance(e, MemoryError) or ("alloc" in str(e).lower() and "memory" in str(e).lower()):
                raise Broken("the exported model needs more memory than the evaluator may use "
                             f"({memory_limit() / 2**30:.1f} GiB, 3/4 of this machine's memory)") from None
            raise Broken(f"the exported model failed to run ({type(e).__name__}: {str(e)[:500]})") from None
    out["seconds"] = time.time() - t0
    return out


def finite(bpb: float, what: str) -> float:
    """A score, if it is a number: NaN logits at one unprobed position made val_bpb NaN, which compared as
    neither better nor worse and was kept (benchmarks/redteam.py, nan-last-position)."""
    if not math.isfinite(bpb):
        raise Broken(f"the exported model's {what} is {bpb}: its logits are not finite on some row")
    return bpb


def memory_limit() -> int:
    """Bytes of address space the evaluator may use on a CPU: 3/4 of the machine's memory, so that an exported
    model that asks for more is a named crash of one run, not the out-of-memory killer ending the night."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 3 // 4


@dataclass(frozen=True)
class Request:
    """What the harness hands the evaluator, on its command line: the run's model and how it was trained."""
    run_dir: str
    dtype: str
    device: str
    check_bpb: float
    test_below: float = float("inf")  # also score the test split (and audit deeper) when val_bpb is below this
    probes: int = CAUSAL_PROBES
    audit_probes: int = AUDIT_PROBES
    draw: int | None = None  # the tag's secret draw of scored rows (heldout.py; prepare.evaluation_rows)

    def argv(self) -> list[str]:
        return ["--run-dir", self.run_dir, "--dtype", self.dtype, "--device", self.device, "--check-bpb",
                repr(float(self.check_bpb)), "--test-below", repr(min(float(self.test_below), 1e308)),
                "--causal-probes", str(self.probes), "--audit-probes", str(self.audit_probes)] + \
            ([] if self.draw is None else ["--draw", str(self.draw)])


def parse(argv: list[str]):
    """The script's arguments: (the parsed namespace, the Request; None with --wait, which reads it later)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--prepare-dir", required=True, help="a directory holding the clean prepare.py alone")
    parser.add_argument("--path", action="append", default=[],
                        help="a directory of packages to import from (the harness's PYTHONPATH; -I drops it)")
    parser.add_argument("--wait", action="store_true", help="import everything, then read the Request as one JSON "
                        "line from stdin (only in a sandbox whose training cannot reach this process)")
    parser.add_argument("--run-dir")
    parser.add_argument("--dtype")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--check-bpb", type=float)
    parser.add_argument("--test-below", type=float, default=float("inf"),
                        help="also score the test split, and audit deeper, when val_bpb is below this")
    parser.add_argument("--causal-probes", type=int, default=CAUSAL_PROBES,
                        help="probes of the causality check on the validation rows (CausalProbes)")
    parser.add_argument("--audit-probes", type=int, default=AUDIT_PROBES,
                        help="probes when val_bpb is below --test-below (a run that may be kept)")
    parser.add_argument("--draw", type=int, help="the tag's secret draw of scored rows (prepare.evaluation_rows)")
    args = parser.parse_args(argv)
    if args.wait:
        return args, None
    if args.run_dir is None or args.dtype is None or args.check_bpb is None:
        parser.error("--run-dir, --dtype and --check-bpb are required (or --wait)")
    return args, Request(args.run_dir, args.dtype, args.device, args.check_bpb, args.test_below, args.causal_probes,
                         args.audit_probes, args.draw)


# Everything evaluate() and load_program() import, imported under --wait so that they find it loaded
EARLY_IMPORTS = ("numpy", "safetensors.torch", "torch", "torch._export.serde.serialize")


def main(argv: list[str]) -> int:
    args, request = parse(argv)
    sys.path[:0] = [args.prepare_dir]
    sys.path += args.path
    if args.wait:  # importing beside a training that starts: yield the cores to it. This process has its own
        os.nice(19)  # session, hence its own autogroup where Linux has them, and nice only counts within one:
        try:         # the autogroup's nice too (without it a training beside this import lost half its matmul rate)
            with open("/proc/self/autogroup", "w") as f:
                f.write("19")
        except OSError:  # no autogroups (or not Linux): the plain nice is what counts
            pass
        for name in EARLY_IMPORTS:
            importlib.import_module(name)
        line = sys.stdin.readline()
        if not line:  # the harness needs no evaluation (the run crashed) or is gone
            return 0
        request = Request(**json.loads(line))
    if request.device == "cpu":  # CUDA reserves far more address space than it uses: bounded on a CPU only
        import resource
        limit = memory_limit()
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    import prepare
    try:
        if request.dtype not in CHECK_TOLERANCE:
            raise Broken(f"result.json names dtype {request.dtype!r}; it must be one of {sorted(CHECK_TOLERANCE)}")
        if request.device not in ("cpu", "cuda", "mps"):
            raise Broken(f"result.json names device {request.device!r}; it must be cpu, cuda or mps")
        out = evaluate(prepare, request)
    except Refused as e:
        out = {"refused": str(e)}
    except (Broken, prepare.PrepareError) as e:
        out = {"error": str(e)}
    print(json.dumps(out))
    return 0
