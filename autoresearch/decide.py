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
- a candidate runs once; worse than the champion's mean by more than DISCARD_MARGIN noise sigmas: discard,
  unless its first step took more than COLD_COMPILE_S seconds and COLD_COMPILE of its budget (a new shape's
  cold torch.compile: the same train.py compiles warm next time), which always earns it a second run;
- otherwise it runs again (status `confirm`), each time with a new seed, until P(better) >= P_KEEP (keep: it is
  the new champion and the branch holds it), P(better) < P_CONTINUE (discard: its mean is no better), or
  MAX_RUNS runs (discard: undecided).
P_KEEP is 0.98 rather than 0.95 because the rule looks up to three times, with a noise estimate that is still
thin: simulated, 0.95 keeps 7.8% of changes that do nothing, 0.98 keeps 3.6% (benchmarks/decide_sim.py).
The champion is the configuration of the last keep: the one with the best mean, never the luckiest single run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import fmean

from scipy.special import stdtr  # the t CDF; scipy.stats would add 0.4 s to every `autoresearch run`

BASELINE_RUNS = 3      # runs of the baseline: the first champion's mean and the first noise estimate
P_KEEP = 0.98          # keep once P(candidate better than the champion) reaches this (with at least 2 runs)
P_CONTINUE = 0.5       # after 2 or more runs, below this the candidate's mean is no better: discard
DISCARD_MARGIN = 0.5   # after one run: worse than the champion's mean by this many noise sigmas -> discard
MAX_RUNS = 4           # runs of one candidate before an undecided one is rejected
COLD_COMPILE = 0.05    # a first run whose first step took more than this fraction of the budget, and more than
COLD_COMPILE_S = 15.0  # these seconds, is not discarded alone: on 2 CPU cores a new shape's cold compile took
                       # 25-57 s, a warm one 5-7 s (BENCHMARKS.md, Speed)
RULES = ("stat", "naive")


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


def p_better(candidate: list[float], champion: list[float], noise: Noise) -> float:
    """P(the candidate's true mean val_bpb is below the champion's): Student's t with the pooled degrees of
    freedom on the difference of the means over its standard error."""
    se = noise.sigma * math.sqrt(1 / len(candidate) + 1 / len(champion))
    diff = fmean(champion) - fmean(candidate)
    if se == 0:
        return 1.0 if diff > 0 else 0.0 if diff < 0 else 0.5
    return float(stdtr(noise.df, diff / se))


def decide(candidate: list[float], champion: list[float], noise: Noise | None, max_runs: int = MAX_RUNS,
           cold: bool = False) -> Verdict:
    """The rule above, for a candidate's runs so far against the champion's; `cold`: its last run paid a cold
    compile (see COLD_COMPILE)."""
    n = len(candidate)
    if noise is None:  # neither has repeats yet: nothing to judge a difference by
        if n >= max_runs:
            return Verdict("discard", f"undecided after {n} runs (no noise estimate)", None)
        return Verdict("confirm", "no noise estimate yet", None)
    p = p_better(candidate, champion, noise)
    gap = (fmean(candidate) - fmean(champion)) / noise.sigma if noise.sigma else 0.0
    if n == 1:
        if gap > DISCARD_MARGIN and cold:
            return Verdict("confirm", f"{gap:.1f} sigma worse after one run, but it paid a cold compile", p)
        if gap > DISCARD_MARGIN:
            return Verdict("discard", f"{gap:.1f} sigma worse after one run", p)
        return Verdict("confirm", f"P {p:.3f} after one run", p)
    if p >= P_KEEP:
        return Verdict("keep", f"P {p:.3f} >= {P_KEEP} after {n} runs", p)
    if p < P_CONTINUE:
        return Verdict("discard", f"P {p:.3f} < {P_CONTINUE} after {n} runs", p)
    if n >= max_runs:
        return Verdict("discard", f"P {p:.3f}, undecided after {n} runs", p)
    return Verdict("confirm", f"P {p:.3f} after {n} runs", p)


# --- the state of a tag, from its ledger rows ---------------------------------------------------------------


def finished(rows) -> list:
    """Rows whose run produced a val_bpb (keep, discard or confirm)."""
    return [r for r in rows if r.status in ("keep", "discard", "confirm") and r.val_bpb > 0]


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


def series_of(rows, config: str, baseline_runs: int = BASELINE_RUNS) -> Series | None:
    """The series of one configuration, if it is unfinished: the baseline with fewer than baseline_runs runs,
    or a candidate whose last run said `confirm`. Interrupted runs (a killed harness or worker) and refused ones
    leave a series open; a crash of the configuration itself closes it."""
    decided = [r for r in rows if r.key == config and r.status != "refused"
               and not is_interruption(r)]
    if not decided:
        return None
    last = decided[-1]
    runs = len(samples(rows).get(config, []))
    if last.status == "confirm":
        return Series("candidate", last.commit, config, base_description(last.description), runs)
    if last.status == "keep" and last.decision.startswith("baseline") and runs < baseline_runs:
        return Series("baseline", last.commit, config, base_description(last.description), runs)
    return None


def unfinished(rows, baseline_runs: int = BASELINE_RUNS) -> list[Series]:
    """Every unfinished series, the one whose last run is oldest first. One harness leaves at most one open;
    parallel workers (driver.py) may leave several."""
    last_index = {}
    for i, r in enumerate(rows):
        if r.status != "refused" and not is_interruption(r):
            last_index[r.key] = i
    found = [series_of(rows, key, baseline_runs) for key in sorted(last_index, key=last_index.get)]
    return [s for s in found if s is not None]


def latest_unfinished(rows, baseline_runs: int = BASELINE_RUNS) -> Series | None:
    """The most recent unfinished series, if any (see series_of)."""
    found = unfinished(rows, baseline_runs)
    return found[-1] if found else None


REPEAT_MARK = " [run "


def base_description(description: str) -> str:
    return description.split(REPEAT_MARK)[0]


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
