"""The noise-aware comparison on synthetic samples, against values computed by hand."""

import math

import pytest

from autoresearch import decide as decide_module
from autoresearch.decide import Noise, decide, p_better, pooled_noise, rule, sem


def test_pooled_noise_by_hand():
    # config a: 1.0, 1.2 (mean 1.1, squares 0.02); b: 2.0, 2.1, 2.2 (mean 2.1, squares 0.02); c: one run only
    noise = pooled_noise({"a": [1.0, 1.2], "b": [2.0, 2.1, 2.2], "c": [5.0]})
    assert noise.df == 3 and noise.sigma == pytest.approx(math.sqrt(0.04 / 3))
    assert pooled_noise({"a": [1.0], "b": [2.0]}) is None  # no repeats: no estimate
    assert sem([1.0, 1.2, 1.4, 1.6], Noise(0.2, 10)) == pytest.approx(0.1)


def test_p_better_by_hand():
    # sigma 0.01, one candidate run against a champion of three: se = 0.01 * sqrt(1 + 1/3) = 0.011547,
    # t = 0.02 / 0.011547 = 1.7321; with very many degrees of freedom t is normal: Phi(1.7321) = 0.95837
    noise = Noise(0.01, 10**6)
    assert p_better([1.00], [1.02, 1.02, 1.02], noise) == pytest.approx(0.95837, abs=1e-4)
    # with 4 degrees of freedom the tails are heavier: P(T_4 <= 1.7321) = 0.92088 (t table)
    assert p_better([1.00], [1.02, 1.02, 1.02], Noise(0.01, 4)) == pytest.approx(0.92088, abs=1e-4)
    assert p_better([1.0], [1.0], noise) == pytest.approx(0.5)
    assert p_better([1.0], [1.0], Noise(0.0, 3)) == 0.5 and p_better([0.9], [1.0], Noise(0.0, 3)) == 1.0


def test_a_clear_win_is_confirmed_once_then_kept():
    champion, noise = [1.65, 1.66, 1.64], Noise(0.005, 8)
    first = decide([1.60], champion, noise)
    assert first.status == "confirm"  # never kept on one run, however lucky
    second = decide([1.60, 1.605], champion, noise)
    assert second.status == "keep" and second.p > 0.999


def test_a_clear_loss_is_discarded_after_one_run():
    verdict = decide([1.70], [1.65, 1.66, 1.64], Noise(0.005, 8))
    assert verdict.status == "discard" and "sigma worse after one run" in verdict.reason


def test_a_slight_loss_within_the_margin_gets_a_second_run_and_is_then_discarded():
    champion, noise = [1.650, 1.650, 1.650], Noise(0.01, 8)
    assert decide([1.654], champion, noise).status == "confirm"  # 0.4 sigma worse: inside DISCARD_MARGIN 0.5
    verdict = decide([1.654, 1.652], champion, noise)
    assert verdict.status == "discard" and verdict.p < 0.5


def test_a_tie_gets_confirmation_runs_and_is_rejected_at_the_cap():
    champion, noise = [1.650, 1.652, 1.648], Noise(0.01, 8)
    runs = [1.649]
    while (verdict := decide(runs, champion, noise, max_runs=4)).status == "confirm":
        runs.append([1.6495, 1.6492, 1.6494][len(runs) - 1])  # a hair better each time, never sure
    assert verdict.status == "discard" and len(runs) == 4 and "undecided after 4 runs" in verdict.reason
    assert 0.5 <= verdict.p < 0.98


def test_a_small_real_gain_is_kept_once_the_repeats_make_it_sure():
    # 0.010 better with sigma 0.006: two runs give t = 0.010 / (0.006 sqrt(1/2 + 1/3)) = 1.826, P = 0.954
    # (12 degrees of freedom): not sure yet; four give t = 0.010 / 0.00458 = 2.182, P = 0.9751... still below
    # 0.98; at sigma 0.005 four runs give t = 2.619, P = 0.9888: kept
    champion = [1.650, 1.652, 1.648]
    assert decide([1.640, 1.640], champion, Noise(0.006, 12)).p == pytest.approx(0.9537, abs=1e-3)
    assert decide([1.640, 1.640], champion, Noise(0.006, 12)).status == "confirm"
    assert decide([1.640] * 4, champion, Noise(0.006, 12)).status == "discard"
    kept = decide([1.640] * 4, champion, Noise(0.005, 12))
    assert kept.status == "keep" and kept.p == pytest.approx(0.9888, abs=1e-3)


def test_no_noise_estimate_means_another_run():
    assert decide([1.0], [1.1], None).status == "confirm"
    assert decide([1.0] * 4, [1.1], None).status == "discard"


# --- paired seeds: shared seed effects taken out of the comparison ------------------------------------------

SEED = {42: 0.030, 43: -0.020, 44: 0.010, 45: -0.015}  # what each seed does to every configuration


def _runs(config, mean, seeds, own=()):
    """(configuration, seed, val_bpb): the configuration's mean plus the seed's shared effect plus its own bit."""
    own = list(own) or [0.0] * len(seeds)
    return [(config, s, mean + SEED[s] + e) for s, e in zip(seeds, own)]


def test_the_noise_no_seed_explains_by_hand():
    # a 2 x 2 table: the two-way fit leaves +-I/4 in each cell, I = y11 - y12 - y21 + y22, so sigma = |I| / 2
    runs = [("a", 42, 1.00), ("a", 43, 1.10), ("b", 42, 2.00), ("b", 43, 2.14)]
    residual = decide_module.seed_free_noise(runs)
    assert residual.df == 1 and residual.sigma == pytest.approx(0.04 / 2)
    assert decide_module.seed_free_noise([("a", 42, 1.0), ("a", 43, 1.1)]) is None  # every run fitted exactly
    assert decide_module.seed_free_noise([]) is None


def test_on_the_same_seeds_the_difference_is_the_difference_of_means_with_only_the_seed_free_noise():
    """A complete block (both configurations on seeds 42-44): the seed effects cancel exactly, so the standard
    error is the residual sigma times sqrt(2/3), however large the seed effects are."""
    own = iter([0.002, -0.001, -0.001, 0.001, 0.0, -0.002, 0.003, -0.002, -0.001, -0.002, 0.001, 0.0, 0.002, -0.002])
    runs = (_runs("champ", 2.0, [42, 43, 44], [next(own) for _ in range(3)])
            + _runs("cand", 1.99, [42, 43, 44], [next(own) for _ in range(3)])
            + _runs("x", 2.1, [42, 43, 44, 45], [next(own) for _ in range(4)])
            + _runs("y", 2.2, [42, 43, 44, 45], [next(own) for _ in range(4)]))
    c = decide_module.compare(runs, "cand", "champ")
    residual = decide_module.seed_free_noise(runs)
    assert c.paired and c.df == residual.df == 14 - (4 + 4 - 1)
    mean = lambda cfg: sum(v for k, _, v in runs if k == cfg) / 3
    assert c.diff == pytest.approx(mean("champ") - mean("cand"))
    assert c.se == pytest.approx(residual.sigma * math.sqrt(2 / 3))
    # unpaired, the seeds' 0.02 spread swamps a 0.01 gain; paired, it is certain
    noise = pooled_noise({k: [v for c2, _, v in runs if c2 == k] for k in ("champ", "cand", "x", "y")})
    assert p_better([v for k, _, v in runs if k == "cand"], [v for k, _, v in runs if k == "champ"], noise) < 0.9
    assert c.p > 0.999
    verdict = rule(3, c)
    assert verdict.status == "keep" and "(paired)" in verdict.reason


def test_a_candidate_short_of_the_champions_seeds_is_still_paired_on_those_it_shares():
    """Two runs (seeds 42, 43) against a champion of three (42-44): generalised least squares weighs the shared
    seeds; a 0.01 gain is kept after two runs, which unpaired could not."""
    runs = (_runs("champ", 2.0, [42, 43, 44], [0.001, -0.001, 0.0]) + _runs("cand", 1.99, [42, 43], [0.002, 0.0])
            + _runs("x", 2.1, [42, 43, 44, 45], [0.001, -0.002, 0.0, 0.001]))
    c = decide_module.compare(runs, "cand", "champ")
    assert c.paired and c.df == decide_module.seed_free_noise(runs).df and rule(2, c).status == "keep"
    values = {k: [v for c2, _, v in runs if c2 == k] for k in ("champ", "cand", "x")}
    assert decide(values["cand"], values["champ"], pooled_noise(values)).status != "keep"


def test_a_candidate_that_does_not_share_the_seed_effects_is_judged_on_its_own_differences():
    """A change that redraws the seed's random numbers (new shapes, another initialisation) does not move with
    the seeds as the tag's configurations do: its differences from the champion on their common seeds, not the
    tag's small seed-free noise, say how sure the comparison is (with their one degree of freedom). A 0.01 gain
    seen through 0.014 of noise of its own is not kept on two runs."""
    runs = (_runs("champ", 2.0, [42, 43, 44], [0.001, -0.001, 0.0])
            + _runs("x", 2.1, [42, 43, 44, 45], [0.001, -0.002, 0.0, 0.001])
            + [("cand", 42, 2.007), ("cand", 43, 1.983)])  # 0.01 better, then -0.014 and +0.014 of its own
    c = decide_module.compare(runs, "cand", "champ")
    tag_only = decide_module.seed_free_noise(runs)
    assert c.paired and c.df == 1 and c.se > tag_only.sigma * math.sqrt(1 / 2 + 1 / 3)
    assert rule(2, c).status != "keep"


def test_no_shared_seed_effect_or_too_few_degrees_of_freedom_fall_back_to_the_unpaired_comparison():
    rng = __import__("random").Random(1)
    # independent noise: the seeds explain nothing, the residual is no smaller than the pooled noise
    flat = [(c, s, 2.0 + rng.gauss(0, 0.01)) for c in "abcd" for s in (42, 43, 44)]
    c = decide_module.compare(flat, "b", "a")
    values = {k: [v for c2, _, v in flat if c2 == k] for k in "abcd"}
    assert decide_module.seed_free_noise(flat).sigma >= pooled_noise(values).sigma
    assert not c.paired and c.p == pytest.approx(p_better(values["b"], values["a"], pooled_noise(values)))
    # a young tag: the baseline's three runs and a candidate's two leave one residual degree of freedom
    young = _runs("champ", 2.0, [42, 43, 44], [0.001, -0.001, 0.0]) + _runs("cand", 1.99, [42, 43], [0.0, 0.001])
    assert not decide_module.compare(young, "cand", "champ").paired
    # every run of a tag on its own seed (ledgers from before pairing): nothing to pair on
    own_seeds = [(c, 100 + i, v) for i, (c, _, v) in enumerate(flat)]
    assert not decide_module.compare(own_seeds, "b", "a").paired
    assert decide_module.compare([("a", 42, 1.0), ("b", 42, 1.1)], "b", "a") is None


# --- the series state, read back from ledger rows -----------------------------------------------------------

def _row(status, value, config, decision="", description="d"):
    from autoresearch.ledger import Row
    return Row("c" + config, value, 0.1, status, description, "t", "r", "now", 300, 10, 10.0, "f", 0,
               config=config, decision=decision)


def test_unfinished_series_from_the_ledger():
    from autoresearch.decide import latest_unfinished
    base = [_row("keep", 1.6, "a", "baseline 1/3", "baseline")]
    assert latest_unfinished(base).kind == "baseline" and latest_unfinished(base).runs == 1
    three = base + [_row("keep", 1.61, "a", "baseline 2/3"), _row("keep", 1.62, "a", "baseline 3/3")]
    assert latest_unfinished(three) is None
    confirming = three + [_row("confirm", 1.59, "b", "P 0.7 after one run", "try b")]
    series = latest_unfinished(confirming)
    assert (series.kind, series.config, series.runs, series.description) == ("candidate", "b", 1, "try b")
    # a killed harness (interrupted) and a refusal leave it open; the candidate's own crash closes it
    interrupted = confirming + [_row("crash", 0.0, "b", "interrupted"), _row("refused", 0.0, "b")]
    assert latest_unfinished(interrupted).runs == 1
    assert latest_unfinished(interrupted + [_row("crash", 0.0, "b")]) is None
    assert latest_unfinished(confirming + [_row("discard", 1.7, "b", "P 0.1 < 0.5 after 2 runs")]) is None


def test_parallel_workers_leave_several_series_open_and_each_closes_on_its_own_rows():
    from autoresearch.decide import latest_unfinished, series_of, unfinished
    three = [_row("keep", 1.6, "a", f"baseline {i}/3", "baseline") for i in (1, 2, 3)]
    # b and c confirm side by side; d's first run is discarded in between: it closes neither
    rows = three + [_row("confirm", 1.59, "b", "P 0.7", "try b"), _row("confirm", 1.58, "c", "P 0.8", "try c"),
                    _row("discard", 1.8, "d", "3 sigma worse", "try d")]
    assert [s.config for s in unfinished(rows)] == ["b", "c"]  # the one waiting longest first
    assert latest_unfinished(rows).config == "c"
    rows.append(_row("discard", 1.62, "b", "P 0.3 < 0.5 after 2 runs"))
    assert [s.config for s in unfinished(rows)] == ["c"] and series_of(rows, "b") is None
    rows.append(_row("crash", 0.0, "c", "interrupted"))  # a worker died during c's run: still open
    assert series_of(rows, "c").runs == 1
