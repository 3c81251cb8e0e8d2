"""The built-in researcher (autoresearch/researcher.py), without training: what it proposes after what the ledger
holds. Rows are written as the harness writes them (a commit per candidate, its train.py blob as its config)."""

import collections

import pytest

from autoresearch import descriptions, facts, git, ideas, ledger, proposer, record, tags
from autoresearch import researcher as builtin
from autoresearch.sites import read_constants, set_constants
from autoresearch.record import Trial
from autoresearch.worker import keep_on_branch
from conftest import sh, reviewed_train_source

SEQ = 32


@pytest.fixture
def tag(repo, env, monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", env["AUTORESEARCH_CACHE"])
    return tags.setup(repo, "p")


def commit(repo, source: str, message: str) -> str:
    (repo / "train.py").write_text(source)
    sh(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "--allow-empty", "-qam", message)
    return sh(repo, "git", "rev-parse", "HEAD")


def run_as(repo, config, source, description, status, val_bpb, n=1, back_to=None, steps=5):
    """Record `source` as having run n times with `status` (keep leaves the branch on it, like the harness; a
    crash's and a refusal's description carry the reason the harness appends)."""
    head = commit(repo, source, description)
    note = {"crash": " [crash: exit status 1]", "refused": " [refused: the run took 400 s, more than ...]"}
    for i in range(n):
        ledger.append(repo / "results.tsv", record.make_row(
            config, head, description + (f"{descriptions.REPEAT_MARK}{i + 1}]" if i else "") + note.get(status, ""),
            f"r{head[:6]}{i}", status,
            val_bpb=val_bpb if status != "crash" else 0.0, memory_gb=0.1, steps=steps, wall=10.0, seed=42 + i,
            config=git.blob_of(source)))
    if status != "keep":
        sh(repo, "git", "reset", "-q", "--hard", back_to or "HEAD~1")


def researcher(repo, seed=0):
    return builtin.Researcher(repo, "p", "cpu", SEQ, seed)


@pytest.mark.slow
def test_planted_regressions_are_undone_first_then_a_kept_step_is_taken_again(repo, tag):
    """A train.py with a worse activation, no QK-norm and a detuned learning rate: the researcher's first moves
    restore the public record's choices, one per experiment; a kept learning-rate step is followed by the next."""
    source = (repo / "train.py").read_text()
    broken = source.replace("F.relu(self.c_fc(x)).square()", "F.gelu(self.c_fc(x))")
    broken = broken.replace("rms_norm(apply_rotary(q, cos, sin)), rms_norm(apply_rotary(k, cos, sin))",
                            "apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)")
    broken = set_constants(broken, {"MATRIX_LR": 0.01}, "cpu")
    run_as(repo, tag, broken, "baseline", "keep", 2.0, n=3)
    proposed = []
    for bpb in (1.9, 1.8):
        new, description = researcher(repo).propose_source((repo / "train.py").read_text())
        proposed.append(description)
        run_as(repo, tag, new, description, "keep", bpb, n=2)
    assert sorted(proposed) == ["idea activation: act='relu2'", "idea qk_norm: norm=True"]
    assert (repo / "train.py").read_text() == set_constants(source, {"MATRIX_LR": 0.01}, "cpu")
    # no more moves back to the record; a learning-rate step kept is taken again
    run_as(repo, tag, set_constants((repo / "train.py").read_text(), {"MATRIX_LR": 0.02}, "cpu"),
           "MATRIX_LR 0.01 -> 0.02", "keep", 1.7, n=2)
    new, description = researcher(repo).propose_source((repo / "train.py").read_text())
    assert description == "MATRIX_LR 0.02 -> 0.04" and read_constants(new)["MATRIX_LR"] == 0.04


@pytest.mark.slow
def test_no_train_py_twice_no_crashed_variant_again_and_parallel_proposals_differ(repo, tag):
    source = (repo / "train.py").read_text()
    run_as(repo, tag, source, "baseline", "keep", 2.0, n=3)
    seen = {git.blob_of(source)}
    crashed = None
    for i in range(15):
        new, description = researcher(repo, seed=i).propose_source(source)
        assert git.blob_of(new) not in seen, description
        seen.add(git.blob_of(new))
        status = "crash" if crashed is None and description.startswith("idea ") else "discard"
        if status == "crash":
            crashed = description
        run_as(repo, tag, new, description, status, 2.1)
        assert (repo / "train.py").read_text() == source
    assert crashed is not None
    # the crashed variant is not proposed again, even from another champion
    arm, params = proposer.parse_move(crashed)
    other = set_constants(source, {"MATRIX_LR": 0.05}, "cpu")
    run_as(repo, tag, other, "MATRIX_LR 0.04 -> 0.05", "keep", 1.9, n=2)
    for seed in range(10):
        new, description = researcher(repo, seed).propose_source(other)
        assert proposer.parse_move(description) != (arm, params)
    # a lasting refusal (too slow for the allowance) is not proposed again either
    first, description = researcher(repo, seed=99).propose_source(other)
    run_as(repo, tag, first, description, "refused", 0.0)
    assert all(researcher(repo, seed).propose_source(other)[0] != first for seed in range(5))
    # three workers side by side: each proposal is told what runs (its source and description): three arms
    running, flight = [], []
    for _ in range(3):
        new, description = researcher(repo).propose_source(other, running, flight)
        running.append(new)
        flight.append(description)
    assert len({proposer.parse_move(d)[0] for d in flight}) == 3, flight


@pytest.mark.slow
def test_arms_that_pay_are_drawn_more_often_than_arms_that_failed(repo, tag):
    """After every arm failed twice but one that was kept twice, that arm is drawn far more often than one in
    thirty-odd (the arms' count), over many draws."""
    source = (repo / "train.py").read_text()
    run_as(repo, tag, source, "baseline", "keep", 2.0, n=3)
    champion = sh(repo, "git", "rev-parse", "HEAD")
    moves = builtin.moves(source, "cpu", SEQ)
    by_arm = collections.defaultdict(list)
    for m in moves:
        by_arm[m.arm].append(m)
    lucky = "momentum_warmup"
    for arm, options in by_arm.items():
        for m in options[:2]:
            if arm != lucky:
                run_as(repo, tag, m.source, m.description, "discard", 2.1, back_to=champion)
    # the lucky arm: kept twice on earlier champions (recorded as keeps whose series the branch then left)
    for i, start in enumerate((0.85, 0.7)):
        variant = ideas.apply(set_constants(source, {"SCALAR_LR": 0.4 + i / 10}, "cpu"), ideas.IDEAS[lucky],
                              {"start": start})
        run_as(repo, tag, variant, ideas.describe(ideas.IDEAS[lucky], {"start": start}), "keep", 1.9 - i / 10,
               n=2)
    picks = collections.Counter(proposer.parse_move(researcher(repo, seed).propose_source(source)[1])[0]
                                for seed in range(40))
    assert picks[lucky] >= 10, picks  # chance alone: ~1 in 40
    with pytest.raises(RuntimeError, match="no untried move"):
        builtin.Researcher(repo, "p", "cpu", SEQ).allowed(source, in_flight=[m.description for m in moves])


def test_descriptions_read_back_whatever_the_harness_appended():
    assert proposer.parse_move("idea activation: act='silu' [crash: exit status 1]") == ("activation", {"act": "silu"})
    assert proposer.parse_move("idea activation: act='silu' [run 2]") == ("activation", {"act": "silu"})
    assert proposer.parse_move("MATRIX_LR 0.04 -> 0.08 [crash: FAST_FAIL (loss NaN)]") == (
        "tune MATRIX_LR", {"MATRIX_LR": 0.08, "from": 0.04})
    assert proposer.parse_move("ADAM_BETAS (0.8, 0.95) -> (0.9, 0.95), MATRIX_LR 0.04 -> 0.05") == (
        "tune ADAM_BETAS", {"ADAM_BETAS": (0.9, 0.95), "from": (0.8, 0.95)})
    assert proposer.parse_move("idea activation: act=whatever I felt like") == ("", {})
    assert proposer.parse_move("made the model wider") == ("", {})


@pytest.mark.slow
def test_history_reads_moves_effects_and_outcomes_from_the_ledger(repo, tag):
    source = (repo / "train.py").read_text()
    run_as(repo, tag, source, "baseline", "keep", 2.0, n=3)
    relu = ideas.apply(source, ideas.IDEAS["activation"], {"act": "relu"})
    run_as(repo, tag, relu, "idea activation: act='relu'", "discard", 2.2)
    lr = set_constants(source, {"MATRIX_LR": 0.08}, "cpu")
    run_as(repo, tag, lr, "MATRIX_LR 0.04 -> 0.08", "keep", 1.9, n=2)
    past = proposer.history(ledger.read(repo / "results.tsv", "p"))
    assert [(e.arm, e.outcome, e.runs) for e in past] == [("", "keep", 3), ("activation", "discard", 1),
                                                          ("tune MATRIX_LR", "keep", 2)]
    assert past[1].params == {"act": "relu"} and past[1].effect == pytest.approx(0.2)
    assert past[2].params == {"MATRIX_LR": 0.08, "from": 0.04} and past[2].effect == pytest.approx(-0.1)
    assert past[2].parent == past[0].config == git.blob_of(source)


@pytest.mark.slow
def test_the_agent_s_prompt_and_autoresearch_ideas_show_what_was_tried_and_what_the_catalog_offers(repo, tag, env):
    from autoresearch import agents
    from conftest import cli
    source = (repo / "train.py").read_text()
    run_as(repo, tag, source, "baseline", "keep", 2.0, n=3)
    relu = ideas.apply(source, ideas.IDEAS["activation"], {"act": "relu"})
    run_as(repo, tag, relu, "idea activation: act='relu'", "discard", 2.25)
    prompt = agents.build_prompt(repo, "p")
    assert "- idea activation: act='relu': discard, effect +0.2500 (1 run)" in prompt
    assert "- activation (ReLU squared" in prompt and "tried 1x, kept 0" in prompt
    assert "- qk_norm (" in prompt and "untried" in prompt and "autoresearch ideas" not in prompt
    # a person or an agent that drives the CLI: the same, and --apply writes one idea
    out = cli(repo, "ideas", env=env)
    assert out.returncode == 0 and "- idea activation: act='relu': discard" in out.stdout, out.stderr
    out = cli(repo, "ideas", "--apply", "qk_norm", "norm=False", env=env)
    assert out.returncode == 0, out.stderr
    assert ideas.current(ideas.IDEAS["qk_norm"], (repo / "train.py").read_text()) == {"norm": False}
    bad = cli(repo, "ideas", "--apply", "qk_norm", "norm=maybe", env=env)
    assert bad.returncode == 2 and "not one of its variants" in bad.stderr
    assert cli(repo, "ideas", "--apply", "warp_drive", env=env).returncode == 2


def test_a_constant_steps_back_into_its_range_and_half_steps_lie_between():
    """Halving and doubling never leave 0, where an agent may have set a learning rate: from outside its range
    a constant steps to the nearest end and the middle. Half steps: sqrt(2) on a log scale, an eighth of a
    linear range; none for integers and choices."""
    from autoresearch.space import SPACES, steps
    space = SPACES["cpu"]
    assert steps(space["UNEMBEDDING_LR"], 0.0) == [(0.0005, "up"), (0.005, "up")]
    assert steps(space["MATRIX_LR"], 5.0) == [(0.2, "down"), (0.0316, "down")]
    assert steps(space["MATRIX_LR"], 0.04) == [(0.02, "down"), (0.08, "up")]
    assert steps(space["MATRIX_LR"], 0.04, fine=True) == [(0.0283, "down"), (0.0566, "up")]
    assert steps(space["WEIGHT_DECAY"], 0.0, fine=True) == [(0.05, "up")]
    assert steps(space["DEPTH"], 4, fine=True) == [] and steps(space["MODEL_DIM"], 128, fine=True) == []
    assert steps(space["DEPTH"], 40) == [(8, "down"), (5, "down")] and steps(space["DEPTH"], 3.5) == []
    assert steps(space["MATRIX_LR"], "fast") == [] and steps(space["MATRIX_LR"], float("nan")) == []


def only(arm: str, source: str) -> list[str]:
    """Descriptions that keep every other arm busy (as if parallel workers ran them): only `arm` may move."""
    return [next(m for m in builtin.moves(source, "cpu", SEQ) if m.arm == other).description
            for other in {m.arm for m in builtin.moves(source, "cpu", SEQ)} - {arm}]


@pytest.mark.slow
def test_a_value_between_once_both_steps_failed_and_a_constant_at_zero_comes_back(repo, tag):
    source = (repo / "train.py").read_text()
    run_as(repo, tag, source, "baseline", "keep", 2.0, n=3)
    champion = sh(repo, "git", "rev-parse", "HEAD")
    busy = only("tune MATRIX_LR", source)
    first = {researcher(repo, seed).propose_source(source, in_flight=busy)[1] for seed in range(6)}
    assert first == {"MATRIX_LR 0.04 -> 0.02", "MATRIX_LR 0.04 -> 0.08"}
    for value in (0.02, 0.08):
        run_as(repo, tag, set_constants(source, {"MATRIX_LR": value}, "cpu"), f"MATRIX_LR 0.04 -> {value}",
               "discard", 2.1, back_to=champion)
    between = {researcher(repo, seed).propose_source(source, in_flight=busy)[1] for seed in range(6)}
    assert between == {"MATRIX_LR 0.04 -> 0.0283", "MATRIX_LR 0.04 -> 0.0566"}
    # after a kept step the way back rebuilds the champion before: never run, it opens the half steps too
    halved = set_constants(source, {"UNEMBEDDING_LR": 0.002}, "cpu")
    run_as(repo, tag, halved, "UNEMBEDDING_LR 0.004 -> 0.002", "keep", 1.95, n=2)
    run_as(repo, tag, set_constants(source, {"UNEMBEDDING_LR": 0.001}, "cpu"), "UNEMBEDDING_LR 0.002 -> 0.001",
           "discard", 2.0)
    busy = only("tune UNEMBEDDING_LR", halved)
    between = {researcher(repo, seed).propose_source(halved, in_flight=busy)[1] for seed in range(6)}
    assert between == {"UNEMBEDDING_LR 0.002 -> 0.00141", "UNEMBEDDING_LR 0.002 -> 0.00283"}
    # an agent's 0: back into the range
    zero = set_constants(source, {"UNEMBEDDING_LR": 0.0}, "cpu")
    run_as(repo, tag, zero, "UNEMBEDDING_LR 0.004 -> 0.0", "keep", 1.9, n=2)
    back = {researcher(repo, seed).propose_source(zero, in_flight=only("tune UNEMBEDDING_LR", zero))[1]
            for seed in range(6)}
    assert back == {"UNEMBEDDING_LR 0.0 -> 0.0005", "UNEMBEDDING_LR 0.0 -> 0.005"}


@pytest.mark.slow
def test_a_repair_that_failed_is_tried_again_once_after_the_champion_changed(repo, tag):
    """Issue 33: ReLU squared, discarded while another planted break was still there, was never tried again."""
    source = (repo / "train.py").read_text()
    broken = source.replace("F.relu(self.c_fc(x)).square()", "F.gelu(self.c_fc(x))")
    run_as(repo, tag, broken, "baseline", "keep", 2.0, n=3)
    repair = "idea activation: act='relu2'"
    proposals = []
    for lr in (0.05, 0.06, 0.07):
        new, description = researcher(repo).propose_source((repo / "train.py").read_text())
        proposals.append(description)
        if description == repair:
            run_as(repo, tag, new, description, "discard", 2.1)
            new, description = researcher(repo).propose_source((repo / "train.py").read_text())
            proposals.append(description)
            assert description != repair  # not twice against the same champion
        current = (repo / "train.py").read_text()  # a keep: the champion changes
        run_as(repo, tag, set_constants(current, {"MATRIX_LR": lr}, "cpu"), f"MATRIX_LR 0.04 -> {lr}", "keep",
               1.9 - lr, n=2)
    assert proposals.count(repair) == builtin.RECORD_TRIES, proposals  # first, then once after a keep


@pytest.mark.slow
def test_the_model_s_size_follows_what_the_budget_lets_it_see(repo, tag):
    """The model's size by a principle (compute-optimal training sees ~20 tokens per parameter), not by a result:
    far below it a smaller model comes first most of the time, a larger one rarely, and by the step nearest
    compute-optimal; far above, the other way round; near it, as any other arm. No order between the size arms
    (the depth before the width was one sitting's finding at 15 s, and is gone)."""
    source = (repo / "train.py").read_text()
    params = 12 * 4 * 128 ** 2  # DEPTH 4, MODEL_DIM 128 (the cpu profile)
    run_as(repo, tag, source, "baseline", "keep", 2.0, n=3, steps=5)  # 5 steps of 2048 tokens: 0.013 a parameter
    rows = ledger.read(repo / "results.tsv", "p")
    assert proposer.tokens_per_parameter(rows, git.blob_of(source), source, "cpu") == pytest.approx(5 * 2048 / params)
    assert "a smaller model may use the budget better" in proposer.knowledge(rows, source)  # an agent's prompt too

    def first_moves() -> collections.Counter:
        picks = collections.Counter()
        for seed in range(30):
            move = next(m for m in builtin.moves(source, "cpu", SEQ)
                        if m.description == researcher(repo, seed).propose_source(source)[1])
            size = move.arm in ("tune DEPTH", "tune MODEL_DIM")
            picks[move.direction if size else "other"] += 1
            picks["halved"] += size and move.params[move.arm[5:]] * 2 == move.params["from"]
        return picks

    small = first_moves()
    assert small["down"] >= 15 and small["up"] <= 2, small
    # so far below, the step nearest compute-optimal without passing it is a halving (size_step)
    assert small["halved"] == small["down"], small
    # far above (a long budget, a small model): larger first; near 20: as any other move
    size = [m for m in builtin.moves(source, "cpu", SEQ) if m.arm in ("tune DEPTH", "tune MODEL_DIM")]
    values = read_constants(source, "cpu")
    # nearer, the step that does not pass compute-optimal: 2 tokens a parameter wants ~0.3x the parameters,
    # which DEPTH 4 -> 2 (0.5x) does not pass and MODEL_DIM 128 -> 64 (0.25x) would
    down = {m.arm: [x for x in size if x.arm == m.arm and x.direction == "down"] for m in size}
    assert builtin.size_step(down["tune DEPTH"], values, 2.0).params["DEPTH"] == 2
    assert builtin.size_step(down["tune MODEL_DIM"], values, 2.0).params["MODEL_DIM"] == 96
    assert {m.direction for m in size} == {"up", "down"}
    for m in size:
        assert builtin.size_prior(m, 400.0) == (builtin.PRIOR_TOWARDS if m.direction == "up" else builtin.PRIOR_AWAY)
        assert builtin.size_prior(m, 20.0) == builtin.PRIOR_NEUTRAL == builtin.size_prior(m, None)


def test_near_the_size_its_budget_suits_a_size_move_never_halves(repo, tag):
    """Near compute-optimal (20 tokens per parameter) halving or doubling DEPTH or MODEL_DIM is never offered: the
    researcher steps by one layer or the neighbouring width, as it does any constant."""
    source = (repo / "train.py").read_text()
    steps = 20 * 12 * 4 * 128 ** 2 // 2048  # 20 tokens a parameter at TOTAL_BATCH_SIZE 2048
    run_as(repo, tag, source, "baseline", "keep", 2.0, n=3, steps=steps)
    coarse = {m.description for m in builtin.moves(source, "cpu", SEQ) if m.coarse}
    assert coarse == {"DEPTH 4 -> 2", "DEPTH 4 -> 8", "MODEL_DIM 128 -> 64", "MODEL_DIM 128 -> 256"}
    proposed = {researcher(repo, seed).propose_source(source)[1] for seed in range(40)}
    assert len(proposed) > 5 and not proposed & coarse, proposed


def test_a_proposal_s_parent_is_the_champion_it_changed_though_another_was_kept_before_it_ran(repo, tag):
    """The parallel loop: a proposal made from the baseline, a keep landing before its first row. Its effect and
    whether its move was tried against the new champion are counted against the train.py it changed (its
    commit's git parent), not the champion when its row came (the researcher would not try it on the new one)."""
    source = (repo / "train.py").read_text()
    run_as(repo, tag, source, "baseline", "keep", 2.0, n=2)
    lr = set_constants(source, {"MATRIX_LR": 0.08}, "cpu")
    proposed = git.commit_with(repo, sh(repo, "git", "rev-parse", "HEAD"), "train.py", lr, "MATRIX_LR 0.04 -> 0.08")
    deeper = set_constants(source, {"DEPTH": 5}, "cpu")
    run_as(repo, tag, deeper, "DEPTH 4 -> 5", "keep", 1.8, n=2)
    ledger.append(repo / "results.tsv", record.make_row(
        tag, proposed, "MATRIX_LR 0.04 -> 0.08", "late", "discard", val_bpb=1.9, memory_gb=0.1, steps=5,
        wall=10.0, seed=42, config=git.blob_of(lr)))
    _, past = researcher(repo).allowed(deeper)
    late = past[-1]
    assert (late.arm, late.outcome) == ("tune MATRIX_LR", "discard")
    assert late.parent == git.blob_of(source) and late.effect == pytest.approx(-0.1)  # not +0.1 against DEPTH 5
    rows = ledger.read(repo / "results.tsv", "p")  # what an agent's prompt and `autoresearch ideas` say
    assert "MATRIX_LR 0.04 -> 0.08: discard, effect -0.1000" in proposer.knowledge(rows, deeper, repo=repo)


def test_a_keep_re_committed_on_a_moved_branch_counts_against_the_champion_it_changed(repo, tag):
    """The parallel loop, one run a decision (naive): a proposal made from the baseline is kept after DEPTH 4 -> 5
    was; the branch gets a new commit of it on top of DEPTH 5, and the ledger that commit. Its effect still counts
    against the baseline it changed (the re-commit's second parent is the candidate's own commit)."""
    source = (repo / "train.py").read_text()
    run_as(repo, tag, source, "baseline", "keep", 2.0, n=2)
    base = sh(repo, "git", "rev-parse", "HEAD")
    lr = set_constants(source, {"MATRIX_LR": 0.08}, "cpu")
    proposed = git.commit_with(repo, base, "train.py", lr, "MATRIX_LR 0.04 -> 0.08")
    deeper = set_constants(source, {"DEPTH": 5}, "cpu")
    run_as(repo, tag, deeper, "DEPTH 4 -> 5", "keep", 1.9, n=2)
    champion = sh(repo, "git", "rev-parse", "HEAD")
    job = Trial("r", "p", base, "MATRIX_LR 0.04 -> 0.08", seed=42, commit=proposed, config=git.blob_of(lr), source=lr)
    kept = keep_on_branch(repo, job)[:7]  # as the driver records it
    assert sh(repo, "git", "rev-parse", f"{kept}^") == champion  # on top of DEPTH 5
    assert (repo / "train.py").read_text() == lr
    ledger.append(repo / "results.tsv", record.make_row(
        tag, kept, "MATRIX_LR 0.04 -> 0.08", "late", "keep", val_bpb=1.8, memory_gb=0.1, steps=5,
        wall=10.0, seed=42, config=git.blob_of(lr)))
    rows = ledger.read(repo / "results.tsv", "p")
    assert proposer.made_from(repo, rows)[kept] == git.blob_of(source)
    late = proposer.history(rows, proposer.made_from(repo, rows))[-1]
    assert late.parent == git.blob_of(source) and late.effect == pytest.approx(-0.2)  # not -0.1 against DEPTH 5
    shown = facts.diff(repo, kept)  # the dashboard's diff: what the keep changed in the branch's champion
    assert "+MATRIX_LR = 0.08" in shown and "-DEPTH = 5" in shown, shown


def test_a_kept_halving_far_below_the_size_its_budget_suits_is_followed_by_another(repo, tag):
    """Coordinate descent on the size: DEPTH 8 -> 4 kept while the model still trains ~0.01 tokens a parameter:
    the next move halves again (4 -> 2), not one layer (4 -> 3), which a short run cannot tell apart."""
    source = set_constants((repo / "train.py").read_text(), {"DEPTH": 8}, "cpu")
    run_as(repo, tag, source, "baseline", "keep", 2.0, n=2, steps=5)
    half = set_constants(source, {"DEPTH": 4}, "cpu")
    run_as(repo, tag, half, "DEPTH 8 -> 4", "keep", 1.9, n=2, steps=5)
    assert researcher(repo).propose_source(half)[1] == "DEPTH 4 -> 2"
    # random search, the reference, draws from the same moves: the halvings toward the size the budget suits
    space = {m.description for m in builtin.RandomSearch(repo, "p", "cpu", SEQ).space(half)}
    assert {"DEPTH 4 -> 2", "MODEL_DIM 128 -> 64"} <= space and not {"DEPTH 4 -> 8", "MODEL_DIM 128 -> 256"} & space
    assert not any(m.fine for m in builtin.moves(half, "cpu", SEQ) if m.description in space)


def test_the_size_step_goes_toward_compute_optimal_without_passing_it():
    """size_step: the part of the way to compute-optimal (20 tokens a parameter, parameters ~ sqrt of it at a
    fixed compute) each move goes; the largest that does not pass it, else the smallest."""
    source = reviewed_train_source()
    values = read_constants(source, "cpu")  # DEPTH 4, MODEL_DIM 128
    size = [m for m in builtin.moves(source, "cpu", SEQ) if m.arm == "tune DEPTH"]
    up, down = ([m for m in size if m.direction == d] for d in ("up", "down"))
    assert {m.params["DEPTH"] for m in up} == {5, 8} and {m.params["DEPTH"] for m in down} == {3, 2}
    assert builtin.size_step(up, values, 20 * 4 ** 2 * 1.01).params["DEPTH"] == 8  # 4x the parameters wanted
    assert builtin.size_step(up, values, 20 * 1.5 ** 2).params["DEPTH"] == 5        # 1.5x: doubling passes it
    assert builtin.size_step(down, values, 20 / 1.1 ** 2).params["DEPTH"] == 3      # all pass: the smallest
    assert builtin.size_step(down, values, None) is None


def test_a_description_or_train_py_that_is_no_literal_never_ends_the_night(repo, tag):
    """The red team's: an agent's `DESCRIPTION: LR 1 -> {[]}` (or a dead `UNUSED = {[]}` in a kept train.py) made
    ast.literal_eval raise TypeError in every later proposal and prompt: the loop ended, and every later loop on
    the tag. Now such a text is simply not a move, and such a constant not a constant."""
    from autoresearch import descriptions, sites
    source = (repo / "train.py").read_text()
    run_as(repo, tag, source, "baseline", "keep", 2.0, n=3)
    for text in ("LR 1 -> {[]}", "idea activation: act={[]}", "MATRIX_LR 0.04 -> [[[" + "[" * 200):
        run_as(repo, tag, source + f"\n# {len(text)}\n", text, "discard", 2.1)
    rows = ledger.read(repo / "results.tsv", "p")
    assert "Tried on this tag" in proposer.knowledge(rows, source)  # an agent's prompt
    researcher(repo).propose_source(source)  # the built-in researcher
    assert sites.read_constants("UNUSED = {[]}\nB = 2\n") == {"B": 2}
    assert descriptions.clean("a\x1b]52;c;eA==\x07 b") == "a?]52;c;eA==? b"
