"""A candidate held against the tag's base (the train.py the tag was set up on: the user's, so trusted; no agent
wrote it), two ways: its later runs paired with controls, and its first run stopped early when hopeless.

**Control pairs** (issue 33: decisions on a drifting machine). A surviving candidate's later runs are each made right beside a control: a run of the tag's base train.py, the baseline's (no agent wrote it), on the
same seed. A machine's drift over minutes is then in both runs of a pair, and the candidate's effect over the
base is the mean of its differences d_k = run_k - control_k. decide.py compares means of runs made at any time;
the pairs only ever compare time-adjacent differences (study.control_due asks for the controls, record.py
decides with in_time). docs/decisions.md has the rule and BENCHMARKS.md its error rates.

**Early pruning.** A candidate whose training loss, past a fraction of its budget, is worse than the tag's base runs (the baseline: the train.py the tag was set up with) at the same point by more than their noise
allows is stopped and recorded as `pruned` (a discard that cost less).

Why the base, not the champion: a step line is train.py's own word, and a kept train.py is the agent's code. A
champion that printed its loss a nat low got every later candidate pruned at half its budget (3 of 3 honest
candidates; issue 50), and one that printed identical losses on its repeats shrank the noise, and with it the
margin, for everyone. A candidate's own lines can only spare or prune itself; the base's were written by the code
the user set the tag up with. A candidate worse than the base is worse than every champion (each beat the base),
so nothing prunable is lost but the candidates between the base and the champion, which the decision rule
discards after one run.

The comparison is at equal *budget time* (the step line's `elapsed`, on the budget's clock), never at equal
steps: a faster train.py that is behind per step but ahead per second is what a fixed budget rewards. The
base's curve at a moment is the mean of its runs' losses there (each run's loss linearly interpolated
between its step lines). The margin is calibrated on the same runs: the standard deviation of the loss at that
moment between the base's runs; a run is pruned when

    loss - base_mean(t) > Z * k(df) * sd(t) * sqrt(1 + 1/n)  and  > MIN_GAP,
    at FROM_FRACTION <= t / budget <= UNTIL_FRACTION,

with n the base's runs and k(df) = t_df(0.95) / z(0.95), Student's t's width for a noise estimated from few
repeats (1.8 at the baseline's df = 2, 1.3 at df = 4, towards 1). Until the tag has MIN_DF degrees of freedom
nothing is pruned, nor on a run's first MIN_STEP steps (its initialisation, not its learning). Only a candidate's
first run is: a candidate the rule
sent to confirmation is promising, and a run near its budget's end has nothing left to save.
Z and FROM_FRACTION were chosen on no-op changes (repeats of one configuration, which must never be pruned;
benchmarks/repeats.py, BENCHMARKS.md). Never the baseline or the champion's repeats.
A candidate that prints a loss lower than its own only escapes pruning (its val_bpb is still the harness's), and
one that prints a higher one only prunes itself.
"""

from __future__ import annotations

import math
import os
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from autoresearch import decide, descriptions, machine
from autoresearch.errors import HarnessError


# --- control pairs ---------------------------------------------------------------------------------------------

# A pair of `autoresearch run`s whose others' load differs by more than this share of the load guard's default
# limit (half a core on 2 cores, a tenth of the machine) ends its candidate's series. On the wall clock a process
# beside a run takes its steps, so load beside a control alone makes the candidate look better. An agent started
# with `autoresearch agent` cannot do that (it is paused while anything trains: pause.py); this catches an agent
# run without it, the gross cases only: a red team found that a hog under the margin still tilts pairs
# (BENCHMARKS.md, Decisions on a drifting machine). Not read in the parallel loop, where a sibling worker's
# training is others' load.
LOAD_APART_SHARE = 0.5


def base_row(rows):
    """The first row of the tag's baseline (the train.py the tag was set up on, trusted: no agent wrote it), or
    None before it ran."""
    return next((r for r in rows if r.status == "keep" and r.decision.startswith("baseline")), None)


def controlled_seeds(rows, candidate: str, base: str) -> set[int]:
    """The seeds on which the base has a finished control beside `candidate`."""
    return {r.seed for r in rows if r.status == "control" and r.val_bpb > 0 and r.key == base
            and descriptions.control_of(r.description) == candidate}


def tilted(rows, candidate: str, base: str, current: tuple[int, float | None] | None = None,
           apart: float | None = None) -> str | None:
    """Why the candidate's pairs are no evidence, or None: a pair on the wall clock whose control and candidate's
    run had others' load (the ledger's `load`, cores) more than `apart` cores apart. Either way it ends the series:
    load beside the control makes a no-op look better, and load beside the candidate's own run would handicap it,
    to be won back later by a copy of it run without the load. Ending it (never redrawing the pair) leaves an
    agent nothing to gain by loading the machine, whatever it knows of the runs so far. current: the candidate's
    run not yet in rows, (seed, load)."""
    if apart is None:  # the default limit, not AUTORESEARCH_LOAD_LIMIT: raising that must not switch this off
        apart = max(machine.LOAD_MIN, machine.LOAD_SHARE * (os.cpu_count() or 1)) * LOAD_APART_SHARE
    loads = {r.seed: r.load for r in decide.finished(rows) if r.key == candidate and not r.worker}
    if current is not None:
        loads.setdefault(*current)
    for r in rows:
        if (r.status != "control" or r.key != base or descriptions.control_of(r.description) != candidate
                or r.clock == "cpu" or r.worker or r.load is None or loads.get(r.seed) is None):
            continue
        if abs(r.load - loads[r.seed]) > apart:
            return (f"load-tilted pair on seed {r.seed}: others kept {r.load:.2f} cores busy beside the control and "
                    f"{loads[r.seed]:.2f} beside the candidate's run, more than {apart:g} apart; the series ends "
                    "(a pair that others' load can tilt is no evidence)")
    return None


def control_diffs(rows, base: str, extra: tuple[str, int, float] | None = None) -> dict[str, list[float]]:
    """configuration -> its d's against the base's controls: each finished run of it minus the control run of the
    base configuration `base` made beside it on the same seed, in the order the controls ran. extra: a run not
    yet in rows, (configuration, seed, val_bpb)."""
    runs: dict[tuple[str, int], float] = {}
    for c, s, v in decide.seeded(rows) + ([extra] if extra else []):
        runs.setdefault((c, s), v)
    out: dict[str, list[float]] = {}
    for r in rows:
        of = descriptions.control_of(r.description)
        if r.status == "control" and r.val_bpb > 0 and r.key == base and (of, r.seed) in runs:
            out.setdefault(of, []).append(runs[(of, r.seed)] - r.val_bpb)
    return out


def in_time(diffs: dict[str, list[float]], candidate: str, runs_noise: decide.Noise, champion: str | None = None
            ) -> decide.Comparison | None:
    """The candidate against the champion from time-adjacent pairs only (the control rule): diffs maps each
    configuration to its d_k = run_k - control_k, the control being the tag's base train.py run right before or
    after it on the same seed, so that a machine's drift over minutes is in both. The candidate's effect over the
    base is the mean of its d's; the champion's likewise (champion None: the champion is the base, effect 0,
    known exactly), so their difference is free of drift whenever each was measured. The d's noise is pooled over
    every configuration with two or more (their deviations from their own mean); the candidate's own d's, once
    two, bound it from below (as compare() does); with no pool yet, two runs' noise (sqrt(2) sigma). sigma (the
    unit of DISCARD_MARGIN) stays one run's pooled noise. None when the candidate, or a champion other than the
    base, has no pair."""
    mine = diffs.get(candidate, [])
    theirs = diffs.get(champion, []) if champion is not None else []
    if not mine or (champion is not None and not theirs):
        return None
    pooled = decide.pooled_noise(diffs)  # the d's deviations from their own configuration's mean, as runs' are
    var, df = (pooled.sigma ** 2, pooled.df) if pooled else (2 * runs_noise.sigma ** 2, runs_noise.df)
    if len(mine) >= 2 and statistics.variance(mine) > var:
        var, df = statistics.variance(mine), len(mine) - 1
    se = math.sqrt(var * (1 / len(mine) + (1 / len(theirs) if theirs else 0.0)))
    return decide.Comparison((fmean(theirs) if theirs else 0.0) - fmean(mine), se, df, runs_noise.sigma, True, beside=True)


# --- early pruning ---------------------------------------------------------------------------------------------

FROM_FRACTION = 0.5   # no verdict in the first half: warm-up, compilation and schedule shapes differ there
UNTIL_FRACTION = 0.9  # nor in the last tenth: little is left to save, a result is near (a compressed night
                      # pruned one at 20 s of 20, saving nothing)
Z = 5.0               # margin in noise sigmas: no-op repeats reached at most 3.25 over a run's ~20 looks
                      # (benchmarks/repeats.py, 12 runs at 30 s, BENCHMARKS.md); a hopeless run is dozens away
MIN_GAP = 0.02        # nats: below this, never worth a verdict
MIN_DF = 2            # degrees of freedom of the pooled noise before any run is pruned
MIN_STEP = 10         # no verdict on a run's first steps: they measure its initialisation and the first updates'
                      # overshoot, not learning. An A/A change that redrew the initial weights was pruned at step 2
                      # of a 10 s budget (compilation took the first half): 8.362 against the champion's 8.318
                      # there, whose three runs were all still at their (equal) initial loss


def enabled() -> bool:
    """AUTORESEARCH_PRUNE: on (the default) or off (every run trains its whole budget)."""
    mode = os.environ.get("AUTORESEARCH_PRUNE", "").strip() or "on"
    if mode not in ("on", "off"):
        raise HarnessError(f"AUTORESEARCH_PRUNE={mode!r}: use on (the default: hopeless candidates stop early) or off.")
    return mode == "on"


def curve(log_text: str, step_re) -> list[tuple[float, float]]:
    """(elapsed, loss) of every finite step line in a training's log, in order."""
    out = []
    for m in step_re.finditer(log_text):
        try:
            loss = float(m["loss"])
        except ValueError:
            continue
        if math.isfinite(loss):
            out.append((float(m["elapsed"]), loss))
    return out


def at(points: list[tuple[float, float]], t: float) -> float | None:
    """A curve's loss at elapsed t, linearly interpolated; None outside the curve."""
    for (t0, l0), (t1, l1) in zip(points, points[1:]):
        if t0 <= t <= t1:
            return l0 if t1 == t0 else l0 + (l1 - l0) * (t - t0) / (t1 - t0)
    return points[-1][1] if points and points[-1][0] == t else None


@dataclass
class Reference:
    """What a candidate is compared with: the curves of the tag's base runs, from their logs."""
    budget: float
    base: list[list[tuple[float, float]]]   # one curve per run of the tag's base

    def noise(self, t: float) -> tuple[float, int] | None:
        """Standard deviation of the loss at t between the base's runs, and its degrees of freedom."""
        values = [v for v in (at(c, t) for c in self.base) if v is not None]
        if len(values) < 2:
            return None
        mean = sum(values) / len(values)
        return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)), len(values) - 1

    def check(self, elapsed: float | None, line: str | None) -> str | None:
        """verdict() for the newest step line of a run in flight (supervise.run_training's prune), from its
        MIN_STEP-th step on."""
        m = re.search(r"\bstep=\s*(\d+)\b.*\bloss=(\S+)", line or "")
        try:
            return self.verdict(elapsed, float(m.group(2))) if m and int(m.group(1)) >= MIN_STEP else None
        except ValueError:
            return None

    def verdict(self, elapsed: float | None, loss: float | None) -> str | None:
        """Why a candidate at (elapsed, loss) should stop now, or None."""
        if elapsed is None or loss is None or not math.isfinite(loss) or not (
                FROM_FRACTION * self.budget <= elapsed <= UNTIL_FRACTION * self.budget):
            return None
        base = [v for v in (at(c, elapsed) for c in self.base) if v is not None]
        noise = self.noise(elapsed)
        if not base or noise is None or noise[1] < MIN_DF:
            return None
        mean = sum(base) / len(base)
        margin = max(Z * small_sample(noise[1]) * noise[0] * math.sqrt(1 + 1 / len(base)), MIN_GAP)
        if loss - mean > margin:
            return (f"pruned at {elapsed:.0f} s of {self.budget:g}: training loss {loss:.4f} against the tag's base's "
                    f"{mean:.4f} there (n={len(base)}), worse by more than {margin:.4f} "
                    f"({Z * small_sample(noise[1]):.1f} sigma of {noise[0]:.4f}, df={noise[1]})")
        return None


def small_sample(df: int) -> float:
    """How much wider Student's t is than the normal at its 95th percentile, with df degrees of freedom."""
    from scipy.special import stdtrit
    return float(stdtrit(df, 0.95)) / 1.6448536269514722


def reference(rows, budget: float, log_of, step_re, base_config: str) -> Reference | None:
    """The Reference of a tag from its ledger rows: the curves of its base's runs (configuration base_config, the
    tag's starting train.py), never a candidate's or a champion's; log_of(row) -> the text of its run's log (or
    None). None before there is a champion (the baseline unfinished)."""
    from autoresearch import decide
    if decide.champion(rows) is None:
        return None
    curves = []
    for r in decide.finished(rows):
        text = log_of(r) if r.key == base_config else None
        points = curve(text, step_re) if text else []
        if points:
            curves.append(points)
    return Reference(budget, curves)


def log_reader(runs_dir: Path, log_name: str):
    """log_of for reference(): a run's log from its directory under runs_dir, its head only (the step lines of
    a train.py that prints more than a megabyte are not worth reading for this)."""
    def read(row) -> str | None:
        try:
            with open(runs_dir / row.run_id / log_name, "rb") as f:
                return f.read(1 << 20).decode(errors="replace")
        except OSError:
            return None
    return read
