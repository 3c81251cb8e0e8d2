"""Keep or discard, knowing how noisy one run is: configurations compared by their means over repeated runs.

A configuration is one train.py (its git blob, the ledger's `config`): every run of it, each with its own seed,
is one sample of its val_bpb. The noise is estimated for the tag, pooled over every configuration that ran more
than once: with one to four runs per configuration a per-configuration variance (Welch's test) or a bootstrap
(which cannot resample one run at all) is itself too noisy to decide on, while the pooled estimate gains a
degree of freedom from every repeat and stays valid as long as the noise is a property of the machine and the
budget rather than of the configuration. P(candidate better) is Student's t on the difference of the two means
over its standard error, with the pooled degrees of freedom, so a young tag's thin estimate is paid for with
heavier tails.

The rule (run.py applies it after every run; the numbers behind its constants are in BENCHMARKS.md):
- the baseline runs BASELINE_RUNS times: the first champion and the first noise estimate;
- a candidate runs once; worse than the champion's mean by more than DISCARD_MARGIN noise sigmas: discard
  (every run starts from its own configuration's compile cache, compiled.py, so no first run pays a compile its
  later runs do not: a rule that gave a run reporting a slow first step a second chance read train.py's word);
- otherwise it runs again (status `confirm`), each time with a new seed, until P(better) >= P_KEEP (keep: it is
  the new champion and the branch holds it), P(better) < P_CONTINUE (discard: its mean is no better), or
  MAX_RUNS runs (discard: undecided).
P_KEEP is 0.98 rather than 0.95 because the rule looks up to three times, with a noise estimate that is still
thin: simulated, 0.95 keeps 7.8% of changes that do nothing, 0.98 keeps 3.6% (benchmarks/decide_sim.py).
The champion is the configuration of the last keep: the one with the best mean, never the luckiest single run.

Paired seeds (study.seed): every configuration's k-th run uses the same seed, 42 + k - 1, so a candidate's
runs meet the champion's on the same seeds, and what a seed does to any configuration (its initialisation, its
batches) cancels in the difference as far as it is shared. compare() measures how far that is, from the tag: a
two-way fit (configuration + seed) over every finished run leaves the noise no seed explains (residual sigma);
the pooled noise minus it is the variance of the seed effects. With those, the difference of the two means is
estimated by generalised least squares on the two configurations' runs, and its standard error is smaller the
more of the noise the seeds carry. A change that redraws the random numbers (new shapes, another initialisation)
shares less of a seed's effect than the tag's configurations do among themselves (measured: 0.24 against 0.49,
BENCHMARKS.md): so once the pair has two common seeds, their own differences bound the seed-free noise from
below, with their degrees of freedom. Until the fit has MIN_PAIRED_DF degrees of freedom, or when the seeds
explain nothing, the comparison is the unpaired one above. BENCHMARKS.md has the simulated error rates.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from statistics import fmean

import numpy as np

from autoresearch import descriptions

BASELINE_RUNS = 3      # runs of the baseline: the first champion's mean and the first noise estimate
P_KEEP = 0.98          # keep once P(candidate better than the champion) reaches this (with at least 2 runs)
P_CONTINUE = 0.5       # after 2 or more runs, below this the candidate's mean is no better: discard
DISCARD_MARGIN = 0.5   # after one run: worse than the champion's mean by this many noise sigmas -> discard
MAX_RUNS = 4           # runs of one candidate before an undecided one is rejected
MIN_PAIRED_DF = 3      # residual degrees of freedom of the configuration + seed fit before runs are paired
RULES = ("stat", "control", "naive")
REFUSED_CLOSES = "refused after it trained"  # the decision of a run train.py got refused: its series ends
REPEATING = ("stat", "control")  # the rules that repeat a configuration over paired seeds (naive runs it once)


@dataclass(frozen=True)
class Noise:
    sigma: float  # the pooled standard deviation of one run's val_bpb
    df: int       # its degrees of freedom: the repeats it rests on


@dataclass(frozen=True)
class Verdict:
    status: str          # keep, discard or confirm
    reason: str          # for the ledger's decision column
    p: float | None      # P(candidate better than the champion), when it could be computed


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


@dataclass(frozen=True)
class Comparison:
    """A candidate against the champion: the difference of their true means and what it is known to."""
    diff: float      # champion's mean minus the candidate's (positive: the candidate is better)
    se: float        # its standard error
    df: int          # the degrees of freedom of the noise estimate behind se
    sigma: float     # one run's noise (the pooled sigma), the unit of DISCARD_MARGIN
    paired: bool     # whether shared seed effects were taken out (compare)
    beside: bool = False  # whether it rests on time-adjacent pairs with controls only (baseline.in_time)

    @property
    def p(self) -> float:
        """P(the candidate's true mean is below the champion's): Student's t on diff / se."""
        if self.se == 0:
            return 1.0 if self.diff > 0 else 0.0 if self.diff < 0 else 0.5
        # imported here, not at the top: scipy.special (0.25 s) is then paid only by a command that compares a
        # candidate, not by every `autoresearch` command (status, setup, a refused run); scipy.stats would add 0.4 s
        from scipy.special import stdtr  # the t CDF
        return float(stdtr(self.df, self.diff / self.se))


def unpaired(candidate: list[float], champion: list[float], noise: Noise) -> Comparison:
    """The two means as independent samples, with the pooled noise."""
    se = noise.sigma * math.sqrt(1 / len(candidate) + 1 / len(champion))
    return Comparison(fmean(champion) - fmean(candidate), se, noise.df, noise.sigma, False)


def p_better(candidate: list[float], champion: list[float], noise: Noise) -> float:
    """P(the candidate's true mean val_bpb is below the champion's), the runs taken as independent."""
    return unpaired(candidate, champion, noise).p


def seed_free_noise(runs: list[tuple[str, int, float]]) -> Noise | None:
    """The noise left once every configuration's mean and every seed's shared effect are fitted (least squares
    on configuration + seed), from (configuration, seed, val_bpb) of every finished run; None without a degree
    of freedom left."""
    configs = sorted({c for c, _, _ in runs})
    seeds = sorted({s for _, s, _ in runs})
    x = np.zeros((len(runs), len(configs) + len(seeds)))
    for i, (c, s, _) in enumerate(runs):
        x[i, configs.index(c)] = x[i, len(configs) + seeds.index(s)] = 1.0
    y = np.array([v for _, _, v in runs])
    df = len(runs) - int(np.linalg.matrix_rank(x)) if runs else 0
    if df <= 0:
        return None
    fit, *_ = np.linalg.lstsq(x, y, rcond=None)
    return Noise(math.sqrt(float(np.sum((y - x @ fit) ** 2)) / df), df)


def compare(runs: list[tuple[str, int, float]], candidate: str, champion: str,
            residual: Noise | None = None) -> Comparison | None:
    """The candidate's configuration against the champion's, from (configuration, seed, val_bpb) of every
    finished run of the tag: paired on seeds when the tag shows shared seed effects (see the top), else
    unpaired; None without a noise estimate. residual: seed_free_noise(runs), for a caller comparing many pairs
    on the same runs."""
    if candidate == champion:
        raise ValueError("compare: the candidate is the champion's configuration (a repeat of the champion)")
    values: dict[str, list[float]] = {}
    for c, _, v in runs:
        values.setdefault(c, []).append(v)
    noise = pooled_noise(values)
    if noise is None:
        return None
    plain = unpaired(values[candidate], values[champion], noise)
    residual = residual or seed_free_noise(runs)
    if residual is None or residual.df < MIN_PAIRED_DF or residual.sigma == 0:
        return plain
    own, df = residual.sigma ** 2, residual.df
    # A change that redraws the seed's random numbers (new shapes, another initialisation) shares less of a
    # seed's effect with the champion than the tag's configurations do among themselves: the pair's own
    # differences on their common seeds, once there are two, bound the noise the pairing leaves from below
    mine_by_seed, champ_by_seed = _by_seed(runs, candidate), _by_seed(runs, champion)
    common = mine_by_seed.keys() & champ_by_seed.keys()
    if len(common) >= 2:
        diffs = [mine_by_seed[s] - champ_by_seed[s] for s in common]
        if statistics.variance(diffs) / 2 > own:
            own, df = statistics.variance(diffs) / 2, len(common) - 1
    shared = noise.sigma ** 2 - own  # the variance of a seed's effect on both configurations
    if shared <= 0:
        return plain
    # Generalised least squares of the two means: runs on one seed covary by `shared`
    mine = [(c, s, v) for c, s, v in runs if c in (candidate, champion)]
    x = np.array([[c == candidate, c == champion] for c, _, _ in mine], dtype=float)
    y = np.array([v for _, _, v in mine])
    seeds = np.array([s for _, s, _ in mine])
    cov = own * np.eye(len(mine)) + shared * (seeds[:, None] == seeds[None, :])
    inv = np.linalg.inv(cov)
    var = np.linalg.inv(x.T @ inv @ x)
    means = var @ x.T @ inv @ y
    se = math.sqrt(max(float(var[0, 0] + var[1, 1] - 2 * var[0, 1]), 0.0))
    return Comparison(float(means[1] - means[0]), se, df, noise.sigma, True)


def _by_seed(runs, config: str) -> dict[int, float]:
    """seed -> the configuration's mean val_bpb on it."""
    out: dict[int, list[float]] = {}
    for c, s, v in runs:
        if c == config:
            out.setdefault(s, []).append(v)
    return {s: fmean(vs) for s, vs in out.items()}


def decide(candidate: list[float], champion: list[float], noise: Noise | None, max_runs: int = MAX_RUNS) -> Verdict:
    """The rule above for a candidate's runs against the champion's, taken as independent samples."""
    return rule(len(candidate), unpaired(candidate, champion, noise) if noise else None, max_runs)


def rule(n: int, comparison: Comparison | None, max_runs: int = MAX_RUNS) -> Verdict:
    """The rule above, after the candidate's n-th run."""
    if comparison is None:  # neither has repeats yet: nothing to judge a difference by
        if n >= max_runs:
            return Verdict("discard", f"undecided after {n} runs (no noise estimate)", None)
        return Verdict("confirm", "no noise estimate yet", None)
    p = comparison.p
    how = " (beside controls)" if comparison.beside else " (paired)" if comparison.paired else ""
    gap = -comparison.diff / comparison.sigma if comparison.sigma else 0.0
    if n == 1:
        if gap > DISCARD_MARGIN:
            return Verdict("discard", f"{gap:.1f} sigma worse after one run{how}", p)
        return Verdict("confirm", f"P {p:.3f} after one run{how}", p)
    if p >= P_KEEP:
        return Verdict("keep", f"P {p:.3f} >= {P_KEEP} after {n} runs{how}", p)
    if p < P_CONTINUE:
        return Verdict("discard", f"P {p:.3f} < {P_CONTINUE} after {n} runs{how}", p)
    if n >= max_runs:
        return Verdict("discard", f"P {p:.3f}, undecided after {n} runs{how}", p)
    return Verdict("confirm", f"P {p:.3f} after {n} runs{how}", p)


# --- the state of a tag, from its ledger rows ---------------------------------------------------------------


def finished(rows) -> list:
    """Rows whose run produced a val_bpb (keep, discard or confirm)."""
    return [r for r in rows if r.status in ("keep", "discard", "confirm") and r.val_bpb > 0]


def seeded(rows) -> list[tuple[str, int, float]]:
    """(configuration, seed, val_bpb) of every finished run, in order: what compare() pairs on."""
    return [(r.key, r.seed, r.val_bpb) for r in finished(rows)]


def samples(rows) -> dict[str, list[float]]:
    """configuration -> its val_bpb values, in order."""
    out: dict[str, list[float]] = {}
    for r in finished(rows):
        out.setdefault(r.key, []).append(r.val_bpb)
    return out


def is_interruption(row) -> bool:
    return row.status == "crash" and row.decision == "interrupted"


def champion(rows):
    """The last kept row (its configuration is the champion), or None before the baseline."""
    kept = [r for r in rows if r.status == "keep"]
    return kept[-1] if kept else None


@dataclass(frozen=True)
class Series:
    kind: str          # baseline or candidate
    commit: str
    config: str
    description: str
    runs: int          # finished runs so far


def series_key(row) -> str:
    """The configuration whose series a row belongs to: for a control run (the champion beside a candidate,
    the control rule) its candidate's, else its own."""
    return descriptions.control_of(row.description) or row.key


def series_of(rows, config: str, baseline_runs: int = BASELINE_RUNS) -> Series | None:
    """The series of one configuration, if it is unfinished: the baseline with fewer than baseline_runs runs,
    or a candidate whose last run said `confirm` (its controls after it keep it open). Interrupted runs (a
    killed harness or worker) and runs refused before they trained leave a series open; a crash of the
    configuration itself, or of a control beside it, closes it, and so does a candidate's run or a control refused
    after it trained (REFUSED_CLOSES: a rule was broken, and a redraw on demand is no sample)."""
    decided = [r for r in rows if series_key(r) == config and (r.status != "refused" or r.decision == REFUSED_CLOSES)
               and not is_interruption(r)]
    if not decided:
        return None
    last = decided[-1]
    if last.status == "control":
        last = [r for r in decided if r.key == config][-1]
    runs = len(samples(rows).get(config, []))
    if last.status == "confirm":
        return Series("candidate", last.commit, config, descriptions.base_description(last.description), runs)
    if last.status == "keep" and last.decision.startswith("baseline") and runs < baseline_runs:
        return Series("baseline", last.commit, config, descriptions.base_description(last.description), runs)
    return None


def unfinished(rows, baseline_runs: int = BASELINE_RUNS) -> list[Series]:
    """Every unfinished series, the one whose last run is oldest first. One harness leaves at most one open;
    parallel workers (driver.py) may leave several."""
    last_index = {}
    for i, r in enumerate(rows):
        if r.status != "refused" and not is_interruption(r):
            last_index[series_key(r)] = i
    found = [series_of(rows, key, baseline_runs) for key in sorted(last_index, key=last_index.get)]
    return [s for s in found if s is not None]


def latest_unfinished(rows, baseline_runs: int = BASELINE_RUNS) -> Series | None:
    """The most recent unfinished series, if any (see series_of)."""
    found = unfinished(rows, baseline_runs)
    return found[-1] if found else None


# --- flags: what a reader should look at, never a decision ----------------------------------------------------
GAP_SIGMAS = 3.0   # a kept model's test_bpb - val_bpb beyond the baseline's by more than this many noise sigmas,
GAP_MIN = 0.02     # and more than this, says it fits the validation split better than text it never saw


def test_gap_flag(rows, val_bpb: float, test_bpb: float | None, noise: Noise | None) -> str:
    """A flag when a model's test_bpb is worse than its val_bpb by more than the baseline's gap plus the noise
    allows: the sign of a model tuned to, or trained on, the validation text (docs/integrity.md)."""
    base = [r.test_bpb - r.val_bpb for r in rows
            if r.decision.startswith(("baseline", "naive: first run")) and r.test_bpb is not None and r.val_bpb > 0]
    if test_bpb is None or not base:  # no baseline gap to compare with (this is the baseline)
        return ""
    gap_base = fmean(base)
    excess = (test_bpb - val_bpb) - gap_base
    bound = max(GAP_SIGMAS * (noise.sigma if noise else 0.0), GAP_MIN)
    if excess > bound:
        return (f"test-gap: test_bpb {test_bpb:.4f} is {test_bpb - val_bpb:+.4f} from val_bpb, the baseline's gap "
                f"is {gap_base:+.4f} (allowed {bound:.4f} more)")
    return ""


def identical_flag(rows, config: str, val_bpb: float, seed: int) -> str:
    """A flag when a repeat of a configuration with another seed scores exactly what an earlier run of it did (to
    the ledger's 6 decimals): independent seeds never do that, a train.py that ignores its seed does."""
    same = [r.run_id for r in rows if r.config == config and r.seed != seed and r.val_bpb > 0
            and f"{r.val_bpb:.6f}" == f"{val_bpb:.6f}"]
    return f"identical: val_bpb equals run {same[0]}'s to 6 decimals (a seed ignored?)" if same else ""
