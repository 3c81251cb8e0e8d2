"""The harness's own evaluation of a finished run: val_bpb (and test_bpb) of the exported model.

It runs in a fresh process that never imports train.py: `python -I -B evaluate.py`, with a clean copy of
prepare.py taken from git into a new private directory (so no edited file and no forged bytecode can stand in
for it). It loads the exported graph (JSON) and its tensors (safetensors) with no
pickle and no code from the run, allows only ATen operators and no state mutation, checks that it reproduces
train.py's own score on the fixed check rows, scores the validation rows, and checks that the model is causal
(later tokens never change an earlier position's scored log-probability), deeper for a run that may be kept,
whose test rows it also scores. It prints one JSON object.

This file is both the script and the harness's way to call it (Evaluator, run_evaluation); it imports nothing
of the autoresearch package, so it runs the same from any directory. Nothing the training could reach feeds it
(Evaluator says how, in each mode; docs/integrity.md, the threat model).
"""

from __future__ import annotations

import json
import math
import operator
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# How far the harness's score of the exported model may be from train.py's score of the live model on the
# same rows. float32 on the CPU agrees to ~1e-7 (BENCHMARKS.md); reduced precision on a GPU uses other kernels
# (FA3 in training, SDPA in the export), so its tolerance is wide (not yet measured on a GPU).
CHECK_TOLERANCE = {"float32": 1e-5, "bfloat16": 1e-2, "float16": 1e-2}
# Largest change allowed in an earlier position's scored cross-entropy (nats) when later tokens change: an
# absolute bound set by the dtype alone, never by anything the model outputs. An honest model's drift is exactly 0
# on a CPU, in float32 and under bf16 autocast alike (measured, tests/test_evaluate.py), since each row's result
# does not depend on the other rows of a batch of the same shape; float32's bound leaves room for summation order.
# A cheat below the bound gains at most the bound per token: 1e-4 nats is < 4e-5 bpb at >= 3 bytes a token.
# Reduced precision on a GPU is not yet measured there: its bound is wider (docs/integrity.md gives the arithmetic).
CAUSAL_TOLERANCE = {"float32": 1e-4, "bfloat16": 1e-2, "float16": 1e-2}
CPU_CAUSAL_TOLERANCE = CAUSAL_TOLERANCE["float32"]
# Probes of the causality check on the validation rows (CausalProbes): the smallest count that catches a model
# reading the future at 1% of the positions with probability >= 0.99, ceil(log(0.01) / log(0.99)) = 459.
CAUSAL_PROBES = 459
# The deeper audit of every run that may be kept (its val_bpb below the champion's mean, so the test split is
# scored too; every run while there is no champion): catches a model reading the future at 0.1% of the positions
# with probability >= 0.99, ceil(log(0.01) / log(0.999)) = 4603. Every such run, whatever its seed: once per
# configuration let a train.py honest on its first seed cheat on the others (redteam seed-dependent-audit). It
# costs ~39 s on the cpu profile, on those runs only (BENCHMARKS.md).
AUDIT_PROBES = 4603


class Refused(Exception):
    """The model breaks a rule (reads the future, mutates state, runs non-ATen code)."""


class Broken(Exception):
    """The run left no usable model (the export is missing, unreadable or does not run)."""

# --- reading what a run wrote ------------------------------------------------------------------------------
# Everything in a run's output directory was written by untrusted code. The harness opens such a file only as a
# regular file, never through a link (O_NOFOLLOW), never a FIFO or a device (O_NONBLOCK, then fstat), and reads
# at most a bound: a link to ~/.ssh, a FIFO that blocks forever or a sparse 1 TB file is a refusal, not a hang.

GRAPH_LIMIT = 64 << 20     # bytes of model.graph.json: the default model's is ~0.2 MB
TENSORS_LIMIT = 16 << 30   # bytes of model.safetensors
RESULT_LIMIT = 1 << 20     # bytes of result.json


class Unsafe(Exception):
    """A file the run left is not a plain regular file of sane size; the message says what it is."""


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of `path` if it is a regular file (not a link) of at most `limit` bytes. FileNotFoundError if
    there is none; Unsafe for anything else."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as e:  # ELOOP: a symbolic link; others: unreadable
        kind = "a symbolic link" if os.path.islink(path) else f"unreadable ({e.strerror})"
        raise Unsafe(f"{path.name} is {kind}; a run writes its files itself, as regular files") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unsafe(f"{path.name} is not a regular file (mode {stat.filemode(st.st_mode)})")
        if st.st_size > limit:
            raise Unsafe(f"{path.name} has {st.st_size:,} bytes, more than the {limit:,} allowed")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 24, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise Unsafe(f"{path.name} grew past {limit:,} bytes while it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)

# --- the graph, validated before any deserializer sees it ----------------------------------------------------
# torch.export's deserializer hands some strings to sympy (symbolic shapes), to pytree (specs) and to Python
# (guards): a graph file written by the training could run code in this process. So the file is never given to
# it as written: it is parsed as plain JSON, checked field by field against the schema below (static integer
# shapes only, names of one plain form, ATen operators from an explicit list), and a new, canonical document is
# built from the checked values alone; only that reaches torch. Fields the evaluation has no use for (stack
# traces, module stacks, range constraints, guards) are dropped, whatever they hold.

# Operator packets (torch.ops.aten.NAME.overload) a forward pass may call: pure tensor functions. Not here, and so
# refused: random ones (rand*, normal, bernoulli, multinomial, ...), in-place ones (NAME_), uninitialised memory
# (empty*), host syncs (_local_scalar_dense, item), I/O and printing, copies into existing tensors.
ALLOWED_OPS = frozenset("""
    abs add addcdiv addcmul addmm alias all amax amin any arange argmax argmin argsort atan atan2 baddbmm bitwise_and
    bitwise_not bitwise_or bitwise_xor bmm cat ceil chunk clamp clamp_max clamp_min clone constant_pad_nd contiguous
    convolution conv1d cos cumprod cumsum detach diagonal div dot dropout einsum elu embedding eq erf exp exp2 expand
    expand_as flatten flip floor floor_divide fmod full full_like gather ge gelu group_norm gt hardsigmoid hardswish
    hardtanh index index_put index_select isfinite isinf isnan layer_norm le leaky_relu lerp lift_fresh_copy linear
    linalg_vector_norm log log10 log1p log2 log_softmax logical_and logical_not logical_or logical_xor logsumexp lt
    masked_fill matmul max maximum mean min minimum mish mm movedim mul mv narrow native_group_norm native_layer_norm
    ne neg norm ones ones_like outer pad permute pow prod reciprocal relu remainder repeat repeat_interleave reshape
    rms_norm roll round rsqrt scalar_tensor scaled_dot_product_attention scatter scatter_add select sigmoid sign silu
    sin softmax softplus sort split split_with_sizes sqrt square squeeze stack std std_mean sub sum t take_along_dim
    tanh topk transpose tril triu trunc type_as unbind unflatten unsqueeze var var_mean view where zeros zeros_like
    _assert_tensor_metadata _fused_rms_norm _log_softmax _softmax _to_copy _unsafe_view to
    _scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_for_cpu
    _scaled_dot_product_efficient_attention _scaled_dot_product_cudnn_attention
    slice slice_scatter select_scatter rsub expm1 sinh cosh asin acos hypot logit unfold new_zeros new_ones new_full
    index_add bucketize
""".split())
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}\Z")         # a value's name in the graph
FQN = re.compile(r"[A-Za-z0-9_]{1,100}(\.[A-Za-z0-9_]{1,100}){0,20}\Z")  # a parameter's or buffer's name
TARGET = re.compile(r"torch\.ops\.aten\.([a-z0-9_]+)\.([a-zA-Z0-9_]+)\Z")
STRING_ARG = re.compile(r"[A-Za-z0-9_,.\->]{0,64}\Z")      # e.g. gelu's approximate="tanh", an einsum equation
DEVICES = ("cpu", "cuda", "mps", "meta")
MAX_NODES = 200_000
MAX_DIM = 1 << 31
MAX_NUMEL = 1 << 36
MAX_INT = 1 << 63  # int64, the range of an ATen int (slice's end is often 2**63 - 1)
# The pytree specs of forward(tokens) -> logits, written here, never read from the file.
IN_SPEC = ('[1, {"type": "builtins.tuple", "context": "null", "children_spec": [{"type": "builtins.tuple", '
           '"context": "null", "children_spec": [{"type": null, "context": null, "children_spec": []}]}, '
           '{"type": "builtins.dict", "context": "[]", "children_spec": []}]}]')
OUT_SPEC = '[1, {"type": null, "context": null, "children_spec": []}]'


def _fail(where: str, what: str):
    raise Refused(f"the exported graph is not of the accepted form: {where}: {what} (only static shapes, plain "
                  "names and the ATen operators listed in autoresearch/evaluate.py are evaluated)")


def _expect(value, kind, where: str):
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and -MAX_INT <= value < MAX_INT
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        _fail(where, f"expected {getattr(kind, '__name__', kind)}, found {str(value)[:40]!r}")
    return value


def _keys(obj, allowed, where: str, required=()) -> dict:
    _expect(obj, dict, where)
    extra = set(obj) - set(allowed)
    if extra:
        _fail(where, f"unexpected field {sorted(extra)[0]!r}")
    missing = [k for k in required if k not in obj]
    if missing:
        _fail(where, f"missing field {missing[0]!r}")
    return obj


def _name(value, where: str, pattern=NAME) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        _fail(where, f"{str(value)[:60]!r} is not a plain name")
    return value


def _tensor_ref(obj, where: str, defined: set) -> dict:
    _keys(obj, ("name",), where, ("name",))
    name = _name(obj["name"], where)
    if name not in defined:
        _fail(where, f"{name!r} is not a tensor of the graph")
    return {"name": name}


def _static(obj, where: str) -> dict:
    """A SymInt that must be a plain integer: {"as_int": n}. A symbolic expression is never accepted."""
    _keys(obj, ("as_int",), where, ("as_int",))
    return {"as_int": _expect(obj["as_int"], int, where)}


def _tensor_meta(obj, where: str) -> dict:
    _keys(obj, ("dtype", "sizes", "requires_grad", "device", "strides", "storage_offset", "layout"), where,
          ("dtype", "sizes", "device", "strides", "storage_offset", "layout"))
    sizes = [_static(s, where + ".sizes") for s in _expect(obj["sizes"], list, where)]
    strides = [_static(s, where + ".strides") for s in _expect(obj["strides"], list, where)]
    numel = 1
    for s in sizes:
        if not 0 <= s["as_int"] <= MAX_DIM:
            _fail(where, f"size {s['as_int']}")
        numel *= s["as_int"]
    if numel > MAX_NUMEL or len(sizes) > 8 or len(strides) != len(sizes):
        _fail(where, f"a tensor of {len(sizes)} dimensions, {numel} elements")
    return {"dtype": _expect(obj["dtype"], int, where), "sizes": sizes,
            "requires_grad": bool(_expect(obj.get("requires_grad", False), bool, where)),
            "device": _device(obj["device"], where), "strides": strides,
            "storage_offset": _static(obj["storage_offset"], where), "layout": _expect(obj["layout"], int, where)}


def _device(obj, where: str) -> dict:
    _keys(obj, ("type", "index"), where, ("type",))
    if obj["type"] not in DEVICES:
        _fail(where, f"device {str(obj['type'])[:20]!r}")
    index = obj.get("index")
    return {"type": obj["type"], "index": None if index is None else _expect(index, int, where)}


def _argument(obj, where: str, defined: set) -> dict:
    """One argument of a node: exactly one field, of the plain kinds below."""
    _expect(obj, dict, where)
    if len(obj) != 1:
        _fail(where, "an argument must have exactly one field")
    (kind, value), = obj.items()
    if kind == "as_tensor":
        return {kind: _tensor_ref(value, where, defined)}
    if kind == "as_tensors":
        return {kind: [_tensor_ref(v, where, defined) for v in _expect(value, list, where)]}
    if kind == "as_optional_tensors":
        return {kind: [_argument(v, where, defined) for v in _expect(value, list, where)
                       if _keys(v, ("as_tensor", "as_none"), where)]}
    if kind in ("as_int", "as_scalar_type", "as_layout", "as_memory_format"):
        return {kind: _expect(value, int, where)}
    if kind in ("as_float",):
        return {kind: float(_expect(value, float, where))}
    if kind in ("as_bool", "as_none"):
        return {kind: _expect(value, bool, where)}
    if kind in ("as_ints",):
        return {kind: [_expect(v, int, where) for v in _expect(value, list, where)]}
    if kind in ("as_floats",):
        return {kind: [float(_expect(v, float, where)) for v in _expect(value, list, where)]}
    if kind in ("as_bools",):
        return {kind: [_expect(v, bool, where) for v in _expect(value, list, where)]}
    if kind == "as_sym_int":
        return {kind: _static(value, where)}
    if kind == "as_sym_ints":
        return {kind: [_static(v, where) for v in _expect(value, list, where)]}
    if kind == "as_device":
        return {kind: _device(value, where)}
    if kind == "as_string":
        if not isinstance(value, str) or not STRING_ARG.match(value):
            _fail(where, f"string argument {str(value)[:40]!r}")
        return {kind: value}
    _fail(where, f"argument kind {kind[:40]!r}")


def sanitize_graph(raw: bytes) -> bytes:
    """The graph file rebuilt from its checked values alone (see above); Refused when anything is off."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise Broken(f"the exported graph is not valid JSON ({str(e)[:200]})") from None
    _keys(doc, ("graph_module", "opset_version", "range_constraints", "schema_version", "verifiers", "torch_version",
                "guards_code"), "the document", ("graph_module", "opset_version", "schema_version"))
    gm = _keys(doc["graph_module"], ("graph", "signature", "module_call_graph", "metadata",
                                     "treespec_namedtuple_fields"), "graph_module", ("graph", "signature"))
    graph = _keys(gm["graph"], ("inputs", "outputs", "nodes", "tensor_values", "sym_int_values", "sym_bool_values",
                                "is_single_tensor_return", "custom_obj_values", "sym_float_values"), "graph",
                  ("inputs", "outputs", "nodes", "tensor_values"))
    for symbolic in ("sym_int_values", "sym_bool_values", "custom_obj_values", "sym_float_values"):
        if graph.get(symbolic):
            _fail("graph", f"{symbolic} must be empty (static shapes only, no custom objects)")
    tensors = {_name(k, "tensor_values"): _tensor_meta(v, f"tensor_values[{k}]")
               for k, v in _expect(graph["tensor_values"], dict, "tensor_values").items()}
    defined = set(tensors)
    nodes = _expect(graph["nodes"], list, "nodes")
    if len(nodes) > MAX_NODES:
        _fail("nodes", f"{len(nodes)} nodes")
    clean_nodes = []
    for i, node in enumerate(nodes):
        where = f"node {i}"
        _keys(node, ("target", "inputs", "outputs", "metadata", "is_hop_single_tensor_return", "name"), where,
              ("target", "inputs", "outputs"))
        match = TARGET.match(str(node["target"]))
        if not match or match.group(1) not in ALLOWED_OPS or "out" in match.group(2).split("_"):
            _fail(where, f"operator {str(node['target'])[:80]!r} is not allowed")
        inputs = []
        for arg in _expect(node["inputs"], list, where):
            _keys(arg, ("name", "arg", "kind"), where, ("name", "arg"))
            inputs.append({"name": _name(arg["name"], where), "arg": _argument(arg["arg"], where, defined),
                           "kind": _expect(arg.get("kind", 1), int, where)})
        if match.group(1) == "dropout" and not any(a["name"] == "train" and a["arg"] == {"as_bool": False}
                                                   for a in inputs):
            _fail(where, "dropout in training mode is random")
        if "dot_product_attention" in match.group(1) and any(
                a["name"] == "dropout_p" and a["arg"].get("as_float", 0.0) != 0.0 for a in inputs):
            _fail(where, "attention dropout is random")
        outputs = [_argument(o, where + " output", defined) for o in _expect(node["outputs"], list, where)]
        clean_nodes.append({"target": node["target"], "inputs": inputs, "outputs": outputs, "metadata": {},
                            "is_hop_single_tensor_return": None})
    specs_in = []
    for s in _expect(gm["signature"].get("input_specs"), list, "input_specs"):
        _expect(s, dict, "input_specs")
        if len(s) != 1:
            _fail("input_specs", "one kind per input")
        (kind, spec), = s.items()
        if kind == "parameter":
            _keys(spec, ("arg", "parameter_name"), kind, ("arg", "parameter_name"))
            specs_in.append({kind: {"arg": _tensor_ref(spec["arg"], kind, defined),
                                    "parameter_name": _name(spec["parameter_name"], kind, FQN)}})
        elif kind == "buffer":
            _keys(spec, ("arg", "buffer_name", "persistent"), kind, ("arg", "buffer_name"))
            specs_in.append({kind: {"arg": _tensor_ref(spec["arg"], kind, defined),
                                    "buffer_name": _name(spec["buffer_name"], kind, FQN),
                                    "persistent": bool(_expect(spec.get("persistent", True), bool, kind))}})
        elif kind == "tensor_constant":
            _keys(spec, ("arg", "tensor_constant_name"), kind, ("arg", "tensor_constant_name"))
            specs_in.append({kind: {"arg": _tensor_ref(spec["arg"], kind, defined),
                                    "tensor_constant_name": _name(spec["tensor_constant_name"], kind, FQN)}})
        elif kind == "user_input":
            _keys(spec, ("arg",), kind, ("arg",))
            _keys(spec["arg"], ("as_tensor",), kind, ("as_tensor",))
            specs_in.append({kind: {"arg": {"as_tensor": _tensor_ref(spec["arg"]["as_tensor"], kind, defined)}}})
        else:
            _fail("input_specs", f"input kind {kind[:40]!r}")
    specs_out = []
    for s in _expect(gm["signature"].get("output_specs"), list, "output_specs"):
        _keys(s, ("user_output",), "output_specs", ("user_output",))  # no buffer or input mutation
        _keys(s["user_output"], ("arg",), "user_output", ("arg",))
        _keys(s["user_output"]["arg"], ("as_tensor",), "user_output", ("as_tensor",))
        specs_out.append({"user_output": {"arg": {"as_tensor": _tensor_ref(s["user_output"]["arg"]["as_tensor"],
                                                                            "user_output", defined)}}})
    if sum("user_input" in s for s in specs_in) != 1 or len(specs_out) != 1:
        raise Broken("the exported forward pass must take the tokens alone and return the logits alone")
    user_input = next(s["user_input"]["arg"]["as_tensor"]["name"] for s in specs_in if "user_input" in s)
    clean = {
        "graph_module": {
            "graph": {"inputs": [_argument(a, "graph inputs", defined) for a in _expect(graph["inputs"], list, "inputs")],
                      "outputs": [_argument(a, "graph outputs", defined)
                                  for a in _expect(graph["outputs"], list, "outputs")],
                      "nodes": clean_nodes, "tensor_values": tensors, "sym_int_values": {}, "sym_bool_values": {},
                      "is_single_tensor_return": bool(graph.get("is_single_tensor_return", False)),
                      "custom_obj_values": {}, "sym_float_values": {}},
            "signature": {"input_specs": specs_in, "output_specs": specs_out},
            "module_call_graph": [{"fqn": "", "signature": {"inputs": [], "outputs": [], "in_spec": IN_SPEC,
                                                            "out_spec": OUT_SPEC, "forward_arg_names": [user_input]}}],
            "metadata": {}, "treespec_namedtuple_fields": {}},
        "opset_version": {"aten": _expect(_keys(doc["opset_version"], ("aten",), "opset_version", ("aten",))["aten"],
                                          int, "opset_version")},
        "range_constraints": {},
        "schema_version": {k: _expect(doc["schema_version"].get(k), int, "schema_version") for k in ("major", "minor")},
        "verifiers": [v for v in _expect(doc.get("verifiers", []), list, "verifiers") if v in ("TRAINING", "ATEN")],
        "torch_version": "",
        "guards_code": [],
    }
    return json.dumps(clean).encode()


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


def token_nats(logits, targets):
    """Each position's cross-entropy (nats) of its target, computed as prepare.rows_bpb scores it: what the
    causality check compares. A log-probability does not move when a constant is added to a position's logits,
    so nothing a model outputs can widen the check's tolerance."""
    import torch.nn.functional as F

    vocab = logits.shape[-1]
    return F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1).to(logits.device),
                           reduction="none").reshape(targets.shape).cpu().double()


class CausalProbes:
    """The causality check, on the validation rows themselves, after the scoring pass.

    The scoring pass keeps every position's scored cross-entropy (record). A probe is then a (row, j) pair drawn
    uniformly, by a secret random generator, from every validation row and every position 1 <= j < T: the row's
    tokens from j on are replaced by random ones, and the scored cross-entropy of every position before j must
    come out as in the scoring pass, to an absolute tolerance set by the dtype alone. A prediction at position
    j - 1 that read a later token changes, whatever the model does when it is being checked: in the scoring pass
    it saw the real tokens, in the probe it cannot (they are gone), so honest-when-checked and
    cheating-when-scored disagree exactly where a probe lands. A model that reads the future at a fraction f of
    the positions is caught by one probe with probability at least f, and by k independent probes with
    1 - (1 - f) ** k: 0.99 at f = 1% with CAUSAL_PROBES, at f = 0.1% with AUDIT_PROBES (docs/integrity.md). A
    cheat too small to pass the tolerance gains at most the tolerance per token (nats)."""

    def __init__(self, rows, batch_size: int, vocab: int, rng, probes: int = CAUSAL_PROBES):
        import numpy as np

        self.rows, self.batch_size, self.vocab, self.rng, self.probes = rows, batch_size, vocab, rng, probes
        self.nats = np.full((rows.shape[0], rows.shape[1] - 1), np.nan)
        self.calls = 0
        self.np = np

    def record(self, logits) -> None:
        """Called with each batch's logits of the scoring pass, in order (rows_bpb's batches)."""
        import torch

        first = self.calls * self.batch_size
        self.calls += 1
        n = min(self.batch_size, self.rows.shape[0] - first)
        targets = torch.from_numpy(self.rows[first:first + n, 1:])
        self.nats[first:first + n] = token_nats(logits[:n], targets).numpy()

    def check(self, forward, tolerance: float, probes: int | None = None) -> int:
        """Run `probes` probes (default: the constructor's); Refused at the first earlier position whose scored
        cross-entropy moved by more than `tolerance` nats. Returns the probes run."""
        import torch

        n_rows, t = self.nats.shape
        count = self.probes if probes is None else probes
        if t < 2:
            return 0
        if count >= n_rows * (t - 1):  # as many as there are (row, j) pairs: each once, a certain verdict for less
            picks = [(r, j) for r in range(n_rows) for j in range(1, t)]
        else:
            picks = [(int(self.rng.integers(n_rows)), int(self.rng.integers(1, t))) for _ in range(count)]
        for start in range(0, len(picks), self.batch_size):
            chunk = picks[start:start + self.batch_size]
            x = torch.from_numpy(self.np.stack([self.rows[r, :-1] for r, _ in chunk]))
            targets = torch.from_numpy(self.np.stack([self.rows[r, 1:] for r, _ in chunk]))
            for i, (r, j) in enumerate(chunk):
                fresh = torch.from_numpy(self.rng.integers(0, self.vocab, size=t - j)).to(x.dtype)
                x[i, j:] = torch.where(fresh == x[i, j:], (fresh + 1) % self.vocab, fresh)  # every token changes
            n = x.shape[0]
            if n < self.batch_size:
                x = x[torch.arange(self.batch_size) % n]
            nats = token_nats(forward(x)[:n], targets).numpy()
            for i, (r, j) in enumerate(chunk):
                drift = float(self.np.abs(nats[i, :j] - self.nats[r, :j]).max())
                if not drift <= tolerance:  # NaN fails too
                    raise Refused(f"the model is not causal: on validation row {r}, changing the tokens from "
                                  f"position {j} on changed the scored log-probability of an earlier position by "
                                  f"{drift:.3g} nats (allowed {tolerance:.3g}); a prediction may only use earlier "
                                  "tokens")
        return len(picks)


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


def evaluate(prepare, request: Request) -> dict:
    import numpy as np
    import torch

    t0 = time.time()
    device, dtype = request.device, request.dtype
    module, shape = load_program(prepare, Path(request.run_dir), device)
    batch_size, seq_len = shape if len(shape) == 2 else (None, None)
    manifest = prepare.require_manifest()
    if seq_len != manifest["max_seq_len"]:
        raise Broken(f"the model was exported for inputs of shape {shape}; it must take (batch, "
                     f"{manifest['max_seq_len']}) tokens")
    token_bytes = prepare.Tokenizer.from_directory().get_token_bytes()
    out = {"batch_size": batch_size, "device": device, "dtype": dtype}

    def forward(x):
        return module(x.to(device))

    vocab = int(token_bytes.shape[0])
    with torch.no_grad(), prepare.autocast_for(torch.device(device).type, dtype):
        try:
            check = prepare.check_rows(batch_size)
            out["check_bpb"] = finite(prepare.rows_bpb(forward, check, token_bytes, batch_size, device), "check_bpb")
            if not abs(out["check_bpb"] - request.check_bpb) <= CHECK_TOLERANCE[dtype]:
                raise Refused(f"the exported model does not reproduce train.py's: check_bpb {out['check_bpb']:.6f} "
                              f"(harness) vs {request.check_bpb:.6f} (train.py)")
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
                test = prepare.evaluation_rows("test", **drawn)
                out["test_bpb"] = finite(prepare.rows_bpb(forward, test, token_bytes, batch_size, device), "test_bpb")
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


def parse(argv: list[str]):
    """The script's arguments: (the parsed namespace, the Request; None with --wait, which reads it later)."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--prepare-dir", required=True, help="a directory holding the clean fixed files (prepare.py, runtime.py) alone")
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


def main(argv: list[str]) -> int:
    args, request = parse(argv)
    sys.path[:0] = [args.prepare_dir]
    sys.path += args.path
    if args.wait:  # importing beside a training that starts: yield the cores to it. This process has its own
        os.nice(19)  # session, hence its own autogroup where Linux has them, and nice only counts within one:
        try:         # the autogroup's nice too (a bf16 matmul next to it: 789 GFLOP/s, with it 1,900, alone 1,950)
            with open("/proc/self/autogroup", "w") as f:
                f.write("19")
        except OSError:  # no autogroups (or not Linux): the plain nice is what counts
            pass
        import numpy  # noqa: F401  everything evaluate() and load_program() import, so that they find it loaded
        import safetensors.torch  # noqa: F401
        import torch  # noqa: F401
        import torch._export.serde.serialize  # noqa: F401
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

# --- the harness side --------------------------------------------------------------------------------------


class Evaluator:
    """This file as a script in a fresh, isolated interpreter with the clean fixed files `sources` (file name ->
    bytes: prepare.py and the runtime.py it imports) as the only prepare it can import, on the run
    whose output directory is `out`; run() hands it the Request and returns its JSON: val_bpb (and test_bpb,
    check_bpb, seconds), or refused / error with a reason. One run per Evaluator; close() ends it.

    Nothing the training could reach feeds it (docs/integrity.md, the threat model). Without a sandbox it starts
    in run(), once the training's whole process tree has ended (supervise.py), with the Request on its command
    line: a training running as you could write into a process started earlier. Under protection "bwrap" it
    starts at once (early): it imports torch (~2.7 s on 2 CPU cores) while the training starts, at the lowest
    priority, then reads the Request on its stdin, which only the harness holds: the training's sandbox has its
    own process namespace and no capability, so it cannot see this process, let alone write to it. There it
    runs in its own sandbox (sandbox.wrap_evaluator): it reads the graph and weights a run wrote, so it may
    write nothing, reach no network, and see nothing but the data, its own files and `out`."""

    def __init__(self, sources: dict[str, bytes], cache: Path, out: Path, protection: str = "none"):
        self.cache, self.out, self.protection, self.proc = cache, out, protection, None
        self.private = Path(tempfile.mkdtemp(prefix="autoresearch-eval-"))
        (self.private / "fixed").mkdir()
        for name, source in sources.items():
            (self.private / "fixed" / name).write_bytes(source)
        script = self.private / "evaluate.py"  # a copy: the evaluator depends on no file of the work tree
        script.write_bytes(Path(__file__).read_bytes())
        # -I: no PYTHON* variables, no user site, no script directory on sys.path; -B: no bytecode written. The
        # fresh private directory has no __pycache__, so prepare is compiled from the clean source. The harness's
        # PYTHONPATH is passed as arguments (a Python whose packages come through it), never a repository's.
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                 if p and Path(p).is_dir() and not (Path(p) / "prepare.py").exists()]
        self.argv = [sys.executable, "-I", "-B", str(script), "--prepare-dir", str(self.private / "fixed"),
                     *[a for p in paths for a in ("--path", p)]]
        if protection == "bwrap":
            self._start(["--wait"])

    def _start(self, args: list[str]) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AUTORESEARCH_"))}
        env["AUTORESEARCH_CACHE"] = str(self.cache)
        argv = self.argv + args
        from autoresearch import processes, sandbox  # the harness's side only: the script imports none of them
        if self.protection == "bwrap":
            argv = sandbox.wrap_evaluator(argv, self.private, self.cache, self.out)
        # dead with the harness from its first instruction: the script's own prctl comes after Python's start-up,
        # and a harness killed in between left it running (benchmarks/faults.py, a kill while evaluating)
        argv = processes.tied_to_parent(argv)
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     stdin=subprocess.PIPE, start_new_session=True)

    def run(self, request: Request, timeout: float, on_start=None) -> dict:
        """Evaluate the finished run `request` names. Call it only once the training's whole process tree has
        ended. on_start(pid) is called first, so that a harness killed meanwhile can be cleaned up after."""
        early = self.proc is not None
        if not early:
            self._start(request.argv())
        try:
            if on_start:
                on_start(self.proc.pid)
            stdout, stderr = self.proc.communicate(json.dumps(asdict(request)) + "\n" if early else None,
                                                   timeout=timeout)
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
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        shutil.rmtree(self.private, ignore_errors=True)


def run_evaluation(sources: dict[str, bytes], cache: Path, request: Request, timeout: float,
                   protection: str = "none", on_start=None) -> dict:
    """An Evaluator on the finished run `request` names, at once (Evaluator.run)."""
    return Evaluator(sources, cache, Path(request.run_dir), protection).run(request, timeout, on_start)


if __name__ == "__main__":
    if sys.platform.startswith("linux"):
        import ctypes
        import signal
        libc = ctypes.CDLL(None)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # die with the harness or worker that started it
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no other non-root process of this uid may ptrace it
    code = main(sys.argv[1:])
    sys.stdout.flush()  # the harness waits for this process to end: skip torch's teardown (~0.9 s on 2 cores)
    sys.stderr.flush()
    os._exit(code)
