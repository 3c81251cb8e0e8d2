"""The built-in proposer: no language model, no network. It changes a few hyperparameter constants of the best
kept train.py at a time, chosen by Optuna's TPE sampler (ask/tell) over a per-profile search space.

The study is rebuilt from results.tsv before every proposal: each configuration (one train.py, all its runs)
whose train.py is still in git becomes one trial valued at the mean val_bpb of its runs, so repeats sharpen
what TPE learns instead of counting the luckiest run, and restarts and other agents' experiments all inform it.
"""

from __future__ import annotations

import math
import random
import warnings
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from autoresearch import decide, git, ledger, state
from autoresearch.edit import EditError, read_constants, set_constants

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

LR_SPACE = {
    "MATRIX_LR": FloatDistribution(0.005, 0.2, log=True),
    "EMBEDDING_LR": FloatDistribution(0.05, 3.0, log=True),
    "UNEMBEDDING_LR": FloatDistribution(0.0005, 0.05, log=True),
    "SCALAR_LR": FloatDistribution(0.05, 3.0, log=True),
    "WEIGHT_DECAY": FloatDistribution(0.0, 0.4),
    "WARMUP_RATIO": FloatDistribution(0.0, 0.2),
    "WARMDOWN_RATIO": FloatDistribution(0.1, 0.9),
    "FINAL_LR_FRAC": FloatDistribution(0.0, 0.3),
}
SPACES = {
    "cpu": {
        "DEPTH": IntDistribution(2, 8),
        "MODEL_DIM": CategoricalDistribution([64, 96, 128, 160, 192, 256]),
        "TOTAL_BATCH_SIZE": CategoricalDistribution([1024, 2048, 4096, 8192, 16384]),
        "WINDOW_PATTERN": CategoricalDistribution(["L", "SL", "SSL", "SSSL"]),
        **LR_SPACE,
    },
    "gpu": {
        "DEPTH": IntDistribution(4, 16),
        "MODEL_DIM": CategoricalDistribution([256, 384, 512, 640, 768, 1024]),
        "TOTAL_BATCH_SIZE": CategoricalDistribution([2**17, 2**18, 2**19, 2**20]),
        "WINDOW_PATTERN": CategoricalDistribution(["L", "SL", "SSL", "SSSL"]),
        **LR_SPACE,
    },
}
MAX_CHANGES = 2  # constants changed per proposal: small steps keep each result readable


def _round(value):
    if isinstance(value, float) and value != 0:
        return float(f"{value:.3g}")
    return value


def _in_space(dist, value) -> bool:
    """Whether value is one the distribution can hold (an agent may have set anything)."""
    if isinstance(dist, CategoricalDistribution):
        return value in dist.choices
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not dist.low <= value <= dist.high:
        return False
    return not (isinstance(dist, IntDistribution) and value != int(value))


class BuiltinProposer:
    name = "builtin"

    def __init__(self, repo: Path, tag: str, profile: str, seq_len: int, seed: int = 0):
        self.repo, self.tag, self.profile, self.seq_len = repo, tag, profile, seq_len
        self.space = SPACES[profile]
        self.seed = seed
        self.sources: dict[str, str | None] = {}  # commit -> its train.py (None: gone from git)

    def _rows(self) -> list[ledger.Row]:
        return ledger.read(state.results(self.repo), self.tag)

    def _params_of(self, source: str) -> dict:
        values = read_constants(source, self.profile)
        return {k: values[k] for k in self.space if k in values and _in_space(self.space[k], values[k])}

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

    def propose(self, context: dict) -> str:
        """Edit train.py (the best kept version, checked out) and return a description of the change."""
        path = self.repo / "train.py"
        new_source, description = self.propose_source(path.read_text())
        path.write_text(new_source)
        return description

    def propose_source(self, source: str, running: list[str] = ()) -> tuple[str, str]:
        """A changed copy of `source` (the champion's train.py) and its description; `running`: see sync."""
        self.sync(running)
        current = read_constants(source, self.profile)
        base = self._params_of(source)
        tried = [t.params for t in self.study.get_trials(deepcopy=False) if "config" in t.user_attrs]
        for _ in range(50):
            trial = self.study.ask(self.space)
            sampled = {k: _round(v) for k, v in trial.params.items()}
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)  # only configurations that ran count
            # TPE's values for one or two constants picked at random (picking the ones TPE moved furthest
            # favours constants whose default sits at the edge of the range, e.g. WEIGHT_DECAY 0.0)
            movable = sorted(k for k, v in sampled.items() if k in base and v != base[k])
            if not movable:
                continue
            chosen = self.rng.sample(movable, min(len(movable), self.rng.randint(1, MAX_CHANGES)))
            changes = {k: sampled[k] for k in chosen}
            changes.update(self._consequences(changes, current))
            candidate = dict(base, **{k: v for k, v in changes.items() if k in self.space})
            if candidate in tried:
                continue
            try:
                new_source = set_constants(source, changes, self.profile)
                compile(new_source, "train.py", "exec")
            except (EditError, SyntaxError):
                continue
            return new_source, ", ".join(f"{k} {current[k]!r} -> {v!r}" for k, v in changes.items())
        raise RuntimeError("the built-in proposer found no untried configuration in 50 attempts")

    def _consequences(self, changes: dict, current: dict) -> dict:
        """Other constants that must follow, so that train.py's own checks hold."""
        extra = {}
        dim = changes.get("MODEL_DIM", current.get("MODEL_DIM"))
        head = current.get("HEAD_DIM")
        if head and dim % head:
            extra["HEAD_DIM"] = math.gcd(dim, head)
        total = changes.get("TOTAL_BATCH_SIZE")
        if total is not None:
            rows = max(1, total // self.seq_len)
            device = min(current.get("DEVICE_BATCH_SIZE", rows), rows)
            while rows % device:
                device -= 1
            if device != current.get("DEVICE_BATCH_SIZE"):
                extra["DEVICE_BATCH_SIZE"] = device
        return extra

    def observe(self, outcome) -> None:
        self.sync()
