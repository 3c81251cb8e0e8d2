"""The evaluator script's body (main): its arguments, the imports made early under --wait, the memory bound,
and one JSON object on stdout: the scores, or refused / error with a reason. __main__.py starts it."""

from __future__ import annotations

import importlib
import json
import os
import sys

from .request import Request, parse
from .scoring import CHECK_TOLERANCE, evaluate, memory_limit
from .verdicts import Broken, Refused

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
