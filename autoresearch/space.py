"""The constants' search space: which hyperparameters of train.py a built-in proposer may move, their ranges per
profile, and the constants that must follow a move so that train.py's own checks hold."""

from __future__ import annotations

import math

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

LR_SPACE = {
    "MATRIX_LR": FloatDistribution(0.005, 0.2, log=True),
    "EMBEDDING_LR": FloatDistribution(0.05, 3.0, log=True),
    "UNEMBEDDING_LR": FloatDistribution(0.0005, 0.05, log=True),
    "SCALAR_LR": FloatDistribution(0.05, 3.0, log=True),
    "WEIGHT_DECAY": FloatDistribution(0.0, 0.4),
    "WARMUP_RATIO": FloatDistribution(0.0, 0.2),
    "WARMDOWN_RATIO": FloatDistribution(0.1, 0.9),
    "FINAL_LR_FRAC": FloatDistribution(0.0, 0.3),
}
SPACES = {
    "cpu": {
        "DEPTH": IntDistribution(2, 8),
        "MODEL_DIM": CategoricalDistribution([64, 96, 128, 160, 192, 256]),
        "TOTAL_BATCH_SIZE": CategoricalDistribution([1024, 2048, 4096, 8192, 16384]),
        "WINDOW_PATTERN": CategoricalDistribution(["L", "SL", "SSL", "SSSL"]),
        **LR_SPACE,
    },
    "gpu": {
        "DEPTH": IntDistribution(4, 16),
        "MODEL_DIM": CategoricalDistribution([256, 384, 512, 640, 768, 1024]),
        "TOTAL_BATCH_SIZE": CategoricalDistribution([2**17, 2**18, 2**19, 2**20]),
        "WINDOW_PATTERN": CategoricalDistribution(["L", "SL", "SSL", "SSSL"]),
        **LR_SPACE,
    },
}


SIZE_ARMS = ("tune DEPTH", "tune MODEL_DIM")  # the moves that make the model smaller (down) or larger (up)


def parameters(values: dict) -> int | None:
    """The model's parameters outside its embeddings, about 12 * DEPTH * MODEL_DIM**2 (attention 4 d^2, an MLP of
    4x 8 d^2 per block: the count scaling laws use, Kaplan et al. 2020), from train.py's constants; None where
    they are not plain numbers."""
    depth, dim = values.get("DEPTH"), values.get("MODEL_DIM")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (depth, dim)):
        return None
    return 12 * depth * dim * dim


def rounded(value):
    if isinstance(value, float) and value != 0:
        return float(f"{value:.3g}")
    return value


def in_space(dist, value) -> bool:
    """Whether value is one the distribution can hold (an agent may have set anything)."""
    if isinstance(dist, CategoricalDistribution):
        return value in dist.choices
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not dist.low <= value <= dist.high:
        return False
    return not (isinstance(dist, IntDistribution) and value != int(value))


def steps(dist, value, fine: bool = False) -> list[tuple[object, str]]:
    """The values a constant may step to from `value`, each with its direction: halved and doubled on a log
    scale, a quarter of the range on a linear one, the next integer or the neighbouring choice (fine: half those
    steps, a factor of sqrt(2) or an eighth of the range; none for integers and choices). From a number outside
    the range (an agent may have written anything there: a learning rate of 0), back to the range's nearest end
    and to its middle."""
    if isinstance(dist, CategoricalDistribution):
        if fine:
            return []
        choices = list(dist.choices)
        if value not in choices:
            return [(c, "") for c in choices]
        i = choices.index(value)
        return [(choices[j], "down" if j < i else "up") for j in (i - 1, i + 1) if 0 <= j < len(choices)]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        return []
    if not in_space(dist, value):
        if fine or dist.low <= value <= dist.high:
            return []  # a non-integer inside an integer range: nothing sensible to step from
        middle = (dist.low * dist.high) ** 0.5 if dist.log else (dist.low + dist.high) / 2
        middle = round(middle) if isinstance(dist, IntDistribution) else rounded(middle)
        nearest = dist.low if value < dist.low else dist.high
        out = [(nearest, ""), (middle, "")]
        return [(v, "up" if v > value else "down") for v, _ in dict.fromkeys(out, None) if in_space(dist, v)]
    if isinstance(dist, IntDistribution):
        out = [] if fine else [(int(value) - 1, "down"), (int(value) + 1, "up")]  # DEPTH = 4.0: integers
    elif dist.log:
        factor = 2 ** 0.5 if fine else 2
        out = [(rounded(value / factor), "down"), (rounded(value * factor), "up")]
    else:
        step = (dist.high - dist.low) / (8 if fine else 4)
        out = [(rounded(max(dist.low, value - step)), "down"), (rounded(min(dist.high, value + step)), "up")]
    return [(v, d) for v, d in out if in_space(dist, v) and v != value]


def size_steps(dist, value) -> list[tuple[object, str]]:
    """A size constant's halving and doubling (DEPTH 4 -> 2 or 8; MODEL_DIM 128 -> 64 or 256, the nearest
    choice): the steps the researcher takes first where the model is far from the size its budget suits."""
    if isinstance(dist, CategoricalDistribution):
        if value not in dist.choices or not isinstance(value, (int, float)) or value <= 0:
            return []
        nearest = [min(dist.choices, key=lambda c: abs(math.log(c / target))) for target in (value / 2, value * 2)]
    elif isinstance(dist, IntDistribution) and in_space(dist, value):
        nearest = [max(dist.low, (int(value) + 1) // 2), min(dist.high, int(value) * 2)]  # into the range
    else:
        return []
    out = [(nearest[0], "down"), (nearest[1], "up")]
    return [(v, d) for v, d in out if in_space(dist, v) and v != value]


def consequences(changes: dict, current: dict, seq_len: int) -> dict:
    """Other constants that must follow `changes`, so that train.py's own checks hold: HEAD_DIM divides
    MODEL_DIM, DEVICE_BATCH_SIZE rows divide TOTAL_BATCH_SIZE."""
    extra = {}
    dim = changes.get("MODEL_DIM", current.get("MODEL_DIM"))
    head = changes.get("HEAD_DIM", current.get("HEAD_DIM"))
    if head and dim and dim % head:
        extra["HEAD_DIM"] = math.gcd(dim, head)
    total = changes.get("TOTAL_BATCH_SIZE")
    if total is not None:
        rows = max(1, total // seq_len)
        device = min(current.get("DEVICE_BATCH_SIZE", rows), rows)
        while rows % device:
            device -= 1
        if device != current.get("DEVICE_BATCH_SIZE"):
            extra["DEVICE_BATCH_SIZE"] = device
    return extra
