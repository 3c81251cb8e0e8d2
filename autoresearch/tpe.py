"""Today's proposer before the researcher (kept as `--agent tpe`, and as an arm of benchmarks/research.py): it
changes one or two hyperparameter constants of the best kept train.py at a time, chosen by Optuna's TPE sampler
(ask/tell) over a per-profile search space (space.py).

The study is rebuilt from results.tsv before every proposal: each configuration (one train.py, all its runs)
whose train.py is still in git becomes one trial valued at the mean val_bpb of its runs, so repeats sharpen
what TPE learns instead of counting the luckiest run, and restarts and other agents' experiments all inform it.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import optuna

from autoresearch import decide, descriptions, git, ledger, state
from autoresearch.proposer import SourceProposer
from autoresearch.sites import EditError, read_constants, set_constants
from autoresearch.space import SPACES, consequences, in_space, rounded

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

MAX_CHANGES = 2  # constants changed per proposal: small steps keep each result readable


class TPEProposer(SourceProposer):
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
