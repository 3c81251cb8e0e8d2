"""The control rule's pairs (issue 33: decisions on a drifting machine). A surviving candidate's later runs are
each made right beside a control: a run of the tag's base train.py, the baseline's (no agent wrote it), on the
same seed. A machine's drift over minutes is then in both runs of a pair, and the candidate's effect over the
base is the mean of its differences d_k = run_k - control_k. decide.py compares means of runs made at any time;
this module only ever compares time-adjacent differences (study.control_due asks for the controls, record.py
decides with in_time). docs/decisions.md has the rule and BENCHMARKS.md its error rates."""

from __future__ import annotations

import math
import os
import statistics
from statistics import fmean

from autoresearch import decide, descriptions, machine

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
