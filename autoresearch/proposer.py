"""The built-in researcher (`--agent builtin`): no language model, no network. Each proposal is one *move* on the
champion's train.py: an idea of the catalog (ideas.py) set to one of its variants, or one hyperparameter constant
halved or doubled (a step of a quarter of its range where it is not a scale, the neighbouring choice of a
categorical). Which move, a Thompson-sampling bandit decides:

1. where the champion strayed from the public record's choice (ideas.Idea.recommended: a removed QK-norm, a
   worse activation), the move back comes first, and once more after the champion changed;
2. a constant whose step was just kept is stepped again the same way (coordinate descent);
3. otherwise each *arm* (an idea, or "tune NAME" for a constant) has a Beta belief in "this move gets kept":
   its prior (1:4 for a move away from the record's choice, 1:2 for any other) plus, per decided experiment of
   the arm, one keep, or one failure (a discard, a pruned or crashed run), or half of each for a discard whose
   paired effect was better than its champion (a gain too small to be sure of); a failure against an earlier
   champion counts half (the move may pay now); the arm with the highest draw moves, to a variant not yet
   tried against the current champion if it has one. The model's size is judged by what the budget lets it
   see: where the champion's runs trained far fewer tokens per parameter than compute-optimal training does
   (TOKENS_PER_PARAM, FIT_BAND), a move that makes it smaller (DEPTH or MODEL_DIM down) gets the prior of a
   move back to the record and one that makes it larger the prior of a move away; far more, the other way
   round (a 15 s night on 2 cores: ~0.1 tokens per parameter; its TPE arm gained 5 noises by halving DEPTH,
   which the researcher, every arm's prior alike, never tried in 21 experiments: BENCHMARKS.md). There a size
   arm also offers halving and doubling (DEPTH 4 -> 2, MODEL_DIM 128 -> 64) and moves by the step that comes
   nearest compute-optimal without passing it (size_step): one layer fewer was below a 15 s run's noise and
   took 3-4 runs to discard. Shrinking, the depth goes first: until a smaller DEPTH was tried against the champion,
   the width arm's draw proposes it (the 64-wide model lost to the 2-layer one by 3 sigma at 15 s).
A move that failed is worth another look once the champion has changed (issue 33: ReLU squared, discarded while
the head's init was still broken, was never tried again after the init was repaired): the record's choices of
step 1 are tried again once after a keep, and "tried" in step 3 means tried against this champion. A constant
outside its range (an agent's 0 for a learning rate, which halving and doubling never leave) steps back to the
range's nearest end or its middle; once no full step of a constant is left to try from the champion and one
failed against it, the steps of half the size (a value between) are offered.
Never to a train.py the tag already ran, never to a variant that crashed, never on an arm that a parallel worker
is running now (so side-by-side proposals differ).

`--agent random` draws moves uniformly from the same space (the benchmark's reference) and `--agent tpe` is the
constants-only TPE proposer that came before (tpe.py). All of them read results.tsv afresh for each proposal.
"""

from __future__ import annotations

import ast
import functools
import math
import random
from dataclasses import dataclass
from pathlib import Path

from autoresearch import decide, descriptions, git, ideas, ledger, state
from autoresearch.edit import EditError, read_constants, set_constants
from autoresearch.space import SIZE_ARMS, SPACES, consequences, parameters, size_steps, steps

PRIOR_TOWARDS = (4, 1)    # back to the public record's choice (tried first anyway, RECORD_TRIES; then by its record)
PRIOR_AWAY = (1, 4)       # away from it
PRIOR_NEUTRAL = (1, 2)    # no record either way; a constant's step
RECORD_TRIES = 2          # a move back to the record's choice: tried first, and once more after a keep
OLD_FAILURE = 0.5         # the weight of a failure against an earlier champion in an arm's belief
TOKENS_PER_PARAM = 20     # compute-optimal training sees about 20 tokens per parameter (Hoffmann et al. 2022)
FIT_BAND = 8              # a champion more than this factor off it: its size moves toward it are favoured (the
                          # cpu default at 300 s trains ~5.4 a parameter; 3 layers there lost on 3 of 3 seeds, +0.010)


# --- what the ledger says about moves --------------------------------------------------------------------------

@dataclass
class Experiment:
    config: str
    description: str
    arm: str             # an idea's name, "tune NAME", or "" (the baseline, or a free-form change by an agent)
    params: dict
    parent: str          # the configuration it was made from (its commit's git parent), else the champion's
                         # when it began
    outcome: str = "open"  # keep, discard, crash or open
    effect: float | None = None  # its mean val_bpb minus its parent's, seeds paired as decide.compare does
                                 # (negative: better)
    runs: int = 0


def parse_move(description: str) -> tuple[str, dict]:
    """(arm, params) of a proposal's description: `idea NAME: k=v, ...` or `NAME old -> new[, NAME2 ...]` (the
    first constant names the arm)."""
    text = descriptions.move_text(description)
    parsed = ideas.parse(text)
    if parsed:
        return parsed
    first = descriptions.first_constant(text)
    if not first:
        return "", {}
    name, old, new = first
    try:
        return f"tune {name}", {name: ast.literal_eval(new), "from": ast.literal_eval(old)}
    except (ValueError, SyntaxError):
        return f"tune {name}", {}


def history(rows, made_from: dict[str, str] | None = None) -> list[Experiment]:
    """One Experiment per configuration of the tag, in the order they began, with how they ended. made_from: the
    configuration each commit was made from (git.parent_blobs), its `parent` where that one ran before it; else
    the champion at its first row (in a parallel loop a keep may land between a proposal and its first row)."""
    made_from = made_from or {}
    found: dict[str, Experiment] = {}
    means = {k: sum(v) / len(v) for k, v in decide.samples(rows).items()}
    champion = None
    for r in rows:
        if r.status in ("refused", "control") or decide.is_interruption(r):
            continue
        if r.key not in found:
            arm, params = parse_move(r.description)
            parent = made_from.get(r.commit, "")
            found[r.key] = Experiment(r.key, descriptions.move_text(r.description), arm, params,
                                      parent if parent in found else champion.key if champion else "")
        e = found[r.key]
        e.runs += r.status != "crash"
        if r.status in ("keep", "discard", "crash", "pruned"):
            e.outcome = "keep" if r.status == "keep" or e.outcome == "keep" else r.status
        if r.status == "keep":
            champion = r
    seeded = decide.seeded(rows)
    residual = decide.seed_free_noise(seeded)  # once: the same fit for every experiment's comparison
    for e in found.values():
        if e.config in means and e.parent in means and e.config != e.parent:
            # on paired seeds a plain difference of means carries the seeds' effects (every one-run experiment
            # ran on the champion's first seed): the comparison the rule made takes them out where it can
            comparison = decide.compare(seeded, e.config, e.parent, residual)
            e.effect = -comparison.diff if comparison else means[e.config] - means[e.parent]
    return list(found.values())


def made_from(repo: Path | None, rows) -> dict[str, str]:
    """The configuration each row's commit was made from (history's made_from); none without a repository."""
    return git.parent_blobs(repo, [r.commit for r in rows], state.EDITABLE) if repo else {}


def tokens_per_parameter(rows, config: str, source: str, profile: str) -> float | None:
    """Tokens a full run of `config` (a train.py blob; `source` its text) trained per parameter outside the
    embeddings: its runs' median steps times TOTAL_BATCH_SIZE over space.parameters. None without a finished
    full run or readable constants."""
    done = sorted(r.steps for r in decide.finished(rows) if r.key == config and r.steps > 0)
    try:
        values = read_constants(source, profile)
    except EditError:
        return None
    params, batch = parameters(values), values.get("TOTAL_BATCH_SIZE")
    if not done or not params or not isinstance(batch, int) or batch <= 0:
        return None
    return done[len(done) // 2] * batch / params


def size_direction(fit: float | None) -> str:
    """"down" (a smaller model), "up" (a larger one) or "" (about right, or unknown), judged by `fit`
    (tokens_per_parameter of the champion) against compute-optimal training."""
    if fit is not None and fit < TOKENS_PER_PARAM / FIT_BAND:
        return "down"
    if fit is not None and fit > TOKENS_PER_PARAM * FIT_BAND:
        return "up"
    return ""


def size_step(options: list, values: dict, fit: float) -> Move | None:
    """Among `options` (size moves from the champion, whose constants are `values`), the one whose parameter count
    comes nearest compute-optimal without passing it, else the smallest: at a fixed compute C ~ 6 N D, a model
    that sees `fit` tokens per parameter is sqrt(fit / TOKENS_PER_PARAM) times the compute-optimal size."""
    before = parameters(values)
    if not before or not fit or fit <= 0 or not options:
        return None
    want = 0.5 * math.log(fit / TOKENS_PER_PARAM)  # log of the factor on the parameters that would be optimal

    def share(m: Move) -> float:  # the part of the way to compute-optimal this move goes (1: all of it)
        after = parameters({**values, **{k: v for k, v in m.params.items() if k != "from"}})
        return math.log(after / before) / want if after and want else 0.0

    short = [m for m in options if 0 < share(m) <= 1]
    return max(short, key=share) if short else min(options, key=share)


def size_prior(move, fit: float | None) -> tuple[int, int]:
    """A move's prior, the model's size judged by `fit` (size_direction)."""
    toward = size_direction(fit)
    if not toward or move.arm not in SIZE_ARMS or move.direction not in ("up", "down"):
        return move.prior
    return PRIOR_TOWARDS if move.direction == toward else PRIOR_AWAY


# --- moves --------------------------------------------------------------------------------------------------------

@dataclass
class Move:
    arm: str
    params: dict
    source: str
    description: str
    prior: tuple[int, int] = PRIOR_NEUTRAL
    direction: str = ""  # a constant's: up or down
    fine: bool = False   # a constant's half step (offered once no full step is left and one failed: Researcher)
    coarse: bool = False  # a size constant's halving or doubling (offered toward the size the budget suits)


@functools.lru_cache(maxsize=8)
def moves(source: str, profile: str, seq_len: int) -> tuple[Move, ...]:
    """Every move from `source`: each applicable idea's variants but the one it holds, each constant's steps
    (cached: parallel workers propose from one champion; nothing may modify what it returns)."""
    out, sources = [], set()
    for idea in ideas.CATALOG:
        if not ideas.applicable(idea, source, profile):
            continue
        held = ideas.current(idea, source, profile)
        # a site no variant matches is rewritten whole: several ideas on it may give one train.py (the first
        # is kept), and the description says it changes more than it names
        whole = descriptions.WHOLE_SITE if ideas.site_of(idea, profile).read(source) is None else ""
        for params in ideas.variants(idea, profile):
            if params == held:
                continue
            try:
                new = ideas.apply(source, idea, params, profile)
            except EditError:
                continue
            if new in sources:
                continue
            sources.add(new)
            prior = PRIOR_NEUTRAL
            if idea.recommended is not None:
                prior = PRIOR_TOWARDS if params == idea.recommended else PRIOR_AWAY
            out.append(Move(idea.name, params, new, ideas.describe(idea, params) + whole, prior))
    values = read_constants(source, profile)
    for name, dist in SPACES[profile].items():
        if name not in values:
            continue
        size = f"tune {name}" in SIZE_ARMS
        for fine, coarse, offered in ((False, False, steps(dist, values[name])),
                                      (True, False, steps(dist, values[name], fine=True)),
                                      (False, True, size_steps(dist, values[name]) if size else [])):
            for value, direction in offered:
                changes = {name: value}
                changes.update(consequences(changes, values, seq_len))
                try:
                    new = set_constants(source, changes, profile)
                except EditError:
                    continue
                if new in sources:
                    continue
                sources.add(new)
                out.append(Move(f"tune {name}", {name: value, "from": values[name]}, new,
                                descriptions.constants_text((k, values.get(k), v) for k, v in changes.items()),
                                direction=direction, fine=fine, coarse=coarse))
    return tuple(out)


def _same_move(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "from"} == {k: v for k, v in b.items() if k != "from"}


class Proposer:
    """What the built-in proposers share: the ledger read afresh, the moves that are allowed."""
    name = ""

    def __init__(self, repo: Path, tag: str, profile: str, seq_len: int, seed: int = 0):
        self.repo, self.tag, self.profile, self.seq_len, self.seed = repo, tag, profile, seq_len, seed

    def propose(self, context: dict) -> str:
        """Edit train.py (the champion's, checked out) and return the description of the change."""
        path = self.repo / state.EDITABLE
        new_source, description = self.propose_source(path.read_text(errors="replace"), in_flight=context.get("in_flight", ()))
        path.write_text(new_source)
        return description

    def allowed(self, source: str, running: list[str] = (), in_flight: list[str] = ()) -> tuple[list[Move], list]:
        rows = self.rows = ledger.read(state.results(self.repo), self.tag)
        self.rng = random.Random(self.seed + len(rows) + len(running))
        past = history(rows, made_from(self.repo, rows))
        kept = decide.champion(rows)
        self.champion = kept.key if kept else ""  # what the branch holds (a parallel keep may end out of order)
        # every train.py the tag ran, a refused one included (a lasting refusal must not be proposed again)
        tried = {r.config for r in rows if r.config} | {e.config for e in past} | {git.blob_of(s) for s in running}
        crashed = [(e.arm, e.params) for e in past if e.outcome == "crash" and e.arm]
        busy = {parse_move(d)[0] for d in in_flight} - {""}
        found = [m for m in moves(source, self.profile, self.seq_len)
                 if git.blob_of(m.source) not in tried and m.arm not in busy
                 and not any(arm == m.arm and _same_move(p, m.params) for arm, p in crashed)]
        if not found:
            raise RuntimeError("the built-in proposer has no untried move left from this train.py")
        return found, past

    def observe(self, outcome) -> None:
        pass  # everything is read from results.tsv at the next proposal


class Researcher(Proposer):
    name = "builtin"

    def propose_source(self, source: str, running: list[str] = (), in_flight: list[str] = ()) -> tuple[str, str]:
        """A changed copy of `source` (the champion's train.py) and its description. running: the train.py of
        every run in flight; in_flight: their descriptions (their arms are not moved again now)."""
        found, past = self.allowed(source, running, in_flight)
        decided = [e for e in past if e.outcome != "open" and e.arm]
        champion = self.champion
        fit = tokens_per_parameter(self.rows, git.blob_of(source), source, self.profile)
        values = read_constants(source, self.profile)

        def same(e: Experiment, m: Move) -> bool:
            return e.arm == m.arm and _same_move(e.params, m.params)

        def tried_here(m: Move) -> bool:  # decided against the current champion
            return any(same(e, m) and e.parent == champion for e in decided)

        # 1. back to the public record's choice where the champion strayed from it: first, and once more after
        #    the champion changed (a repair that failed next to another broken place may pay once it is fixed)
        for m in found:
            if m.prior == PRIOR_TOWARDS and not tried_here(m) and sum(same(e, m) for e in decided) < RECORD_TRIES:
                return m.source, m.description
        # 2. a constant whose step was just kept, stepped again the same way
        kept = [e for e in past if e.outcome == "keep" and e.arm]
        if kept and kept[-1].arm.startswith("tune ") and "from" in kept[-1].params:
            last = kept[-1]
            name = last.arm.split(" ", 1)[1]
            way = "up" if _greater(last.params.get(name), last.params["from"]) else "down"
            again = [m for m in found if m.arm == last.arm and m.direction == way and not m.fine]
            # still far from the size the budget suits: the step nearest it (a halving again); else a full step
            move = ((last.arm in SIZE_ARMS and size_direction(fit) == way and size_step(again, values, fit))
                    or next((m for m in again if not m.coarse), None))
            if move:
                return move.source, move.description
        # 3. Thompson sampling over the arms, each belief its prior updated by the arm's decided experiments
        # a half step (a value between) once no full step of its constant is left to try from this champion
        # (run, or rebuilding the champion before it) and one failed against it
        full_left = {m.arm for m in found if not m.fine}
        failed_here = {e.arm for e in decided if e.parent == champion and e.outcome != "keep"}
        # a halving or doubling of the model's size, toward the size the budget suits where it is far from it
        toward = size_direction(fit)
        arms: dict[str, list[Move]] = {}
        for m in found:
            if m.coarse and m.direction != toward:
                continue
            if not m.fine or (m.arm not in full_left and m.arm in failed_here):
                arms.setdefault(m.arm, []).append(m)
        if not arms:
            raise RuntimeError("the built-in proposer has no untried move left from this train.py")
        # shrinking, the depth before the width: until a smaller DEPTH was tried against this champion, the width
        # arm's draw proposes the depth's step (on 8 fresh seeds at 15 s, DEPTH 4 -> 2 beat MODEL_DIM 128 -> 64 by
        # 0.026, 3 sigma: the narrow model keeps fewer heads, and the unembedding is most of its compute;
        # BENCHMARKS.md). In the parallel loop, while a smaller DEPTH is in flight the width waits for its outcome.
        def shrinks_depth(arm: str, params: dict) -> bool:
            return arm == "tune DEPTH" and _greater(params.get("from"), params.get("DEPTH"))

        width_waits = toward == "down" and not any(
            shrinks_depth(e.arm, e.params) and e.parent == champion for e in decided)
        depth_in_flight = len(arms) > 1 and any(shrinks_depth(*parse_move(d)) for d in in_flight)
        best, best_draw, depth = None, -1.0, None
        for arm in sorted(arms):  # "tune DEPTH" before "tune MODEL_DIM"
            options = [m for m in arms[arm] if not tried_here(m)] or arms[arm]
            favoured = [m for m in options if size_prior(m, fit) == PRIOR_TOWARDS]
            move = ((arm in SIZE_ARMS and size_step(favoured, values, fit))
                    or self.rng.choice(favoured or options))
            if arm == "tune DEPTH":
                depth = move
            elif width_waits and arm == "tune MODEL_DIM" and move.direction == "down":
                if depth_in_flight:
                    continue
                if depth and depth.direction == "down" and not tried_here(depth):
                    move = depth
            # an idea with a record's choice: moves away from it learn only from moves away (a kept repair
            # says nothing for breaking it again)
            keeps = fails = 0.0
            for e in decided:
                if e.arm != arm or (move.prior == PRIOR_AWAY and ideas.IDEAS[arm].recommended == e.params):
                    continue
                weight = 1.0 if e.parent == champion else OLD_FAILURE
                if e.outcome == "keep":
                    keeps += 1
                elif e.outcome == "discard" and e.effect is not None and e.effect < 0:
                    keeps, fails = keeps + 0.5, fails + 0.5 * weight  # better, but not surely
                else:
                    fails += weight
            prior = size_prior(move, fit)
            draw = self.rng.betavariate(prior[0] + keeps, prior[1] + fails)
            if draw > best_draw:
                best, best_draw = move, draw
        return best.source, best.description


def _greater(a, b) -> bool:
    try:
        return a > b
    except TypeError:
        return False


class RandomSearch(Proposer):
    """A move drawn uniformly: an arm, then one of its variants (the benchmark's reference arm), from the moves
    the researcher may make: its half steps left out (the reference's space as before them), its halvings and
    doublings where it has them (far from the size the budget suits, toward it)."""
    name = "random"

    def space(self, source: str, running: list[str] = (), in_flight: list[str] = ()) -> list[Move]:
        found, _ = self.allowed(source, running, in_flight)
        toward = size_direction(tokens_per_parameter(self.rows, git.blob_of(source), source, self.profile))
        return [m for m in found if not m.fine and (not m.coarse or m.direction == toward)] or found

    def propose_source(self, source: str, running: list[str] = (), in_flight: list[str] = ()) -> tuple[str, str]:
        found = self.space(source, running, in_flight)
        arm = self.rng.choice(sorted({m.arm for m in found}))
        move = self.rng.choice([m for m in found if m.arm == arm])
        return move.source, move.description


def builtin(spec: str, repo: Path, tag: str, profile: str, seq_len: int, seed: int = 0):
    """The built-in proposer named `spec` (BUILTINS), or None when spec names an external agent."""
    if spec not in BUILTINS:
        return None
    if spec == "tpe":
        from autoresearch.tpe import TPEProposer
        return TPEProposer(repo, tag, profile, seq_len, seed)
    return BUILTINS[spec](repo, tag, profile, seq_len, seed)


BUILTINS = {"builtin": Researcher, "random": RandomSearch, "tpe": None}


# --- what an agent or a person should know before proposing ------------------------------------------------------

def params_text(params: dict | None) -> str:
    if params is None:
        return "something no variant writes"
    return descriptions.assignments({k: v for k, v in params.items() if k != "from"})


def knowledge(rows, source: str, profile: str = "cpu", last: int = 40, command: bool = True,
              repo: Path | None = None) -> str:
    """What results.tsv says was tried (each experiment's move, outcome and effect) and what the catalog offers
    from `source`: the text `autoresearch ideas` prints and the external agent's prompt carries (command=False:
    the loop's agent runs no command, it edits train.py; repo: where each experiment's parent is read, history)."""
    past = [e for e in history(rows, made_from(repo, rows))
            if e.config and e.description and not descriptions.is_baseline(e.description)]
    lines = ["## Tried on this tag (results.tsv; effect: its mean val_bpb minus that of the champion it started "
             "from, negative is better)"]
    for e in past[-last:]:
        effect = "" if e.effect is None else f", effect {e.effect:+.4f}"
        lines.append(f"- {e.description}: {e.outcome}{effect} ({e.runs} run{'s' if e.runs != 1 else ''})")
    if not past:
        lines.append("- nothing yet")
    fit = tokens_per_parameter(rows, git.blob_of(source), source, profile)
    if fit is not None:
        lines.append(f"\n## The model's size for the budget\n- this train.py's runs trained {fit:.3g} tokens per "
                     f"parameter outside the embeddings (steps x TOTAL_BATCH_SIZE / 12 DEPTH MODEL_DIM^2); "
                     f"compute-optimal training sees about {TOKENS_PER_PARAM} (Hoffmann et al. 2022): "
                     + {"down": "a smaller model may use the budget better",
                        "up": "a larger model may use the budget better"}.get(size_direction(fit),
                                                                              "its size is about right for the budget"))
    how = ("`autoresearch ideas --apply NAME key=value` writes one into train.py" if command
           else "each a change to train.py")
    lines.append(f"\n## The idea catalog (autoresearch/ideas.py; {how}; describe it as `idea NAME: key=value`)")
    for idea in ideas.CATALOG:
        if not ideas.applicable(idea, source, profile):
            lines.append(f"- {idea.name}: its site is not in this train.py")
            continue
        tried = [e for e in past if e.arm == idea.name]
        record = (f"; tried {len(tried)}x, kept {sum(e.outcome == 'keep' for e in tried)}" if tried else "; untried")
        rec = f"; the record's choice: {params_text(idea.recommended)}" if idea.recommended else ""
        options = " | ".join(params_text(v) for v in ideas.variants(idea, profile))
        lines.append(f"- {idea.name} ({idea.why}): holds {params_text(ideas.current(idea, source, profile))}{rec}; "
                     f"variants {options}{record}")
    return "\n".join(lines)
