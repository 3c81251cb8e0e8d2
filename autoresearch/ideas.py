"""Ideas as code: named transformations of train.py, drawn from the public record of fixed-budget training (the
modded-nanogpt speedrun's records, nanochat's defaults, the GPT-J/PaLM and T5/Chinchilla papers).

Each idea rewrites one *site* of train.py (a statement, a method, a default argument, a constant: sites.py finds,
reads and rewrites them) to one of a few *variants*; this module is the catalog: which sites, how each variant is
written, which ideas move them. Ideas on different sites compose; ideas on one site (init) keep each other's
settings.

`recommended` is the variant the public record favours, or None where it depends on the model and machine. The
proposer (researcher.py) tries moves towards it first; moves away from it are allowed but expected to lose.

The row's description names the idea and its parameters, `idea NAME: key=value, ...` (descriptions.py), so that
people, agents and the proposer can read from results.tsv what was tried.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass, field

from autoresearch import descriptions
from autoresearch.sites import EditError
from autoresearch.sites import (ConstantSite, DefaultArgSite, NotApplicable, Site, assigns, find_def, is_call_to,
                                math_import, names, statement, tree)


ACTIVATIONS = {
    "relu2": "F.relu(self.c_fc(x)).square()",  # ReLU squared: modded-nanogpt, nanochat
    "gelu": "F.gelu(self.c_fc(x))",
    "silu": "F.silu(self.c_fc(x))",
    "relu": "F.relu(self.c_fc(x))",
}


def _mlp_return(p):
    note = "  # ReLU squared" if p["act"] == "relu2" else ""
    return f"return self.c_proj({ACTIVATIONS[p['act']]}){note}"


def _mlp_init(p):
    r = p["ratio"]
    return (f"def __init__(self, cfg: GPTConfig):\n    super().__init__()\n"
            f"    self.c_fc = nn.Linear(cfg.n_embd, {r} * cfg.n_embd, bias=False)\n"
            f"    self.c_proj = nn.Linear({r} * cfg.n_embd, cfg.n_embd, bias=False)\n")


def _qk(p):
    q, k = "apply_rotary(q, cos, sin)", "apply_rotary(k, cos, sin)"
    if p["norm"]:
        q, k = f"rms_norm({q})", f"rms_norm({k})"
    if p["gain"] != 1.0:  # sharper attention than 1/sqrt(head_dim) allows once q and k are normalised
        q = f"{p['gain']!r} * {q}"
    return f"q, k = {q}, {k}" + ("  # QK-norm" if p["norm"] else "")


def _block(p):
    if p["layout"] == "prenorm":
        return ("def forward(self, x, ve, cos, sin, mask):\n"
                "    x = x + self.attn(rms_norm(x), ve, cos, sin, mask)\n"
                "    return x + self.mlp(rms_norm(x))\n")
    return ("def forward(self, x, ve, cos, sin, mask):\n"
            "    h = rms_norm(x)  # attention and MLP side by side on one normalised input (GPT-J, PaLM)\n"
            "    return x + self.attn(h, ve, cos, sin, mask) + self.mlp(h)\n")


def _init(p):
    gain = "" if p["gain"] == 1.0 else f"{p['gain']!r} * "
    proj = ("        nn.init.zeros_(block.attn.c_proj.weight)  # every block starts as the identity\n"
            "        nn.init.zeros_(block.mlp.c_proj.weight)\n") if p["proj"] == "zero" else (
            "        for lin in (block.attn.c_proj, block.mlp.c_proj):\n"
            "            nn.init.uniform_(lin.weight, -bound, bound)\n")
    return ("def init_weights(self):\n"
            "    d = self.cfg.n_embd\n"
            f"    bound = {gain}3**0.5 * d**-0.5  # uniform with std {gain}d^-0.5\n"
            "    nn.init.normal_(self.wte.weight, std=1.0)\n"
            "    for emb in self.value_embeds.values():\n"
            "        nn.init.uniform_(emb.weight, -bound, bound)\n"
            f"    nn.init.normal_(self.lm_head.weight, std={p['head_std']!r})\n"
            "    for block in self.blocks:\n"
            "        for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.c_fc):\n"
            "            nn.init.uniform_(lin.weight, -bound, bound)\n"
            + proj +
            "        if block.attn.ve_gate is not None:\n"
            "            nn.init.zeros_(block.attn.ve_gate.weight)\n")


SCHEDULES = {
    "linear": "cooldown = (1 - progress) / WARMDOWN_RATIO",
    "cosine": "cooldown = 0.5 * (1 + math.cos(math.pi * (1 - (1 - progress) / WARMDOWN_RATIO)))",
    "sqrt": "cooldown = 1 - ((progress - 1 + WARMDOWN_RATIO) / WARMDOWN_RATIO) ** 0.5",
}


def _schedule(p):
    doc = {"linear": "linear warmdown", "cosine": "cosine warmdown", "sqrt": "1-sqrt warmdown"}[p["shape"]]
    return ("def lr_multiplier(progress: float) -> float:\n"
            f'    """Learning-rate factor at a fraction of the time budget: linear warmup, flat, {doc}."""\n'
            "    if progress < WARMUP_RATIO:\n"
            "        return (progress + 1e-8) / WARMUP_RATIO\n"
            "    if progress <= 1 - WARMDOWN_RATIO:\n"
            "        return 1.0\n"
            f"    {SCHEDULES[p['shape']]}\n"
            "    return cooldown + (1 - cooldown) * FINAL_LR_FRAC\n")


def _lr_loop(p):
    text = ("for opt in optimizers:\n"
            "    for group in opt.param_groups:\n"
            "        group[\"lr\"] = group[\"initial_lr\"] * multiplier\n")
    if p["start"] == "off":
        return text
    return text + (
        "        if \"momentum\" in group:  # Muon's momentum warms up over the first 30% (modded-nanogpt)\n"
        f"            group[\"momentum\"] = MUON_MOMENTUM - (MUON_MOMENTUM - {p['start']!r}) * "
        "max(0.0, 1 - budget.progress / 0.3)\n")


VE_LAYERS = {
    "alternate": "[i for i in range(cfg.n_layer) if i % 2 == (cfg.n_layer - 1) % 2]",
    "all": "list(range(cfg.n_layer))",
    "last": "[cfg.n_layer - 1]",
    "none": "[]",
}


def _rotary(p):
    return ("def rotary(seq_len, head_dim, base=" + repr(p["base"]) + "):\n"
            "    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)\n"
            "    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)\n"
            "    return freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]\n")


def _loss(p):
    ce = "F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), reduction=reduction)"
    if not p["z"]:
        return f"return {ce}"
    # z-loss (PaLM): keeps the softmax normaliser near 1; training loss only, never the per-token losses. Its
    # gradient only (zl - zl.detach() is 0 in value): the printed loss stays cross-entropy, which pruning compares
    # with the champion's (a night pruned z=1e-4 for the z term's 0.3 nats, not for learning worse)
    return (f"return {ce} + ((zl := {p['z']!r} * torch.logsumexp(logits, -1).square().mean()) - zl.detach() "
            "if reduction == \"mean\" else 0.0)  # z-loss")


SITES = {s.name: s for s in [
    Site("mlp_activation",
         lambda t: statement(t, "MLP.forward", lambda n: isinstance(n, ast.Return) and "c_proj" in names(n)),
         _mlp_return, {"act": list(ACTIVATIONS)}, {"act": "relu2"}),
    Site("mlp_width", lambda t: find_def(t, "MLP.__init__"), _mlp_init, {"ratio": [2, 3, 4, 6]}, {"ratio": 4}),
    Site("qk", lambda t: statement(t, "CausalSelfAttention.forward", lambda n: assigns("q", "k")(n)
                                   and "apply_rotary" in names(n)),
         _qk, {"norm": [True, False], "gain": [1.0, 1.5, 2.0]}, {"norm": True, "gain": 1.0}),
    Site("block", lambda t: find_def(t, "Block.forward"), _block, {"layout": ["prenorm", "parallel"]},
         {"layout": "prenorm"}),
    Site("final_norm", lambda t: statement(t, "GPT.forward", lambda n: assigns("logits")(n)
                                           and "lm_head" in names(n)),
         lambda p: "logits = self.lm_head(rms_norm(x)).float()" if p["norm"] else "logits = self.lm_head(x).float()",
         {"norm": [True, False]}, {"norm": True}),
    Site("embed_norm", lambda t: statement(t, "GPT.forward", assigns("x", "x0")),
         lambda p: "x = x0 = rms_norm(self.wte(idx))" if p["norm"] else "x = x0 = self.wte(idx)",
         {"norm": [True, False]}, {"norm": True}),
    Site("init", lambda t: find_def(t, "GPT.init_weights"), _init,
         {"proj": ["zero", "uniform"], "head_std": [0.001, 0.01, 0.02], "gain": [0.5, 1.0, 2.0]},
         {"proj": "zero", "head_std": 0.001, "gain": 1.0}),
    Site("schedule", lambda t: find_def(t, "lr_multiplier"), _schedule, {"shape": list(SCHEDULES)},
         {"shape": "linear"}),
    Site("momentum_warmup", lambda t: statement(t, "main", lambda n: isinstance(n, ast.For)
                                                and ast.unparse(n.iter) == "optimizers" and "initial_lr" in
                                                ast.unparse(n)),
         _lr_loop, {"start": ["off", 0.85, 0.7]}, {"start": "off"}),
    Site("value_embeddings", lambda t: statement(t, "GPT.__init__", assigns("self.ve_layers")),
         lambda p: f"self.ve_layers = {VE_LAYERS[p['layers']]}", {"layers": list(VE_LAYERS)}, {"layers": "alternate"}),
    Site("x0_mix", lambda t: statement(t, "GPT.__init__", assigns("self.x0_lambdas")),
         lambda p: f"self.x0_lambdas = nn.Parameter(torch.full((cfg.n_layer,), {p['init']!r}))",
         {"init": [0.0, 0.1, 0.3]}, {"init": 0.1}),
    Site("rotary", lambda t: find_def(t, "GPT.rotary"), _rotary, {"base": [1000.0, 10000.0, 100000.0]},
         {"base": 10000.0}),
    Site("grad_clip", lambda t: statement(t, "main", lambda n: isinstance(n, ast.Expr)
                                          and is_call_to(n, "clip_grad_norm_")),
         lambda p: f"torch.nn.utils.clip_grad_norm_(model.parameters(), {p['max_norm']!r})",
         {"max_norm": [0.5, 1.0, 2.0, 5.0]}, {"max_norm": 1.0}),
    Site("loss", lambda t: statement(t, "GPT.forward", lambda n: isinstance(n, ast.Return)
                                     and is_call_to(n, "cross_entropy")),
         _loss, {"z": [0.0, 1e-4, 1e-3]}, {"z": 0.0}),
    Site("nesterov", lambda t: statement(t, "Muon.step", assigns("nesterov")),
         lambda p: ('nesterov = torch._foreach_lerp(grads, bufs, group["momentum"])' if p["on"] else
                    "nesterov = bufs  # plain momentum, no Nesterov look-ahead"), {"on": [True, False]}, {"on": True}),
]}


SITES["newton_schulz"] = DefaultArgSite("newton_schulz", "orthogonalize", "steps", {"steps": [3, 4, 5, 6]},
                                        {"steps": 5})


CONSTANT_SITES = {
    "softcap": ConstantSite("softcap", "SOFTCAP", {"cpu": [0.0, 15.0, 30.0], "gpu": [0.0, 15.0, 30.0]}),
    "head_dim": ConstantSite("head_dim", "HEAD_DIM", {"cpu": [16, 32, 64], "gpu": [64, 128]},
                             valid=lambda c: isinstance(c.get("HEAD_DIM"), int) and c["HEAD_DIM"] > 0 and (
                                 not isinstance(c.get("MODEL_DIM"), int) or c["MODEL_DIM"] % c["HEAD_DIM"] == 0)),
    "adam_betas": ConstantSite("adam_betas", "ADAM_BETAS", {"cpu": [(0.8, 0.95), (0.9, 0.95), (0.9, 0.99)],
                                                            "gpu": [(0.8, 0.95), (0.9, 0.95), (0.9, 0.99)]}),
}


@dataclass(frozen=True)
class Idea:
    name: str
    site: str
    params: tuple[str, ...]       # the site's parameters this idea moves (the others stay as they are)
    recommended: dict | None      # the public record's choice for them, or None: no prior either way
    why: str = field(default="", compare=False)


CATALOG = [
    Idea("activation", "mlp_activation", ("act",), {"act": "relu2"},
         "ReLU squared beat GELU in the modded-nanogpt speedrun; nanochat keeps it"),
    Idea("mlp_ratio", "mlp_width", ("ratio",), None, "MLP width: 4x is GPT-2's; narrower trains more steps"),
    Idea("qk_norm", "qk", ("norm",), {"norm": True}, "QK-norm: RMS-normalised queries and keys (speedrun record)"),
    Idea("qk_gain", "qk", ("gain",), None, "attention sharpness once QK-norm bounds the logits"),
    Idea("block_layout", "block", ("layout",), {"layout": "prenorm"},
         "pre-norm residual blocks; parallel attention+MLP (GPT-J, PaLM) trades quality for speed"),
    Idea("final_norm", "final_norm", ("norm",), {"norm": True}, "RMSNorm before the head (every modern GPT)"),
    Idea("embed_norm", "embed_norm", ("norm",), {"norm": True}, "RMSNorm right after the embedding (speedrun)"),
    Idea("zero_init", "init", ("proj",), {"proj": "zero"},
         "zero-initialised output projections: every block starts as the identity (speedrun record)"),
    Idea("init_gain", "init", ("gain",), {"gain": 1.0}, "scale of the blocks' uniform init, std d^-0.5 at 1"),
    Idea("head_init", "init", ("head_std",), {"head_std": 0.001}, "a small lm_head init (nanochat)"),
    Idea("lr_schedule", "schedule", ("shape",), {"shape": "linear"},
         "warmup-stable-decay with a linear warmdown to 0 (speedrun, nanochat); cosine and 1-sqrt decays"),
    Idea("momentum_warmup", "momentum_warmup", ("start",), None, "Muon momentum from 0.85 up (speedrun record)"),
    Idea("value_embeddings", "value_embeddings", ("layers",), None, "value embeddings mixed into attention (speedrun)"),
    Idea("x0_mix", "x0_mix", ("init",), None, "how much of the embedding each block reads back (speedrun's x0 lambdas)"),
    Idea("rope_base", "rotary", ("base",), None, "rotary base frequency"),
    Idea("grad_clip", "grad_clip", ("max_norm",), None, "gradient norm clipping"),
    Idea("z_loss", "loss", ("z",), None, "z-loss on the softmax normaliser (PaLM)"),
    Idea("newton_schulz", "newton_schulz", ("steps",), None, "Newton-Schulz iterations per Muon step: fewer is faster"),
    Idea("nesterov", "nesterov", ("on",), {"on": True}, "Nesterov momentum in Muon (speedrun, nanochat)"),
    Idea("softcap", "softcap", ("SOFTCAP",), None, "logit soft-capping (Gemma 2, speedrun record)"),
    Idea("head_dim", "head_dim", ("HEAD_DIM",), None, "attention head size: more, smaller heads or fewer, larger"),
    Idea("adam_betas", "adam_betas", ("ADAM_BETAS",), None, "AdamW betas for embeddings, head and scalars"),
]
IDEAS = {i.name: i for i in CATALOG}


def site_of(idea: Idea, profile: str = "cpu") -> Site:
    if idea.site in CONSTANT_SITES:
        return CONSTANT_SITES[idea.site].for_profile(profile)
    return SITES[idea.site]


def current(idea: Idea, source: str, profile: str = "cpu") -> dict | None:
    """The idea's parameters as train.py holds them; None: the site holds something else (unknown)."""
    params = site_of(idea, profile).read(source)
    return None if params is None else {k: params[k] for k in idea.params}


def variants(idea: Idea, profile: str = "cpu") -> list[dict]:
    grid = site_of(idea, profile).grid
    return [dict(zip(idea.params, values)) for values in itertools.product(*(grid[k] for k in idea.params))]


def applicable(idea: Idea, source: str, profile: str = "cpu") -> bool:
    try:
        site_of(idea, profile).read(source)
        return True
    except (NotApplicable, SyntaxError):
        return False


def apply(source: str, idea: Idea, params: dict, profile: str = "cpu") -> str:
    """train.py with the idea's site set to `params` (its other parameters kept as they are, or the shipped
    defaults when the site is unknown). The result must parse and read back as `params`; otherwise EditError."""
    site = site_of(idea, profile)
    held = site.read(source)
    full = dict(held if held is not None else (site.defaults or {}), **params)
    new = site.write(source, full)
    try:
        tree(new)
    except SyntaxError as e:
        raise EditError(f"idea {idea.name} would not parse: {e}") from None
    if current(idea, new, profile) != params:
        raise EditError(f"idea {idea.name} did not read back as {params}")
    return math_import(new)


def describe(idea: Idea, params: dict) -> str:
    return descriptions.idea_text(idea.name, params)


def parse(description: str) -> tuple[str, dict] | None:
    """(idea name, params) of a description written by describe() (harness notes after it are ignored), else
    None."""
    parsed = descriptions.parse_idea(description)
    return parsed if parsed and parsed[0] in IDEAS else None
