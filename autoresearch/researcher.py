"""The built-in proposers that move on the champion's train.py: the researcher (`--agent builtin`) and random
search (`--agent random`, the benchmark's reference), both over the moves of one space (moves).

The researcher: no language model, no network. Each proposal is one *move* on the
champion's train.py: an idea of the catalog (ideas.py) set to one of its variants, or one hyperparameter constant
halved or doubled (a step of a quarter of its range where it is not a scale, the neighbouring choice of a
categorical). Which move:

1. where the champion strayed from the public record's choice (ideas.Idea.recommended), the move back comes
   first, and once more after the champion changed;
2. a constant whose step was just kept is stepped again the same way (coordinate descent);
3. otherwise a Thompson draw per *arm* (an idea, or "tune NAME" for a constant): a Beta belief in "this move gets
   kept", its prior (PRIOR_*) plus one keep or one failure per decided experiment of the arm (half of each for a
   discard better than its champion but not surely; a failure against an earlier champion counts OLD_FAILURE).
   The model's size is judged by a principle, not by a result: a champion far from compute-optimal training
   (TOKENS_PER_PARAM, FIT_BAND) gets the prior of a move back to the record for a size move toward it, and
   there a size arm may also halve or double (the step nearest compute-optimal without passing it: size_step).
A failed move is tried again once the champion has changed; a constant outside its range steps back into it;
half steps are offered once no full step is left and one failed. Never a train.py the tag already ran, a variant
that crashed, or an arm a parallel worker is running now.
Random search draws moves uniformly from the same space. Both read results.tsv afresh for each proposal.
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass

from autoresearch import decide, descriptions, git, ideas, ledger, state
from autoresearch.proposer import (Experiment, SourceProposer, TOKENS_PER_PARAM, history, made_from, parse_move,
                                   size_direction, tokens_per_parameter)
from autoresearch.sites import EditError, read_constants, set_constants
from autoresearch.space import SIZE_ARMS, SPACES, consequences, parameters, size_steps, steps

PRIOR_TOWARDS = (4, 1)    # back to the public record's choice (tried first anyway, RECORD_TRIES; then by its record)
PRIOR_AWAY = (1, 4)       # away from it
PRIOR_NEUTRAL = (1, 2)    # no record either way; a constant's step
RECORD_TRIES = 2          # a move back to the record's choice: tried first, and once more after a keep
OLD_FAILURE = 0.5         # the weight of a failure against an earlier champion in an arm's belief


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


class MoveProposer(SourceProposer):
    """What the move proposers share: the ledger read afresh, the moves that are allowed."""

    def allowed(self, source: str, running=(), in_flight=()) -> tuple[list[Move], list]:
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


class Researcher(MoveProposer):
    name = "builtin"

    def propose_source(self, source: str, running: list[str] = (), in_flight: list[str] = ()) -> tuple[str, str]:
        """A changed copy of `source` (the champion's train.py) and its description. running: the train.py of
        every run in flight; in_flight: their descriptions (their arms are not moved again now)."""
        found, past = self.allowed(source, running, in_flight)
        decided = [e for e in past if e.outcome != "open" and e.arm]
        fit = tokens_per_parameter(self.rows, git.blob_of(source), source, self.profile)
        values = read_constants(source, self.profile)
        move = (self._back_to_record(found, decided) or self._step_again(found, past, fit, values)
                or self._draw(found, decided, fit, values))
        return move.source, move.description

    def _tried_here(self, m: Move, decided: list[Experiment]) -> bool:
        """Whether move m was decided against the current champion."""
        return any(e.arm == m.arm and _same_move(e.params, m.params) and e.parent == self.champion for e in decided)

    def _back_to_record(self, found: list[Move], decided: list[Experiment]) -> Move | None:
        """1. Back to the public record's choice where the champion strayed from it: first, and once more after
        the champion changed (a repair that failed next to another broken place may pay once it is fixed)."""
        for m in found:
            tries = sum(e.arm == m.arm and _same_move(e.params, m.params) for e in decided)
            if m.prior == PRIOR_TOWARDS and not self._tried_here(m, decided) and tries < RECORD_TRIES:
                return m
        return None

    def _step_again(self, found: list[Move], past: list[Experiment], fit, values: dict) -> Move | None:
        """2. A constant whose step was just kept, stepped again the same way; still far from the size the
        budget suits, the size step nearest it (a halving again), else a full step."""
        kept = [e for e in past if e.outcome == "keep" and e.arm]
        if not (kept and kept[-1].arm.startswith("tune ") and "from" in kept[-1].params):
            return None
        last = kept[-1]
        name = last.arm.split(" ", 1)[1]
        way = "up" if _greater(last.params.get(name), last.params["from"]) else "down"
        again = [m for m in found if m.arm == last.arm and m.direction == way and not m.fine]
        return ((last.arm in SIZE_ARMS and size_direction(fit) == way and size_step(again, values, fit))
                or next((m for m in again if not m.coarse), None))

    def _draw(self, found: list[Move], decided: list[Experiment], fit, values: dict) -> Move:
        """3. Thompson sampling over the arms, each belief its prior updated by the arm's decided experiments.
        A half step (a value between) once no full step of its constant is left to try from this champion and
        one failed against it; a halving or doubling of the model's size only toward the size the budget suits."""
        full_left = {m.arm for m in found if not m.fine}
        failed_here = {e.arm for e in decided if e.parent == self.champion and e.outcome != "keep"}
        toward = size_direction(fit)
        arms: dict[str, list[Move]] = {}
        for m in found:
            if m.coarse and m.direction != toward:
                continue
            if not m.fine or (m.arm not in full_left and m.arm in failed_here):
                arms.setdefault(m.arm, []).append(m)
        if not arms:
            raise RuntimeError("the built-in proposer has no untried move left from this train.py")
        best, best_draw = None, -1.0
        for arm in sorted(arms):
            options = [m for m in arms[arm] if not self._tried_here(m, decided)] or arms[arm]
            favoured = [m for m in options if size_prior(m, fit) == PRIOR_TOWARDS]
            move = ((arm in SIZE_ARMS and size_step(favoured, values, fit))
                    or self.rng.choice(favoured or options))
            prior, (keeps, fails) = size_prior(move, fit), self._belief(arm, move, decided)
            draw = self.rng.betavariate(prior[0] + keeps, prior[1] + fails)
            if draw > best_draw:
                best, best_draw = move, draw
        return best

    def _belief(self, arm: str, move: Move, decided: list[Experiment]) -> tuple[float, float]:
        """(keeps, failures) of the arm's decided experiments: a failure against an earlier champion counts
        OLD_FAILURE, a discard better than its champion but not surely half of each. An idea with a record's
        choice: moves away from it learn only from moves away (a kept repair says nothing for breaking it)."""
        keeps = fails = 0.0
        for e in decided:
            if e.arm != arm or (move.prior == PRIOR_AWAY and ideas.IDEAS[arm].recommended == e.params):
                continue
            weight = 1.0 if e.parent == self.champion else OLD_FAILURE
            if e.outcome == "keep":
                keeps += 1
            elif e.outcome == "discard" and e.effect is not None and e.effect < 0:
                keeps, fails = keeps + 0.5, fails + 0.5 * weight  # better, but not surely
            else:
                fails += weight
        return keeps, fails


def _greater(a, b) -> bool:
    try:
        return a > b
    except TypeError:
        return False


class RandomSearch(MoveProposer):
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
