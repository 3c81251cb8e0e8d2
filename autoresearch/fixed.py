"""The fixed half (prepare.py and the prepared data) as the harness sees it: its fingerprint, the budget and
clock it sets, the clean copy every evaluation uses, and the result file a training must leave.

The harness imports its own prepare.py once, at the CLI's start (`contract()`); a run's working tree may hold
an edited one, which is why the fingerprint hashes the file itself and the evaluator gets the tag's committed
copy (clean_prepare), never the working tree's.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from autoresearch import git, sandbox
from autoresearch.errors import HarnessError
from autoresearch.evaluator import safe_read


RUNTIME = ("STEP_RE", "FAST_FAIL", "step_line", "run_seed", "check_loss")  # what the harness reads of it


def contract():
    """The harness's own copy of the fixed half (the installed one, imported once at the CLI's start)."""
    import prepare
    return prepare


def check_contract() -> None:
    """A clear error when the imported prepare.py predates what the harness reads from it (an experiment branch
    set up before the runtime moved into prepare.py, checked out under a newer harness)."""
    prepare = contract()
    missing = [name for name in RUNTIME if name not in vars(prepare)]
    if missing:
        raise HarnessError(f"{prepare.__file__} has no {', '.join(missing)}: it is older than this harness (the tag "
                           "was set up before train.py's runtime moved into prepare.py). Start a new tag from main "
                           "(`git checkout main && autoresearch setup --tag NEWTAG`), or continue this one with the "
                           "harness of its time (`pip install -e .` at the tag's base commit).")


def fingerprint(repo: Path) -> str:
    """The fingerprint of the fixed half as this repository has it (its own prepare.py, the prepared data, every
    data file checked by sha256). prepare.py is also hashed here, so an edited fingerprint() cannot vouch for
    itself."""
    prepare = contract()
    try:
        digest = prepare.fingerprint(prepare_path=repo / "prepare.py", full=True)
    except prepare.PrepareError as e:
        raise HarnessError(str(e)) from None
    return hashlib.sha256(digest.encode() + (repo / "prepare.py").read_bytes()).hexdigest()


def budget() -> float:
    """The time budget this process runs under (AUTORESEARCH_TIME_BUDGET, else the default)."""
    return _setting("time_budget")


def clock() -> str:
    """The budget's clock, wall or cpu (AUTORESEARCH_BUDGET_CLOCK)."""
    return _setting("budget_clock_kind")


def _setting(name: str):
    prepare = contract()
    try:
        return getattr(prepare, name)()
    except prepare.PrepareError as e:
        raise HarnessError(str(e)) from None


def clean_prepare(repo: Path, config: dict) -> bytes:
    """prepare.py as committed when the tag was set up: the evaluator's copy, never the working tree's."""
    source = git.git(repo, "show", f"{config['base_commit']}:prepare.py", strip=False).encode()
    if hashlib.sha256(source).hexdigest() != config["prepare_sha256"]:
        raise HarnessError("prepare.py in git at the tag's base commit is not the one the tag was set up with; "
                           "the repository was rewritten. Start a new tag.")
    return source


@dataclass
class FixedHalf:
    """What every run of a tag evaluates with, read before a run starts."""
    source: bytes      # prepare.py as committed at the tag's base commit
    cache: Path
    manifest: dict


def of_tag(repo: Path, config: dict) -> FixedHalf:
    prepare = contract()
    return FixedHalf(clean_prepare(repo, config), prepare.cache_dir(), prepare.require_manifest())


def contract_files() -> tuple[str, ...]:
    """The files a training leaves in out/: its result and its exported model."""
    prepare = contract()
    return prepare.RESULT_FILE, prepare.GRAPH_FILE, prepare.TENSORS_FILE


def read_result(run_dir: Path) -> tuple[dict | None, str]:
    """The run's result.json, checked against the contract's schema. (result, problem)."""
    prepare = contract()
    path = run_dir / sandbox.OUT_DIR / prepare.RESULT_FILE
    try:
        result = json.loads(safe_read.read_regular(path, safe_read.RESULT_LIMIT))
    except FileNotFoundError:
        return None, "no result.json (train.py must end with prepare.finish)"
    except safe_read.Unsafe as e:
        return None, str(e)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        return None, f"result.json is not valid JSON ({e})"
    problems = prepare.check_result(result)
    if problems:
        return None, "result.json: " + "; ".join(problems[:4])
    return result, ""
