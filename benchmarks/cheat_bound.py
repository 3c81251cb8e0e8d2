"""What the causality check leaves a cheat, in bits per byte: a model that reads the future at a fraction f of
the scored positions escapes k probes with probability (1 - f)^k; at those positions it can at most bring its
loss to 0. The most it gains is therefore the sum of the f largest per-token losses of an honest model (the
cheat picks the positions where honest prediction is worst), over the validation split's bytes: this script
measures that on a real export, for the f the harness's two probe counts guarantee (1% with 459 probes, 0.1%
with the audit's 4,603), to set against one run's noise (BENCHMARKS.md).

    python benchmarks/cheat_bound.py RUN_OUT_DIR     # a run's out/ holding model.graph.json and model.safetensors

Uses the prepared data in AUTORESEARCH_CACHE (default ~/.cache/autoresearch) and the repository's prepare.py.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FRACTIONS = (0.01, 0.001)  # what 459 and 4,603 probes catch with probability 0.99 (evaluator/probes.py)


def per_token_nats(out_dir: Path):
    """Each scored position's cross-entropy (nats) on the validation split, and the bytes of its target."""
    import torch
    import torch.nn.functional as F

    import prepare
    from autoresearch.evaluator.graph import load_program

    module, shape = load_program(prepare, out_dir, "cpu")
    batch_size = shape[0]
    rows = prepare.evaluation_rows("val")
    token_bytes = prepare.Tokenizer.from_directory().get_token_bytes()
    nats, nbytes = [], []
    dtype = json.loads((out_dir / prepare.RESULT_FILE).read_text())["dtype"]  # as the evaluator scores it
    with torch.no_grad(), prepare.autocast_for("cpu", dtype):
        for i in range(0, rows.shape[0], batch_size):
            batch = torch.from_numpy(rows[i:i + batch_size])
            n = batch.shape[0]
            if n < batch_size:
                batch = batch[torch.arange(batch_size) % n]
            logits = module(batch[:, :-1])
            y = batch[:n, 1:].reshape(-1)
            nats.append(F.cross_entropy(logits[:n].float().reshape(-1, logits.shape[-1]), y, reduction="none"))
            nbytes.append(token_bytes[y])
    nats, nbytes = torch.cat(nats).double(), torch.cat(nbytes)
    scored = nbytes > 0
    return nats[scored], int(nbytes.sum())


def bound(nats, total_bytes: int, f: float) -> float:
    """The most a cheat at fraction f of the positions gains (bpb): its f largest losses brought to 0."""
    k = max(1, int(f * len(nats)))
    return float(nats.topk(k).values.sum()) / (math.log(2) * total_bytes)


def main() -> None:
    out_dir = Path(sys.argv[1])
    nats, total_bytes = per_token_nats(out_dir)
    val_bpb = float(nats.sum()) / (math.log(2) * total_bytes)
    print(json.dumps({"export": str(out_dir), "scored_positions": len(nats), "val_bpb": round(val_bpb, 6),
                      "mean_nats": round(float(nats.mean()), 4),
                      **{f"max_gain_bpb_at_{f:g}": round(bound(nats, total_bytes, f), 5) for f in FRACTIONS},
                      **{f"top_{f:g}_mean_nats": round(float(nats.topk(max(1, int(f * len(nats)))).values.mean()), 3)
                         for f in FRACTIONS}}, indent=1))


if __name__ == "__main__":
    main()
