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


def test_a_clear_win_is_kept_after_one_run():
    assert decide([1.60], [1.65, 1.66, 1.64], Noise(0.005, 8)) == "keep"


def test_a_clear_loss_is_discarded_after_one_run():
    assert decide([1.70], [1.65, 1.66, 1.64], Noise(0.005, 8)) == "discard"


def test_a_tie_gets_confirmation_runs_and_is_rejected_at_the_cap():
    champion, noise = [1.650, 1.652, 1.648], Noise(0.01, 8)
    runs = [1.651]
    while (verdict := decide(runs, champion, noise, max_runs=4)) == "confirm":
        runs.append([1.649, 1.650, 1.652][len(runs) - 1])
    assert verdict == "discard" and len(runs) == 4


def test_a_small_real_gain_is_kept_once_the_repeats_make_it_sure():
    # 0.010 better with sigma 0.006: one run gives t = 0.010 / 0.00693 = 1.44, P = 0.91 (not sure yet); three
    # give t = 0.010 / 0.00490 = 2.04, P = 0.968 (12 degrees of freedom): kept
    champion, noise = [1.650, 1.652, 1.648], Noise(0.006, 12)
    runs = [1.640]
    assert decide(runs, champion, noise) == "confirm"
    runs += [1.639, 1.641]
    assert decide(runs, champion, noise) == "keep"
