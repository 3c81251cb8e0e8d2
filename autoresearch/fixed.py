"""The fixed half (prepare.py, runtime.py and the prepared data) as the harness sees it: its fingerprint, the
budget and clock it sets, the clean copy every run and evaluation uses, and the result file a training must leave.

The harness imports its own prepare.py and runtime.py once, at the CLI's start (`contract()`, `runtime()`); a
run's working tree may hold edited ones, which is why the fingerprint hashes the files themselves and the
evaluator gets the tag's committed copies (clean_sources), never the working tree's.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from autoresearch import git, sandbox, state
from autoresearch.errors import HarnessError
from autoresearch.evaluator import safe_read, scoring
from autoresearch.tagconfig import Tag


# what the harness reads of runtime.py
RUNTIME = ("STEP_RE", "FAST_FAIL", "step_line", "run_seed", "check_loss", "COMPILE_ONLY_ENV", "PEAK_FILE")


def contract():
    """The harness's own prepare.py (the installed one, imported once at the CLI's start)."""
    import prepare
    return prepare


def runtime():
    """The harness's own runtime.py: the step line, FAST_FAIL, the budget and its clock."""
    import runtime
    return runtime


def check_contract() -> None:
    """A clear error when the imported runtime.py lacks what the harness reads from it."""
    missing = [name for name in RUNTIME if name not in vars(runtime())]
    if missing:
        raise HarnessError(f"{runtime().__file__} has no {', '.join(missing)}: it is older than this harness. Start "
                           "a new tag from main (`git checkout main && autoresearch setup --tag NEWTAG`), or continue "
                           "this one with the harness of its time (`pip install -e .` at the tag's base commit).")


def fingerprint(repo: Path, root: Path | None = None, full: bool = True) -> str:
    """The fingerprint of the fixed half as this repository has it: every file of state.FIXED it holds, and the
    prepared data's manifest less its timestamp (preparing the same data again gives the same fingerprint). With
    full, every data file is checked against its sha256 first (seconds for the gpu profile's shards)."""
    prepare = contract()
    root = root or prepare.cache_dir()
    try:
        manifest = prepare.load_manifest(root)
    except prepare.PrepareError as e:
        raise HarnessError(str(e)) from None
    if manifest is None:
        raise HarnessError(f"No prepared data in {root}; run `python prepare.py` first.")
    problems = verify(manifest, root, full=full)
    if problems:
        raise HarnessError("The prepared data changed since it was prepared (" + "; ".join(problems[:3]) +
                           "). Run `python prepare.py --force` to prepare it again.")
    content = json.dumps({k: v for k, v in manifest.items() if k != "created"}, sort_keys=True).encode()
    present = [name for name in state.FIXED if (repo / name).exists()]
    if present == ["prepare.py"]:  # a branch from before runtime.py: its tags' fingerprints, as they were made
        source = (repo / "prepare.py").read_bytes()
        return hashlib.sha256(hashlib.sha256(source + content).hexdigest().encode() + source).hexdigest()
    h = hashlib.sha256()
    for name in present:
        h.update(name.encode() + b"\0" + (repo / name).read_bytes() + b"\0")
    return hashlib.sha256(h.digest() + content).hexdigest()


def budget() -> float:
    """The time budget this process runs under (AUTORESEARCH_TIME_BUDGET, else the default)."""
    return _setting("time_budget")


def clock() -> str:
    """The budget's clock, wall or cpu (AUTORESEARCH_BUDGET_CLOCK)."""
    return _setting("budget_clock_kind")


def _setting(name: str):
    module = runtime()
    try:
        return getattr(module, name)()
    except module.PrepareError as e:
        raise HarnessError(str(e)) from None


def committed_digests(repo: Path, commit: str = "HEAD") -> dict[str, str]:
    """The sha256 of every file of state.FIXED at commit: what a tag records at setup."""
    return {name: hashlib.sha256(source).hexdigest() for name, source in _committed(repo, commit).items()}


def _committed(repo: Path, commit: str) -> dict[str, bytes]:
    names = git.git(repo, "ls-tree", "--name-only", commit, "--", *state.FIXED).split()
    return {name: git.git(repo, "show", f"{commit}:{name}", strip=False).encode() for name in names}


def clean_sources(repo: Path, config: Tag) -> dict[str, bytes]:
    """The fixed files as committed when the tag was set up (a tag from before runtime.py: prepare.py alone):
    what every run and evaluation of the tag uses, never the working tree's."""
    digests = config.fixed_sha256 or {"prepare.py": config.prepare_sha256}
    sources = _committed(repo, config.base_commit)
    if {n: hashlib.sha256(s).hexdigest() for n, s in sources.items() if n in digests} != digests:
        raise HarnessError("the fixed files in git at the tag's base commit are not the ones the tag was set up "
                           "with; the repository was rewritten. Start a new tag.")
    return {name: sources[name] for name in digests}


def write_sources(sources: dict[str, bytes], directory: Path) -> None:
    """The fixed files into a fresh directory, where a clean process imports them."""
    for name, source in sources.items():
        (directory / name).write_bytes(source)


@dataclass
class FixedHalf:
    """What every run of a tag evaluates with, read before a run starts."""
    sources: dict      # file name -> bytes, as committed at the tag's base commit (clean_sources)
    cache: Path
    manifest: dict


def of_tag(repo: Path, config: Tag) -> FixedHalf:
    prepare = contract()
    return FixedHalf(clean_sources(repo, config), prepare.cache_dir(), prepare.require_manifest())


def contract_files() -> tuple[str, ...]:
    """The files a training leaves in out/: its result and its exported model."""
    prepare = contract()
    return prepare.RESULT_FILE, prepare.GRAPH_FILE, prepare.TENSORS_FILE


# The keys of result.json the harness reads beyond prepare.RESULT_SCHEMA's, where present (absent or null: not
# given), and their types: every value the harness reads from the file is checked here, before anything uses it
# (an export_error of 1 made the harness itself fail after the training, and the run was redrawn on its seed).
OPTIONAL_RESULT = {"export_error": str, "val_bpb": (int, float), "compile_seconds": (int, float), "data_seed": int,
                   "tokens_per_second": (int, float)}
NUMBER_LIMIT = 1e15  # no number a run reports is near it; a JSON integer of 400 digits made formatting it fail
DTYPES = tuple(scoring.CHECK_TOLERANCE)  # what a run may say it computed in: the dtypes the evaluator scores


def check_result(result) -> list[str]:
    """What is wrong with a result.json's contents against prepare.RESULT_SCHEMA and OPTIONAL_RESULT (empty if
    nothing)."""
    if not isinstance(result, dict):
        return ["result.json does not hold an object"]
    problems = []
    for key, types in [*contract().RESULT_SCHEMA.items(), *OPTIONAL_RESULT.items()]:
        value = result.get(key)
        if value is None:
            if key not in OPTIONAL_RESULT:
                problems.append(f"no {key}")
        elif isinstance(value, bool) or not isinstance(value, types):
            problems.append(f"{key}={ascii(value)[:80]} is not of type {getattr(types, '__name__', 'number')}")
        elif isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
            problems.append(f"{key}={value!r} is not finite")
        elif isinstance(value, (int, float)) and not abs(value) < NUMBER_LIMIT:
            problems.append(f"{key}={ascii(value)[:80]} is beyond {NUMBER_LIMIT:g}")
    if isinstance(result.get("dtype"), str) and result["dtype"] not in DTYPES:
        problems.append(f"dtype={ascii(result['dtype'])[:80]} is none of {', '.join(DTYPES)}")
    return problems


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
    problems = check_result(result)
    if problems:
        return None, "result.json: " + "; ".join(problems[:4])
    return result, ""


# --- the data's checksums -----------------------------------------------------------------------------------------
# The prepared data's checksums: a file's sha256, and which of the manifest's files are missing or changed.
# Written by data.py when it prepares, checked by fixed.py before and after every run.

def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(manifest: dict, root: Path, full: bool = True) -> list[str]:
    """Problems with the prepared files: missing, wrong size, or (full) wrong sha256."""
    problems = []
    for rel, info in manifest["files"].items():
        f = root / rel
        if not f.is_file():
            problems.append(f"{rel} is missing")
        elif f.stat().st_size != info["bytes"]:
            problems.append(f"{rel} has {f.stat().st_size} bytes, expected {info['bytes']}")
        elif full and sha256_file(f) != info["sha256"]:
            problems.append(f"{rel} does not match its checksum")
    return problems
