"""The catalog of ideas (autoresearch/ideas.py): every variant applies to the shipped train.py, reads back, leaves
every other site alone, and one variant of each idea (and all of them at once) trains two steps and exports."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from autoresearch import ideas
from autoresearch.sites import EditError
from conftest import ROOT, reviewed_train_source

SOURCE = reviewed_train_source()


def test_the_catalog_reads_the_shipped_train_py_and_every_variant_applies_alone():
    assert len(ideas.CATALOG) >= 15 and len({i.name for i in ideas.CATALOG}) == len(ideas.CATALOG)
    for idea in ideas.CATALOG:
        held = ideas.current(idea, SOURCE)
        assert held is not None, f"{idea.name}: the shipped train.py reads as unknown"
        if idea.recommended is not None:
            assert held == idea.recommended, f"{idea.name}: the default is not the public record's choice"
        for params in ideas.variants(idea):
            if params == held:
                continue
            new = ideas.apply(SOURCE, idea, params)
            assert ideas.current(idea, new) == params
            assert ideas.parse(ideas.describe(idea, params)) == (idea.name, params)
            for other in ideas.CATALOG:  # sites are independent; ideas sharing one keep each other's values
                if other is not idea:
                    assert ideas.current(other, new) == ideas.current(other, SOURCE), (idea.name, other.name)


def test_an_idea_repairs_its_site_whatever_someone_wrote_there():
    """A regression written by hand (not by the catalog) reads as unknown, and the recommended variant restores
    the shipped code, comments aside."""
    broken = SOURCE.replace("        q, k = rms_norm(apply_rotary(q, cos, sin)), rms_norm(apply_rotary(k, cos, sin))  # QK-norm",
                            "        q = apply_rotary(q, cos, sin)\n        k, q = apply_rotary(k, cos, sin), q * 1.0")
    assert broken != SOURCE
    # the site is the (q, k) assignment; with it gone the idea does not apply, and says so
    assert not ideas.applicable(ideas.IDEAS["qk_norm"], broken)
    with pytest.raises(ideas.NotApplicable):
        ideas.apply(broken, ideas.IDEAS["qk_norm"], {"norm": True})
    gelu = SOURCE.replace("F.relu(self.c_fc(x)).square()", "F.gelu(self.c_fc(x), approximate='tanh')")
    assert ideas.current(ideas.IDEAS["activation"], gelu) is None
    assert ideas.apply(gelu, ideas.IDEAS["activation"], {"act": "relu2"}) == SOURCE
    flat = SOURCE.replace("    cooldown = (1 - progress) / WARMDOWN_RATIO\n", "    return 1.0\n")
    assert ideas.current(ideas.IDEAS["lr_schedule"], flat) is None
    repaired = ideas.apply(flat, ideas.IDEAS["lr_schedule"], {"shape": "linear"})
    assert ideas.current(ideas.IDEAS["lr_schedule"], repaired) == {"shape": "linear"}
    cosine = ideas.apply(SOURCE, ideas.IDEAS["lr_schedule"], {"shape": "cosine"})
    assert "\nimport math\n" in cosine
    with pytest.raises(EditError):
        ideas.apply(SOURCE, ideas.IDEAS["head_dim"], {"HEAD_DIM": "wide"})


def _trial_variant(idea):
    """The variant of an idea the training test runs: the last one that differs from the default."""
    held = ideas.current(idea, SOURCE)
    return [v for v in ideas.variants(idea) if v != held][-1]


TRAIN_TWO_STEPS = textwrap.dedent('''
    import json, os, sys, types
    import torch
    import prepare
    import runtime
    out = {}
    for name, source in json.load(sys.stdin).items():
        module = types.ModuleType("train_" + name)
        module.__file__ = "train.py"
        exec(compile(source, "train.py", "exec"), module.__dict__)
        ticks = iter(range(10**6))
        budget = runtime.time_budget()
        runtime.budget_clock = lambda: (lambda: next(ticks) * budget / 2)  # exactly two steps (runtime.Budget's clock)
        run_dir = os.path.join(os.environ["RUNS"], name)
        os.environ["AUTORESEARCH_RUN_DIR"] = run_dir
        try:
            module.main()
            result = json.load(open(os.path.join(run_dir, "result.json")))
            out[name] = {"steps": result["num_steps"], "export": result.get("export_error"),
                         "graph": os.path.exists(os.path.join(run_dir, prepare.GRAPH_FILE)), "bpb": result["val_bpb"]}
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {e}"}
    print("RESULT " + json.dumps(out))
''')


@pytest.mark.slow
def test_one_variant_of_each_idea_and_all_of_them_composed_train_two_steps_and_export(small_cache, tmp_path):
    from conftest import eager_train_source
    base = eager_train_source()
    sources, composed = {}, base
    for idea in ideas.CATALOG:
        params = _trial_variant(idea)
        sources[idea.name] = ideas.apply(base, idea, params)
        if idea.name != "head_dim":  # head size 64 leaves 2 heads; with the others it still composes below
            composed = ideas.apply(composed, idea, params)
    sources["composed"] = composed
    env = dict(os.environ, AUTORESEARCH_CACHE=str(small_cache), RUNS=str(tmp_path), PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", TRAIN_TWO_STEPS], input=json.dumps(sources), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, proc.stdout[-2000:] + proc.stderr[-3000:]
    results = json.loads(line[0][len("RESULT "):])
    for name, r in results.items():
        assert "error" not in r, (name, r)
        assert r["steps"] == 2 and r["export"] is None and r["graph"], (name, r)
        assert 0 < r["bpb"] < 20, (name, r)


def test_moves_that_would_break_train_py_s_own_checks_or_imports_are_not_offered():
    """A head size that does not divide the width; the cosine warmdown's `import math`, added where train.py
    imports and removed when nothing uses it any more (a round trip gives the shipped file back)."""
    from autoresearch.sites import set_constants
    narrow = set_constants(SOURCE, {"MODEL_DIM": 96}, "cpu")
    with pytest.raises(EditError, match="does not fit"):
        ideas.apply(narrow, ideas.IDEAS["head_dim"], {"HEAD_DIM": 64})
    odd = SOURCE.replace("import os\nimport sys\n", "import os, sys\n")
    cosine = ideas.apply(odd, ideas.IDEAS["lr_schedule"], {"shape": "cosine"})
    assert "\nimport math\n" in cosine and "math.cos" in cosine
    assert ideas.apply(cosine, ideas.IDEAS["lr_schedule"], {"shape": "linear"}) == odd
    back = ideas.apply(ideas.apply(SOURCE, ideas.IDEAS["lr_schedule"], {"shape": "cosine"}),
                       ideas.IDEAS["lr_schedule"], {"shape": "linear"})
    assert back == SOURCE


def test_z_loss_adds_its_gradient_but_the_printed_loss_stays_cross_entropy():
    """Pruning compares a candidate's printed training loss with the champion's: a z term in the value put a
    z-loss run 0.3 above the champion and pruned it for a number that is not its loss."""
    import torch
    import torch.nn.functional as F
    site = ideas.SITES["loss"]
    namespace = {"torch": torch, "F": F}
    exec("def loss(logits, targets, reduction):\n" + textwrap.indent(site.render({"z": 1e-3}), "    "), namespace)
    torch.manual_seed(0)
    logits = (10 * torch.randn(2, 3, 7)).requires_grad_()
    targets = torch.randint(0, 7, (2, 3))
    ce = F.cross_entropy(logits.view(-1, 7), targets.reshape(-1))
    with_z = namespace["loss"](logits, targets, "mean")
    assert with_z.item() == pytest.approx(ce.item(), abs=1e-6)
    (g_ce,) = torch.autograd.grad(ce, logits)
    (g_z,) = torch.autograd.grad(with_z, logits)
    assert not torch.allclose(g_ce, g_z)  # the z term still trains
    per_token = namespace["loss"](logits, targets, "none")
    assert per_token.shape == (6,)
