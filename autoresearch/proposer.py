"""What every proposer is (`Proposer`: anything that proposes the next experiment, an edit of train.py and its
description, asked with an `Ask`, the runs in flight beside it; `SourceProposer`: a built-in one, a function of
the champion's train.py and the ledger), what the ledger says about moves (history: each experiment's move,
outcome and effect), the model's size judged against compute-optimal training (tokens_per_parameter), what an
agent or a person reads before proposing (knowledge), and `--agent tpe` (TPEProposer: constants only, Optuna).
The researcher and random search: researcher.py.
"""

from __future__ import annotations

import random
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import optuna  # space.py's distributions import it anyway

from autoresearch import decide, descriptions, git, ideas, ledger, state
from autoresearch.sites import NOT_A_VALUE, EditError, literal, read_constants, set_constants
from autoresearch.space import SPACES, consequences, in_space, parameters, rounded

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

TOKENS_PER_PARAM = 20     # compute-optimal training sees about 20 tokens per parameter (Hoffmann et al. 2022)
FIT_BAND = 8              # more than this factor off it (the model sqrt(8) ~ 2.8x off its compute-optimal size, past
                          # the flat bottom of Hoffmann et al.'s IsoFLOP curves): size moves toward it are favoured


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
    new, old = literal(new), literal(old)
    if NOT_A_VALUE in (new, old):
        return f"tune {name}", {}
    return f"tune {name}", {name: new, "from": old}


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





@dataclass(frozen=True)
class Ask:
    """What a proposer is asked with: the train.py of each run in flight beside it and their descriptions (the
    parallel loop's; none in the sequential loop). Their sources are not proposed again, their arms not moved now."""
    running: tuple[str, ...] = ()
    in_flight: tuple[str, ...] = ()


class Proposer(ABC):
    """Anything that proposes the next experiment: the built-in proposers (researcher.py, TPEProposer) and an external agent
    (agents.ExternalAgent). propose() leaves the change in `workdir`'s train.py and returns its description."""
    name = ""
    workdir: Path

    @abstractmethod
    def propose(self, ask: Ask = Ask()) -> str:
        ...

    def observe(self, outcome) -> None:
        """Told each decided experiment's outcome (run.Outcome); the built-in proposers read results.tsv instead."""


class SourceProposer(Proposer):
    """A built-in proposer: a function of the champion's train.py and the tag's ledger (propose_source)."""

    def __init__(self, repo: Path, tag: str, profile: str, seq_len: int, seed: int = 0):
        self.repo, self.tag, self.profile, self.seq_len, self.seed = repo, tag, profile, seq_len, seed
        self.workdir = repo

    def propose(self, ask: Ask = Ask()) -> str:
        path = self.workdir / state.EDITABLE
        new_source, description = self.propose_source(path.read_text(errors="replace"), ask.running, ask.in_flight)
        path.write_text(new_source)
        return description

    @abstractmethod
    def propose_source(self, source: str, running=(), in_flight=()) -> tuple[str, str]:
        """A changed copy of `source` (the champion's train.py) and its description (Ask: running, in_flight)."""



MAX_CHANGES = 2  # constants changed per proposal: small steps keep each result readable


class TPEProposer(SourceProposer):
    """`--agent tpe`, the proposer before the researcher (and an arm of benchmarks/research.py): one or two
    constants of the champion's train.py changed at a time, chosen by Optuna's TPE sampler (ask/tell) over the
    profile's space (space.py). The study is rebuilt from results.tsv before every proposal: each configuration
    whose train.py is still in git is one trial valued at the mean val_bpb of its runs, so repeats sharpen what
    TPE learns instead of counting the luckiest run."""
    name = "tpe"

    def __init__(self, repo: Path, tag: str, profile: str, seq_len: int, seed: int = 0):
        super().__init__(repo, tag, profile, seq_len, seed)
        self.space = SPACES[profile]
        self.sources: dict[str, str | None] = {}  # commit -> its train.py (None: gone from git)

    def _rows(self) -> list[ledger.Row]:
        return ledger.read(state.results(self.repo), self.tag)

    def _params_of(self, source: str) -> dict:
        values = read_constants(source, self.profile)
        return {k: values[k] for k in self.space if k in values and in_space(self.space[k], values[k])}

    def _source(self, commit: str) -> str | None:
        if commit not in self.sources:
            try:
                self.sources[commit] = git.git(self.repo, "show", f"{commit}:train.py")
            except git.GitError:
                self.sources[commit] = None  # the commit is gone (garbage-collected): nothing to learn from
        return self.sources[commit]

    def sync(self, running: list[str] = ()) -> None:
        """A fresh study holding every recorded configuration as one trial: the mean of its runs, or a failed
        trial when it never finished a run (it crashed). `running`: the train.py sources parallel workers are
        running now, as running trials: with constant_liar TPE counts them as bad results, so that proposals made
        side by side differ instead of piling onto one promising region."""
        rows = self._rows()
        self.study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(
            seed=self.seed + len(rows) + len(running), n_startup_trials=5, multivariate=True, constant_liar=True))
        self.rng = random.Random(self.seed + len(rows))
        means = {k: sum(v) / len(v) for k, v in decide.samples(rows).items()}
        seen = set()
        for row in rows:
            key = row.key
            if key in seen or row.status == "refused":
                continue
            source = self._source(row.commit)
            if source is None:
                continue
            if key not in means and not any(r.key == key and r.status == "crash"
                                            and not decide.is_interruption(r) for r in rows):
                continue  # only refused or interrupted so far: nothing learned about it
            seen.add(key)
            params = self._params_of(source)
            trial = optuna.trial.create_trial(
                params=params, distributions={k: self.space[k] for k in params}, value=means.get(key),
                state=optuna.trial.TrialState.COMPLETE if key in means else optuna.trial.TrialState.FAIL,
                user_attrs={"config": key, "description": row.description})
            self.study.add_trial(trial)
        for i, source in enumerate(running):
            params = self._params_of(source)
            self.study.add_trial(optuna.trial.create_trial(
                params=params, distributions={k: self.space[k] for k in params},
                state=optuna.trial.TrialState.RUNNING, user_attrs={"config": f"running-{i}"}))

    def propose_source(self, source: str, running: list[str] = (), in_flight: list[str] = ()) -> tuple[str, str]:
        """A changed copy of `source` (the champion's train.py) and its description; `running`: see sync."""
        self.sync(running)
        current = read_constants(source, self.profile)
        base = self._params_of(source)
        tried = [t.params for t in self.study.get_trials(deepcopy=False) if "config" in t.user_attrs]
        for _ in range(50):
            trial = self.study.ask(self.space)
            sampled = {k: rounded(v) for k, v in trial.params.items()}
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)  # only configurations that ran count
            # TPE's values for one or two constants picked at random (picking the ones TPE moved furthest
            # favours constants whose default sits at the edge of the range, e.g. WEIGHT_DECAY 0.0)
            movable = sorted(k for k, v in sampled.items() if k in base and v != base[k])
            if not movable:
                continue
            chosen = self.rng.sample(movable, min(len(movable), self.rng.randint(1, MAX_CHANGES)))
            changes = {k: sampled[k] for k in chosen}
            changes.update(consequences(changes, current, self.seq_len))
            candidate = dict(base, **{k: v for k, v in changes.items() if k in self.space})
            if candidate in tried:
                continue
            try:
                new_source = set_constants(source, changes, self.profile)
                compile(new_source, "train.py", "exec")
            except (EditError, SyntaxError):
                continue
            return new_source, descriptions.constants_text((k, current[k], v) for k, v in changes.items())
        raise RuntimeError("the built-in proposer found no untried configuration in 50 attempts")




BUILTINS = ("builtin", "random", "tpe")  # the proposers `--agent NAME` names without a command (agents.proposer_for)


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
