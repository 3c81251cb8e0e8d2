"""The evaluator's own defences, in process and fast: the graph file is validated and rebuilt before torch's
deserializer sees it (a fuzz test over every string of a real export), and the causality probes catch a model
that reads the future on a fraction of the positions as often as the arithmetic says."""

import json
import math
import random
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from autoresearch.evaluator.graph import sanitize_graph
from autoresearch.evaluator.probes import AUDIT_PROBES, CAUSAL_PROBES, CPU_CAUSAL_TOLERANCE, CausalProbes, token_nats
from autoresearch.evaluator.scoring import Request, parse
from autoresearch.state import FIXED
from autoresearch.evaluator.safe_read import Broken, Refused
from conftest import ROOT, reviewed_train_source


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A real export of train.py's GPT (one small block), as prepare.finish serializes it: (graph JSON, model).
    The reviewed train.py, never the work tree's (docs/integrity.md)."""
    import importlib.util

    from torch._export.serde.serialize import serialize
    path = tmp_path_factory.mktemp("reviewed") / "train.py"
    path.write_text(reviewed_train_source())
    spec = importlib.util.spec_from_file_location("train_for_export", path)
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    cfg = train.GPTConfig(vocab_size=64, seq_len=16, n_layer=1, n_embd=32, head_dim=16, window_pattern="L", softcap=15.0)
    torch.manual_seed(0)
    model = train.GPT(cfg)
    model.init_weights()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.eval()
    program = torch.export.export(model, (torch.zeros(2, 16, dtype=torch.long),), strict=False)
    raw = serialize(program, serialize_state_dict=False, serialize_constants=False,
                    serialize_example_inputs=False).exported_program
    return raw, model, program


def load(raw: bytes, program):
    """What the evaluator does with a graph file: validate and rebuild it, then deserialize and run it."""
    from torch._export.serde.serialize import SerializedArtifact, deserialize
    clean = sanitize_graph(raw)
    state = {k: torch.nn.Parameter(v.detach(), requires_grad=False) for k, v in program.state_dict.items()}
    module = deserialize(SerializedArtifact(clean, state, dict(program.constants), None)).module()
    return module(torch.zeros(2, 16, dtype=torch.long))


def test_an_honest_export_loads_and_computes_what_the_model_does(exported):
    raw, model, program = exported
    x = torch.randint(0, 64, (2, 16))
    from torch._export.serde.serialize import SerializedArtifact, deserialize
    state = {k: torch.nn.Parameter(v.detach(), requires_grad=False) for k, v in program.state_dict.items()}
    module = deserialize(SerializedArtifact(sanitize_graph(raw), state, dict(program.constants), None)).module()
    assert torch.equal(module(x), model(x))


def test_an_export_made_by_a_torch_without_the_switches_loads_and_computes_the_same(exported, tmp_path, monkeypatch):
    """torch 2.11 (an H200 host's) has serialize(exported_program, opset_version, pickle_protocol) and
    no switch to leave the weights out: prepare.finish's export crashed every run there."""
    import prepare
    from torch._export.serde import serialize as serde
    real = serde.serialize

    def old_serialize(exported_program, opset_version=None, pickle_protocol=2):
        return real(exported_program, opset_version, pickle_protocol)

    monkeypatch.setattr(serde, "serialize", old_serialize)
    _, model, program = exported
    prepare.save_exported(program, tmp_path)
    from autoresearch.evaluator.graph import load_program
    module, shape = load_program(prepare, tmp_path, "cpu")
    x = torch.randint(0, 64, (2, 16))
    assert shape == (2, 16) and torch.equal(module(x), model(x))


def strings(node, path=()):
    """Every string in a JSON document, dictionary keys included, as (path, is_key)."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield path + (k,), True
            yield from strings(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from strings(v, path + (i,))
    elif isinstance(node, str):
        yield path, False


def replaced(doc, path, is_key, payload) -> bytes:
    """The document with the string at path (a value, or a key) replaced by payload, serialized; doc unchanged."""
    *parents, last = path
    holder = doc
    for p in parents:
        holder = holder[p]
    if is_key:
        holder[payload] = holder.pop(last)
        try:
            return json.dumps(doc).encode()
        finally:
            holder[last] = holder.pop(payload)
    old, holder[last] = holder[last], payload
    try:
        return json.dumps(doc).encode()
    finally:
        holder[last] = old


def test_fuzz_every_string_of_a_real_graph_replaced_by_code_runs_nothing(exported, tmp_path):
    """Each string field of the export (values and keys: names, targets, specs, metadata, versions), replaced in
    turn by Python that would write a canary file, in the forms a deserializer might evaluate (sympy, eval, a
    pytree type name). Nothing may ever write the canary: each graph is refused, or rebuilt without the string."""
    raw, _, program = exported
    doc = json.loads(raw)
    canary = tmp_path / "CANARY"
    code = f"__import__('pathlib').Path({str(canary)!r}).write_text('ran')"
    payloads = [f"{code} or 4", code, f"Symbol('s0') + ({code} and 0)", "builtins.eval", "os.system"]
    places = list(strings(doc))
    assert len(places) > 300  # the whole document: every node's target, names, metadata and the specs
    def kind(path, is_key):  # a field: list indices and the tensors' names folded
        return tuple("*" if not isinstance(p, str) or (i and path[i - 1] == "tensor_values") else p
                     for i, p in enumerate(path)), is_key

    kinds = {kind(path, is_key): (path, is_key) for path, is_key in places}
    clean = sanitize_graph(raw)
    outcomes = {"refused": 0, "dropped": 0, "loaded": 0}
    # Every field (a kind of place: a path with its list indices folded) with every payload, and one place in
    # twelve besides with the payload that sympy and eval both run (all 3,700 take a minute on 2 cores).
    sample = set(random.Random(0).sample(range(len(places)), len(places) // 12))
    for i, (path, is_key) in enumerate(places):
        first = kinds[kind(path, is_key)] == (path, is_key)
        if not first and i not in sample:
            continue
        for payload in payloads if first else payloads[:1]:
            poisoned = replaced(doc, path, is_key, payload)
            try:
                rebuilt = sanitize_graph(poisoned)
            except (Refused, Broken):
                outcomes["refused"] += 1
                continue
            if rebuilt == clean:  # the payload did not survive: torch gets exactly the honest document
                outcomes["dropped"] += 1
                continue
            try:  # it survived into the rebuilt document: torch reads it, and it must still run nothing
                load(poisoned, program)
            except Exception:  # noqa: BLE001 - torch failing on it is fine; running code is not
                pass
            outcomes["loaded"] += 1
            assert not canary.exists(), (path, payload)
    load(raw, program)
    assert not canary.exists()
    assert outcomes["refused"] > outcomes["dropped"] > 0, outcomes  # names and targets refused; metadata dropped


def test_symbolic_sizes_and_range_constraints_are_refused_before_torch_sees_them(exported, tmp_path):
    raw, _, program = exported
    canary = tmp_path / "CANARY"
    code = f"__import__('pathlib').Path({str(canary)!r}).write_text('ran') or 2"
    doc = json.loads(raw)
    name = next(iter(doc["graph_module"]["graph"]["tensor_values"]))
    doc["graph_module"]["graph"]["tensor_values"][name]["sizes"][0] = {"as_expr": {"expr_str": code,
                                                                                 "hint": {"as_int": 2}}}
    with pytest.raises(Refused, match="not of the accepted form"):
        load(json.dumps(doc).encode(), program)
    doc = json.loads(raw)
    doc["range_constraints"] = {"s0": {"min_val": 1, "max_val": code}}
    doc["guards_code"] = [code]
    load(json.dumps(doc).encode(), program)  # loads: both are dropped, never read
    assert not canary.exists()


@pytest.mark.parametrize("target", ["torch.ops.aten.rand.default", "torch.ops.aten.add_.Tensor",
                                    "torch.ops.aten.empty.memory_format", "torch.ops.aten.copy_.default",
                                    "torch.ops.aten._local_scalar_dense.default", "torch.ops.aten.add.out",
                                    "torch.ops.myext.leak.default", "builtins.eval"])
def test_operators_off_the_list_are_refused(exported, target):
    raw, _, program = exported
    doc = json.loads(raw)
    doc["graph_module"]["graph"]["nodes"][0]["target"] = target
    with pytest.raises(Refused, match="is not allowed"):
        sanitize_graph(json.dumps(doc).encode())


def cheats_at(prefix: np.ndarray, fraction: float) -> bool:
    """Where the cheating model reads the next token: a fixed fraction of the prefixes it can see (a hash of
    the tokens so far), so it behaves the same wherever it sees the same prefix, in a probe too."""
    return zlib.crc32(prefix.tobytes()) % 10_000 < fraction * 10_000


def cheating_model(vocab: int, fraction: float):
    def forward(x):
        out = torch.zeros(x.shape[0], x.shape[1], vocab)
        for b in range(x.shape[0]):
            row = x[b].numpy()
            for t in range(x.shape[1] - 1):
                if cheats_at(row[:t + 1], fraction):
                    out[b, t, int(row[t + 1])] = 10.0  # the next token: the cheat
        return out
    return forward


@pytest.mark.parametrize("fraction", [0.01, 0.05])
def test_the_probes_catch_a_model_that_reads_the_future_at_a_fraction_of_positions(fraction):
    """The docs' arithmetic, checked: a model that reads the next token at a fraction f of the validation
    positions (where, it decides from what it sees) is caught by k probes with probability 1 - (1 - f) ** k;
    with CAUSAL_PROBES, >= 0.99 at f = 1%. Measured here over many secret draws, with k = 100."""
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 50, size=(40, 17))
    forward = cheating_model(50, fraction)
    # the share of cheating positions among those a probe can land on: j - 1 for 1 <= j < T (T = 16 inputs)
    f = np.mean([cheats_at(rows[r, :t + 1], fraction) for r in range(40) for t in range(15)])
    probes, caught, trials = 100, 0, 60
    for trial in range(trials):
        p = CausalProbes(rows, 8, 50, np.random.default_rng(1000 + trial), probes)
        for i in range(0, rows.shape[0], 8):
            p.record(forward(torch.from_numpy(rows[i:i + 8, :-1])))
        try:
            p.check(forward, 1e-5)
        except Refused:
            caught += 1
    expected = 1 - (1 - f) ** probes
    assert abs(caught / trials - expected) < 4 * math.sqrt(expected * (1 - expected) / trials) + 0.05, (caught, expected)
    assert 1 - (1 - 0.01) ** CAUSAL_PROBES >= 0.99 > 1 - (1 - 0.01) ** (CAUSAL_PROBES - 1)


def test_an_honest_model_passes_every_probe():
    rng = np.random.default_rng(1)
    rows = rng.integers(0, 50, size=(24, 17))
    emb = torch.randn(50, 50)

    def forward(x):  # causal: position t sees tokens up to t (a running mean of embeddings)
        e = emb[x]
        return e.cumsum(1) / torch.arange(1, x.shape[1] + 1)[None, :, None]

    p = CausalProbes(rows, 8, 50, rng, CAUSAL_PROBES)
    for i in range(0, rows.shape[0], 8):
        p.record(forward(torch.from_numpy(rows[i:i + 8, :-1])))
    assert p.check(forward, 1e-5) == min(CAUSAL_PROBES, 24 * 15)  # each (row, j) once when fewer


def probed(forward, rows, vocab, probes=CAUSAL_PROBES, seed=3):
    """The scoring pass, then the probes, as evaluate() runs them: the number of probes run, or Refused."""
    p = CausalProbes(rows, 8, vocab, np.random.default_rng(seed), probes)
    for i in range(0, rows.shape[0], 8):
        x = torch.from_numpy(rows[i:i + 8, :-1])
        n = x.shape[0]
        p.record(forward(x[torch.arange(8) % n]))
    return p.check(forward, CPU_CAUSAL_TOLERANCE)


def test_a_constant_on_one_position_widens_nothing():
    """Issue 31's attack: a model reading the next token (+40 on its logit) that adds 2**20 to every logit of
    position 0. A tolerance scaled by the logits' size let all 459 probes through; log-probabilities do not move
    with a constant, and the tolerance is the dtype's alone."""
    rows = np.random.default_rng(2).integers(0, 50, size=(24, 17))
    emb, eye = torch.randn(50, 50), torch.eye(50)

    def cheat(x):
        first = (torch.arange(x.shape[1]) == 0).float()[None, :, None] * 2.0 ** 20
        return emb[x] + 40 * eye[x.roll(-1, dims=1)] + first

    with pytest.raises(Refused, match="not causal"):
        probed(cheat, rows, 50)

    def honest_but_huge(x):  # the same constant on an honest model: every probe passes
        return emb[x].cumsum(1) + (torch.arange(x.shape[1]) == 0).float()[None, :, None] * 2.0 ** 20

    assert probed(honest_but_huge, rows, 50) == min(CAUSAL_PROBES, 24 * 15)


def test_a_cheat_below_the_tolerance_gains_less_than_it_per_token():
    """The arithmetic in docs/integrity.md: a model that moves its scored log-probability by less than the
    tolerance at every position passes, and gains at most that many nats per token."""
    rows = np.random.default_rng(4).integers(0, 50, size=(16, 17))
    emb, eye = torch.randn(50, 50), torch.eye(50)
    nudge = 0.5 * CPU_CAUSAL_TOLERANCE

    def honest(x):
        return emb[x].cumsum(1)

    def nudged(x):  # reads the next token, but only to raise its logit by a hair
        return honest(x) + nudge * eye[x.roll(-1, dims=1)]

    assert probed(nudged, rows, 50, probes=200) == 200
    x, y = torch.from_numpy(rows[:, :-1]), torch.from_numpy(rows[:, 1:])
    gain = (token_nats(honest(x), y) - token_nats(nudged(x), y)).max().item()
    assert 0 < gain <= CPU_CAUSAL_TOLERANCE


def test_an_exported_gpt_under_bf16_autocast_drifts_by_exactly_zero(exported):
    """Why a CPU run gets float32's tolerance whatever its dtype: an honest model's earlier positions come out
    bit for bit the same when later tokens change, in float32 and under bf16 autocast."""
    _, model, _ = exported
    rows = np.random.default_rng(5).integers(0, 64, size=(2, 17))
    x = torch.from_numpy(rows[:, :-1])
    for dtype in (torch.float32, torch.bfloat16):
        with torch.no_grad(), torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            before = token_nats(model(x), torch.from_numpy(rows[:, 1:]))
            changed = x.clone()
            changed[:, 9:] = (changed[:, 9:] + 1) % 64
            after = token_nats(model(changed), torch.from_numpy(rows[:, 1:]))
        assert torch.equal(before[:, :9], after[:, :9]), dtype


def test_the_audit_counts_catch_what_the_docs_say():
    assert 1 - (1 - 0.001) ** AUDIT_PROBES >= 0.99 > 1 - (1 - 0.001) ** (AUDIT_PROBES - 1)


def test_the_request_is_the_evaluators_whole_input():
    """The evaluator reads its arguments from its command line alone (no stdin a training could write), and
    they come back as the harness sent them."""
    request = Request("/r/out", "bfloat16", "cpu", 1.25, float("inf"), 7, 70)
    assert parse(["--prepare-dir", "/p", *request.argv()])[1] == Request(
        "/r/out", "bfloat16", "cpu", 1.25, 1e308, 7, 70)


def test_the_script_is_a_copy_of_the_package_that_imports_nothing_else(tmp_path):
    """The script runs from a private copy of the package (harness.copy_script) under `python -I -B`: every
    module but the harness's side, as source alone (no __pycache__, none written), and those modules import one
    another and nothing else of autoresearch, never the harness's side (which is not there to import)."""
    import ast
    import subprocess
    import sys

    from autoresearch.evaluator import harness
    copy = harness.copy_script(tmp_path)
    package = Path(harness.__file__).parent
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in package.glob("*.py")
                                                            if p.name != "harness.py")
    assert {"__main__.py", "scoring.py", "safe_read.py"} <= {p.name for p in copy.iterdir()}
    for path in copy.iterdir():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
                assert node.level in (0, 1) and "harness" not in names, (path.name, names)
                assert node.level or not names[0].startswith("autoresearch"), (path.name, names)
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("autoresearch") for a in node.names), path.name
    (tmp_path / "fixed").mkdir()
    for name in FIXED:
        (tmp_path / "fixed" / name).write_bytes((ROOT / name).read_bytes())
    (tmp_path / "out").mkdir()
    proc = subprocess.run([sys.executable, "-I", "-B", str(copy / "__main__.py"), "--prepare-dir",
                           str(tmp_path / "fixed"), *Request(str(tmp_path / "out"), "float32", "cpu", 1.0).argv()],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0 and "no exported model" in json.loads(proc.stdout)["error"], proc.stderr[-2000:]
    assert not list(tmp_path.rglob("__pycache__"))


def test_a_python_whose_packages_come_through_pythonpath_evaluates(tmp_path):
    """`python -I` drops PYTHONPATH: the evaluator of a harness whose packages come through it crashed on every
    run. The harness passes its PYTHONPATH on the command line (--path). Shown with the base interpreter, whose
    own site-packages lack torch, and this one's packages on PYTHONPATH: the evaluator gets as far as the run's
    (missing) files. The Python without torch is a fresh venv of this one (no system site-packages)."""
    import os
    import subprocess
    import sys
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    base = tmp_path / "bare" / "bin" / "python"
    assert subprocess.run([str(base), "-c", "import torch"], capture_output=True).returncode != 0  # it lacks torch
    # this interpreter's packages, those a venv sees through --system-site-packages too (uv's, in CI)
    packages = os.pathsep.join([*dict.fromkeys(p for p in sys.path if p.endswith("-packages")), str(ROOT)])
    code = ("import json, sys; from pathlib import Path; from autoresearch.evaluator.harness import run_evaluation; "
            "from autoresearch.evaluator.scoring import Request; "
            "r = Request(sys.argv[1], 'float32', 'cpu', 1.0); "
            "print(json.dumps(run_evaluation({n: (Path(sys.argv[2]) / n).read_bytes() "
            "for n in ('prepare.py', 'runtime.py')}, "
            "Path(sys.argv[1]), r)))")
    proc = subprocess.run([str(base), "-c", code, str(tmp_path), str(ROOT)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=packages), timeout=300)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "no exported model" in out.get("error", ""), out


def test_probes_past_the_number_of_positions_check_each_position_once():
    """A small validation set (the tests' 16 rows of 32) has fewer (row, j) pairs than the audit's 4,603 probes:
    each pair is probed once, and a model that reads the future at a single position is caught for certain."""
    rows = np.random.default_rng(6).integers(0, 50, size=(16, 9))
    emb, eye = torch.randn(50, 50), torch.eye(50)

    def one_cheat(x):  # reads the next token at position 3 of row content starting with token rows[5, 0] only
        out = emb[x].cumsum(1)
        hit = (x[:, :1] == int(rows[5, 0])).float()[:, :, None] * (torch.arange(x.shape[1]) == 3).float()[None, :, None]
        return out + 40 * hit * eye[x.roll(-1, dims=1)]

    assert probed(lambda x: emb[x].cumsum(1), rows, 50, probes=AUDIT_PROBES) == 16 * 7
    with pytest.raises(Refused, match="not causal"):
        probed(one_cheat, rows, 50, probes=AUDIT_PROBES)


def test_an_evaluator_directory_left_by_a_killed_harness_is_removed_by_the_next_one(tmp_path, monkeypatch):
    """A harness killed with SIGKILL leaves its evaluator's private directory behind (62 were in /tmp after two days
    of tests); the next evaluator removes those whose harness is gone, and no other."""
    import os
    import subprocess
    import sys
    import tempfile
    from autoresearch import processes
    from autoresearch.evaluator import harness
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_owner = processes.identity(gone.pid)
    gone.wait()
    made = {}
    for name, owner in (("dead", dead_owner), ("alive", processes.identity(os.getpid())), ("new", None)):
        made[name] = tmp_path / f"{harness.PREFIX}{name}"
        made[name].mkdir()
        if owner is not None:
            (made[name] / harness.OWNER).write_text(json.dumps(owner))
    assert harness.sweep_stale() == 1
    assert not made["dead"].exists() and made["alive"].is_dir() and made["new"].is_dir()
