"""How sure is "better"? Configurations compared with their run-to-run noise.

A configuration is one train.py (its git blob): every run of it, with any seed, is one sample of its
val_bpb. The noise is estimated once for the tag, pooled over every configuration that ran more than once:
with one to three runs per configuration, a per-configuration variance (Welch's test, a bootstrap) is itself
too noisy to decide on, while the pooled one gains a degree of freedom from every repeat. P(candidate better)
is then Student's t on the difference of the two means, with the pooled degrees of freedom.

decide() is the rule issue 10 describes: clearly worse after one run -> discard; P(better) >= 0.95 -> keep;
otherwise another run, up to a cap, and a candidate still undecided at the cap is rejected. BENCHMARKS.md
will carry its measured false-keep and planted-gain rates before the loop uses it by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import fmean

from scipy import stats

P_KEEP = 0.95          # keep once P(candidate better than the champion) reaches this
DISCARD_MARGIN = 2.0   # after one run: worse than the champion's mean by this many noise sigmas -> discard
MAX_RUNS = 4           # runs of one candidate before an undecided one is rejected


@dataclass(frozen=True)
class Noise:
    sigma: float  # the pooled standard deviation of one run's val_bpb
    df: int       # its degrees of freedom: the repeats it rests on


def pooled_noise(samples: dict[str, list[float]]) -> Noise | None:
    """The run-to-run standard deviation pooled over every configuration with at least two runs."""
    ss, df = 0.0, 0
    for xs in samples.values():
        if len(xs) >= 2:
            m = fmean(xs)
            ss += sum((x - m) ** 2 for x in xs)
            df += len(xs) - 1
    return Noise(math.sqrt(ss / df), df) if df else None


def sem(xs: list[float], noise: Noise) -> float:
    """Standard error of a configuration's mean, with the pooled noise."""
    return noise.sigma / math.sqrt(len(xs))


def p_better(candidate: list[float], champion: list[float], noise: Noise) -> float:
    """P(the candidate's true mean val_bpb is below the champion's): Student's t with the pooled degrees of
    freedom on the difference of the means over its standard error."""
    se = noise.sigma * math.sqrt(1 / len(candidate) + 1 / len(champion))
    diff = fmean(champion) - fmean(candidate)
    if se == 0:
        return 1.0 if diff > 0 else 0.0 if diff < 0 else 0.5
    return float(stats.t.cdf(diff / se, noise.df))


def decide(candidate: list[float], champion: list[float], noise: Noise, max_runs: int = MAX_RUNS) -> str:
    """'keep', 'discard', or 'confirm' (run the candidate once more, with another seed)."""
    if len(candidate) == 1 and fmean(candidate) > fmean(champion) + DISCARD_MARGIN * noise.sigma:
        return "discard"
    if p_better(candidate, champion, noise) >= P_KEEP:
        return "keep"
    return "discard" if len(candidate) >= max_runs else "confirm"
