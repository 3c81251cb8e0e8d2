"""Scoring one exported model (evaluate): it must reproduce train.py's check_bpb, then its val_bpb is scored
with the causality probes recording, checked, and for a run that may be kept the test split is scored too."""

from __future__ import annotations

import math
import os
import secrets
import time
from pathlib import Path

from .load import load_program
from .probes import CAUSAL_TOLERANCE, CPU_CAUSAL_TOLERANCE, CausalProbes
from .request import Request
from .verdicts import Broken, Refused

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
    load_seconds = time.time() - t0
    batch_size, seq_len = shape if len(shape) == 2 else (None, None)
    manifest = prepare.require_manifest()
    if seq_len != manifest["max_seq_len"]:
        raise Broken(f"the model was exported for inputs of shape {shape}; it must take (batch, "
                     f"{manifest['max_seq_len']}) tokens")
    token_bytes = prepare.Tokenizer.from_directory().get_token_bytes()
    out = {"batch_size": batch_size, "device": device, "dtype": dtype, "load_seconds": load_seconds}

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
            out["causal_probes"] = probes.check(forward, tolerance,
                                                request.audit_probes if out["audited"] else None)
            out["causal_seconds"] = time.time() - t1
            if may_keep:
                t1 = time.time()
                test = prepare.evaluation_rows("test", **drawn)
                out["test_bpb"] = finite(prepare.rows_bpb(forward, test, token_bytes, batch_size, device), "test_bpb")
                out["test_seconds"] = time.time() - t1
        except (Refused, Broken, prepare.PrepareError):
            raise
        except MemoryError:
            raise Broken("the exported model needs more memory than the evaluator may use "
                         f"({memory_limit() / 2**30:.1f} GiB, 3/4 of this machine's memory)") from None
        except Exception as e:
            if "alloc" in str(e).lower() and "memory" in str(e).lower():
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
