"""Early pruning's rule (autoresearch/baseline.py), on loss curves made up to the point: the harness's own use of
it is in test_harness (a candidate with every learning rate at zero is pruned, with no evaluation)."""

import random

import runtime
from autoresearch import baseline
from autoresearch.tagconfig import Tag

TAG = Tag("t", "autoresearch/t", "f", 100, "c")  # a tag with a 100 s budget

BUDGET = 100.0


def run(level: float, rng, noise=0.02, start=0):
    """A loss curve falling from 6 towards `level`, one step line a second, with noise between runs."""
    shift = rng.gauss(0, noise)
    return [(float(t), level + (6 - level) * 0.97 ** t + shift + rng.gauss(0, noise / 4)) for t in range(start, 101)]


def test_a_run_like_the_champion_s_is_never_pruned_and_a_hopeless_one_is_only_after_half_the_budget():
    rng = random.Random(0)
    base = [run(3.0, rng) for _ in range(3)]
    ref = baseline.Reference(BUDGET, base)
    sd, df = ref.noise(60)
    assert 0.005 < sd < 0.08 and df == 2
    # 200 no-op candidates (new seeds of the champion's curve): none pruned at any step line
    false = sum(any(ref.verdict(t, loss) for t, loss in run(3.0, rng)) for _ in range(200))
    assert false <= 200 * 0.02
    # a hopeless candidate: never before half the budget, then at the first line past it
    hopeless = run(4.0, rng)
    verdicts = [(t, ref.verdict(t, loss)) for t, loss in hopeless]
    assert not any(v for t, v in verdicts if t < 50)
    first = next(t for t, v in verdicts if v)
    assert first == 50 and "pruned at 50 s of 100: training loss 4." in dict(verdicts)[50]
    # nor in the budget's last tenth, where nothing is left to save
    assert dict(verdicts)[89] and ref.verdict(91, 9.0) is None and ref.verdict(100, 9.0) is None
    # a small real gap (a discard, not hopeless) is left to the decision rule
    assert not any(ref.verdict(t, loss) for t, loss in run(3.03, random.Random(5), noise=0.0))


def test_no_verdict_without_noise_to_calibrate_on_or_a_curve_to_compare_with():
    rng = random.Random(1)
    assert baseline.Reference(BUDGET, [run(3.0, rng)]).verdict(80, 9.0) is None  # one run: no noise estimate
    ref = baseline.Reference(BUDGET, [run(3.0, rng, start=0)[:40], run(3.0, rng, start=0)[:40]])
    assert ref.verdict(80, 9.0) is None  # the base's curves end before 80 s
    ref = baseline.Reference(BUDGET, [run(3.0, rng), run(3.0, rng), run(3.0, rng)])
    assert ref.verdict(80, float("nan")) is None and ref.verdict(None, 9.0) is None
    assert ref.check(80, "step=   80 | loss=9.0000 | tok/s=1 | mfu=1.0% | elapsed=80s | epoch=1")
    assert ref.check(80, "no step line") is None


def test_curves_are_read_from_the_step_lines_and_interpolated():
    text = "\n".join(runtime.step_line(s, loss, 1000, 1.0, t, 1) for s, loss, t in
                     [(1, 6.0, 0), (10, 5.0, 10), (20, float("nan"), 15), (30, 4.0, 20)]) + "\nval_bpb=1.0\n"
    points = baseline.curve(text, runtime.STEP_RE)
    assert points == [(0.0, 6.0), (10.0, 5.0), (20.0, 4.0)]
    assert baseline.at(points, 15) == 4.5 and baseline.at(points, 20) == 4.0 and baseline.at(points, 25) is None


def test_no_verdict_on_a_run_s_first_steps():
    """Early lines measure the initialisation, whose loss every seed of the champion shares to 1e-4 (a zero-
    initialised head: ln(vocab)); a change that redraws the initial weights overshot it by 0.04 at step 2, and
    was pruned as hopeless on the first look of a 10 s budget whose first half went to compilation."""
    plateau = [[(5.0, 8.3180 + d), (9.0, 8.3180 + d)] for d in (0.0, 0.0001, -0.0001)]
    ref = baseline.Reference(10.0, plateau)
    line = "step=     2 | loss=8.3619 | tok/s=1 | mfu=1.0% | elapsed=5s | epoch=1"
    assert ref.check(5, line) is None
    assert ref.check(5, line.replace("step=     2", f"step={baseline.MIN_STEP:6d}"))  # the same loss, later: judged


def test_only_a_candidate_s_first_run_is_pruned_never_a_confirmation_or_the_baseline(tmp_path):
    """A confirmation run belongs to a candidate the rule found promising (a night pruned the 4th run of one at
    P 0.948); the baseline's and naive runs have no base curve to trail. Both loops ask study.Study.pruning: the
    parallel driver ships its Reference to the worker (as a dict), which must check as this process does."""
    import dataclasses
    from autoresearch import ledger, study
    rows = [ledger.Row(commit="abc1234", val_bpb=2.0, memory_gb=0.0, status="keep", description="baseline",
                       tag="t", run_id=f"r{i}", time="", budget_s=100, steps=1, wall_s=1.0, fingerprint="f",
                       config="cfg", seed=42 + i) for i in range(3)]
    assert study.Study(tmp_path, TAG, "stat", []).pruning(True) is None  # no champion yet
    assert study.Study(tmp_path, TAG, "stat", rows).pruning(False) is None  # a confirmation or a baseline
    assert study.Study(tmp_path, TAG, "naive", rows).pruning(True) is None
    rng = random.Random(2)
    for i in range(3):  # the base's logs, where the driver keeps them
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "run.log").write_text("\n".join(
            runtime.step_line(int(t), loss, 1000, 1.0, t, 1) for t, loss in run_curve(3.0, rng)))
    from unittest import mock
    with mock.patch("autoresearch.state.runs_dir", return_value=tmp_path), \
            mock.patch("autoresearch.tags.config_of", return_value="cfg"):
        ref = study.Study(tmp_path, TAG, "stat", rows).pruning(True)
    assert ref is not None and len(ref.base) == 3
    shipped = baseline.Reference(**dataclasses.asdict(ref))  # what the worker rebuilds from the job
    hopeless = "step=   70 | loss=9.0000 | tok/s=1 | mfu=1.0% | elapsed=70s | epoch=1"
    for r in (ref, shipped):  # a warm start: the first step line early (see the cold-compile test)
        assert r.check(1, "step=     1 | loss=6.0000 | tok/s=1 | mfu=1.0% | elapsed=1s | epoch=1") is None
    assert shipped.check(70, hopeless) and shipped.check(70, hopeless) == ref.check(70, hopeless)
    assert shipped.check(70, hopeless.replace("9.0000", "3.0000")) is None


def test_a_champion_that_prints_a_low_loss_prunes_no_one(tmp_path):
    """The attack of issue 50: a kept train.py printing its loss a nat low (and identical on every repeat, which
    shrank the pooled noise) was every later candidate's yardstick, and got 3 of 3 honest ones pruned at half their
    budget. The reference is the tag's base runs alone: an honest candidate is not pruned, and a hopeless one
    still is."""
    from autoresearch import ledger, study

    def row(i, config, description, status="keep"):
        return ledger.Row(commit=f"c{i}", val_bpb=2.0, memory_gb=0.0, status=status, description=description,
                          tag="t", run_id=f"r{i}", time="", budget_s=100, steps=1, wall_s=1.0, fingerprint="f",
                          config=config, seed=42 + i % 3)
    rows = [row(i, "base", "baseline") for i in range(3)] + [row(i, "liar", "lies", "keep") for i in range(3, 6)]
    rng = random.Random(3)
    for i in range(6):
        honest = run_curve(3.0, rng)
        points = honest if i < 3 else [(t, 2.0 + 0.0 * loss) for t, loss in honest]  # a nat low, no noise
        (tmp_path / f"r{i}").mkdir()
        (tmp_path / f"r{i}" / "run.log").write_text("\n".join(
            runtime.step_line(int(t), loss, 1000, 1.0, t, 1) for t, loss in points))
    from unittest import mock
    with mock.patch("autoresearch.state.runs_dir", return_value=tmp_path), \
            mock.patch("autoresearch.tags.config_of", return_value="base"):
        ref = study.Study(tmp_path, TAG, "stat", rows).pruning(True)
    honest = [run_curve(3.0, random.Random(100 + k)) for k in range(3)]
    assert not any(ref.verdict(t, loss) for c in honest for t, loss in c)
    assert any(ref.verdict(t, loss) for t, loss in run_curve(4.0, random.Random(7)))


run_curve = run
