"""The exported program: its graph validated before any deserializer sees it (sanitize_graph), then loaded
from that graph and the safetensors, no pickle and no code from the run (load_program). The evaluator scores it;
`autoresearch sample` and `best` load the champion's the same way (commands.py).

torch.export's deserializer hands some strings to sympy (symbolic shapes), to pytree (specs) and to Python
(guards): a graph file written by the training could run code in this process. So the file is never given to
it as written: it is parsed as plain JSON, checked field by field against the schema below (static integer
shapes only, names of one plain form, ATen operators from an explicit list), and a new, canonical document is
built from the checked values alone; only that reaches torch. Fields the evaluation has no use for (stack
traces, module stacks, range constraints, guards) are dropped, whatever they hold.
"""

from __future__ import annotations

import json
import operator
import re
from pathlib import Path

from .safe_read import GRAPH_LIMIT, TENSORS_LIMIT, Broken, Refused, Unsafe, read_regular

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
                  "names and the ATen operators listed in autoresearch/evaluator/graph.py are evaluated)")


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


def _node(node, where: str, defined: set) -> dict:
    """One node of the graph: an allowed ATen operator on checked arguments, nothing random."""
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
    return {"target": node["target"], "inputs": inputs, "outputs": outputs, "metadata": {},
            "is_hop_single_tensor_return": None}


def _input_spec(s, defined: set) -> dict:
    """One input of the forward pass: a parameter, a buffer, a tensor constant or the tokens."""
    _expect(s, dict, "input_specs")
    if len(s) != 1:
        _fail("input_specs", "one kind per input")
    (kind, spec), = s.items()
    if kind == "parameter":
        _keys(spec, ("arg", "parameter_name"), kind, ("arg", "parameter_name"))
        return {kind: {"arg": _tensor_ref(spec["arg"], kind, defined),
                       "parameter_name": _name(spec["parameter_name"], kind, FQN)}}
    if kind == "buffer":
        _keys(spec, ("arg", "buffer_name", "persistent"), kind, ("arg", "buffer_name"))
        return {kind: {"arg": _tensor_ref(spec["arg"], kind, defined),
                       "buffer_name": _name(spec["buffer_name"], kind, FQN),
                       "persistent": bool(_expect(spec.get("persistent", True), bool, kind))}}
    if kind == "tensor_constant":
        _keys(spec, ("arg", "tensor_constant_name"), kind, ("arg", "tensor_constant_name"))
        return {kind: {"arg": _tensor_ref(spec["arg"], kind, defined),
                       "tensor_constant_name": _name(spec["tensor_constant_name"], kind, FQN)}}
    if kind == "user_input":
        _keys(spec, ("arg",), kind, ("arg",))
        _keys(spec["arg"], ("as_tensor",), kind, ("as_tensor",))
        return {kind: {"arg": {"as_tensor": _tensor_ref(spec["arg"]["as_tensor"], kind, defined)}}}
    _fail("input_specs", f"input kind {kind[:40]!r}")


def _output_spec(s, defined: set) -> dict:
    """The forward pass's one output: a user output (no buffer or input mutation)."""
    _keys(s, ("user_output",), "output_specs", ("user_output",))
    _keys(s["user_output"], ("arg",), "user_output", ("arg",))
    _keys(s["user_output"]["arg"], ("as_tensor",), "user_output", ("as_tensor",))
    return {"user_output": {"arg": {"as_tensor": _tensor_ref(s["user_output"]["arg"]["as_tensor"], "user_output",
                                                             defined)}}}


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
    clean_nodes = [_node(node, f"node {i}", defined) for i, node in enumerate(nodes)]
    specs_in = [_input_spec(s, defined) for s in _expect(gm["signature"].get("input_specs"), list, "input_specs")]
    specs_out = [_output_spec(s, defined)
                 for s in _expect(gm["signature"].get("output_specs"), list, "output_specs")]
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
