"""The causality check: later tokens must never change an earlier position's scored log-probability (CausalProbes),
on the validation rows, deeper for a run that may be kept."""

from __future__ import annotations

from .safe_read import Refused

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
# configuration let a train.py honest on its first seed cheat on the others (redteam seed-dependent-audit). Its
# cost, and why no arrangement of probes certifies as much for less: docs/speed.md.
AUDIT_PROBES = 4603


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

