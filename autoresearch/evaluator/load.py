"""The exported program, from the checked graph (graph.py) and the safetensors: no pickle, no code from the run.
The evaluator scores it; `autoresearch sample` and `best` load the champion's the same way (commands.py)."""

from __future__ import annotations

import operator
from pathlib import Path

from .graph import sanitize_graph
from .safe_read import GRAPH_LIMIT, TENSORS_LIMIT, Unsafe, read_regular
from .verdicts import Broken, Refused


def load_program(prepare, run_dir: Path, device: str):
    """The exported program, from JSON and safetensors only, checked against the rules."""
    import torch
    from safetensors.torch import load as load_tensors
    from torch._export.serde.serialize import SerializedArtifact, deserialize

    try:
        graph = read_regular(run_dir / prepare.GRAPH_FILE, GRAPH_LIMIT)
        tensors = read_regular(run_dir / prepare.TENSORS_FILE, TENSORS_LIMIT)
    except FileNotFoundError:
        raise Broken(f"no exported model ({prepare.GRAPH_FILE} and {prepare.TENSORS_FILE} in the run directory); "
                     "train.py must end with prepare.finish(model, stats, batch_size)") from None
    except Unsafe as e:
        raise Refused(str(e)) from None
    graph = sanitize_graph(graph)  # before torch sees a byte of it
    try:
        loaded = {k: v.to(device) for k, v in load_tensors(tensors).items()}
        del tensors
        state = {k: torch.nn.Parameter(v, requires_grad=False) if v.is_floating_point() else v
                 for k, v in loaded.items() if not k.startswith(prepare.CONSTANT_PREFIX)}
        constants = {k[len(prepare.CONSTANT_PREFIX):]: v for k, v in loaded.items()
                     if k.startswith(prepare.CONSTANT_PREFIX)}
        program = deserialize(SerializedArtifact(graph, state, constants, None))
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
