"""The noise-aware comparison on synthetic samples, against values computed by hand."""

import math

import pytest

from autoresearch.decide import Noise, decide, p_better, pooled_noise, sem


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


def test_a_first_run_that_paid_a_cold_compile_is_never_discarded_alone():
    """A new shape's first run loses a minute of its budget to a cold torch.compile; the next run of the same
    train.py compiles warm. So a loss after one cold run earns a second run, and that run is judged as usual."""
    champion, noise = [1.65, 1.66, 1.64], Noise(0.005, 8)
    assert decide([1.70], champion, noise).status == "discard"
    verdict = decide([1.70], champion, noise, cold=True)
    assert verdict.status == "confirm" and "cold compile" in verdict.reason
    assert decide([1.70, 1.69], champion, noise, cold=False).status == "discard"


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
