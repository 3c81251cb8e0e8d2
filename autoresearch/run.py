"""One experiment, end to end: check, commit, train under a hard timeout, record, keep or discard.

State lives in three places, each safe against a kill at any moment:
- results.tsv (ledger.py): append-only rows, the record of truth;
- .autoresearch/tags/<tag>.json: written once by setup (fingerprint, budget, base commit);
- .autoresearch/pending.json: written before a run starts and removed after its row is recorded. Finding it
  later means the harness died mid-run: recover() records the crash (unless the row made it) and puts the
  branch back on the last kept commit.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from autoresearch import git, ledger

STATE_DIR = ".autoresearch"
BRANCH_PREFIX = "autoresearch/"
EDITABLE = "train.py"
TIMEOUT_MARGIN = 120  # seconds on top of twice the budget, for startup, compilation and evaluation
FINAL_LINE = re.compile(r"^val_bpb=([0-9.]+) \| memory_gb=([0-9.]+) \| steps=(\d+)\s*$", re.M)


class HarnessError(RuntimeError):
    """A problem the user can fix; the message says how."""


@dataclass
class Outcome:
    row: ledger.Row
    best_before: float | None
    log_tail: str
    run_dir: Path
    result: dict | None


# --- the repository and its tag ------------------------------------------------------


def repo_root(start: Path | None = None) -> Path:
    try:
        root = git.toplevel(start or Path.cwd())
    except git.GitError as e:
        raise HarnessError(str(e)) from None
    for name in ("train.py", "prepare.py"):
        if not (root / name).exists():
            raise HarnessError(f"{root} has no {name}: run autoresearch from the autoresearch repository.")
    return root


def state_dir(repo: Path) -> Path:
    return repo / STATE_DIR


def _atomic_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def fixed_fingerprint(repo: Path) -> str:
    """The fingerprint of the fixed half as this repository has it (its own prepare.py, the prepared data).
    prepare.py is also hashed here, so an edited fingerprint() cannot vouch for itself."""
    import hashlib

    import prepare
    try:
        digest = prepare.fingerprint(prepare_path=repo / "prepare.py")
    except prepare.PrepareError as e:
        raise HarnessError(str(e)) from None
    return hashlib.sha256(digest.encode() + (repo / "prepare.py").read_bytes()).hexdigest()


def current_budget() -> float:
    import prepare
    try:
        return prepare.time_budget()
    except prepare.PrepareError as e:
        raise HarnessError(str(e)) from None


def setup(repo: Path, tag: str) -> dict:
    if not re.fullmatch(r"[A-Za-z0-9._-]+", tag):
        raise HarnessError(f"Tag {tag!r}: use letters, digits, '.', '_' or '-' (for example `mar5`).")
    name = BRANCH_PREFIX + tag
    if git.branch_exists(repo, name):
        raise HarnessError(f"Branch {name} already exists. Pick a new tag, or continue that one with "
                           f"`git checkout {name}`.")
    dirty = [p for p in git.changed_files(repo)]
    if dirty:
        raise HarnessError("Uncommitted changes: " + ", ".join(dirty[:5]) + ". Commit or stash them first, so the "
                           "baseline is exactly the committed train.py.")
    fingerprint = fixed_fingerprint(repo)
    config = {"tag": tag, "branch": name, "fingerprint": fingerprint, "budget_s": current_budget(),
              "base_commit": git.head(repo), "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
    git.git(repo, "checkout", "-q", "-b", name)
    _atomic_json(state_dir(repo) / "tags" / f"{tag}.json", config)
    ledger.create(repo / "results.tsv")
    return config


def load_tag(repo: Path) -> dict:
    name = git.branch(repo)
    if not name.startswith(BRANCH_PREFIX):
        raise HarnessError(f"On branch {name!r}, not an experiment branch. Start one with "
                           f"`autoresearch setup --tag TAG`, or `git checkout autoresearch/TAG` to continue one.")
    tag = name[len(BRANCH_PREFIX):]
    path = state_dir(repo) / "tags" / f"{tag}.json"
    if not path.exists():
        raise HarnessError(f"No record of tag {tag!r} in {path}. Run `autoresearch setup --tag NEWTAG` "
                           "from the commit you want as baseline.")
    ledger.check_header(repo / "results.tsv")
    return json.loads(path.read_text())


def last_kept_commit(repo: Path, config: dict, rows: list[ledger.Row]) -> str:
    kept = [r for r in rows if r.status == "keep"]
    return git.git(repo, "rev-parse", kept[-1].commit) if kept else config["base_commit"]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def _row(config, commit, description, run_id, status, val_bpb=0.0, memory_gb=0.0, steps=0, wall=0.0, seed=0):
    return ledger.Row(commit=commit[:7], val_bpb=val_bpb, memory_gb=memory_gb, status=status,
                      description=description, tag=config["tag"], run_id=run_id, time=_now(),
                      budget_s=config["budget_s"], steps=steps, wall_s=wall,
                      fingerprint=config["fingerprint"][:12], seed=seed)

# --- recovery -----------------------------------------------------------------------------


def _kill_group(pgid: int, grace: float = 5.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left (grandchildren that ignore SIGTERM too)."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.time() + grace
    while time.time() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def recover(repo: Path, log=print, reason: str = "harness died mid-run") -> ledger.Row | None:
    """Finish an experiment whose harness died: kill its training, record it as a crash unless its row was
    recorded, and put the branch back on the last kept commit. Returns the row it recorded, if any."""
    pending_path = state_dir(repo) / "pending.json"
    if not pending_path.exists():
        return None
    pending = json.loads(pending_path.read_text())
    if pending.get("pgid"):
        _kill_group(pending["pgid"])
    config = json.loads((state_dir(repo) / "tags" / f"{pending['tag']}.json").read_text())
    rows = ledger.read(repo / "results.tsv", config["tag"])
    row = None
    if not any(r.run_id == pending["run_id"] for r in rows):
        row = _row(config, pending["commit"], f"{pending['description']} [interrupted: {reason}]",
                   pending["run_id"], "crash", seed=pending.get("seed", 0))
        ledger.append(repo / "results.tsv", row)
        rows.append(row)
        log(f"recovered an interrupted experiment ({pending['run_id']}): recorded as crash")
    if git.branch(repo) == config["branch"]:
        target = last_kept_commit(repo, config, rows)
        if git.head(repo) != target:
            git.reset_hard(repo, target)
    pending_path.unlink()
    return row

# --- running one experiment -------------------------------------------------------------


def _tail(path: Path, n: int = 50) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def _progress_seconds(log_path: Path) -> float | None:
    """Training seconds elapsed according to the newest `elapsed=` in the log."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            found = re.findall(rb"elapsed=(\d+)s", f.read())
        return float(found[-1]) if found else None
    except OSError:
        return None


def train(repo: Path, run_dir: Path, seed: int, timeout: float, pending: dict, pending_path: Path,
          on_progress=None) -> tuple[int | None, bool]:
    """Run train.py in its own process group with output to run_dir/run.log. Returns (exit code, timed out)."""
    env = dict(os.environ, AUTORESEARCH_RUN_DIR=str(run_dir), AUTORESEARCH_SEED=str(seed), PYTHONUNBUFFERED="1")
    log_path = run_dir / "run.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen([sys.executable, EDITABLE], cwd=repo, env=env, stdout=log_file,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    pending["pgid"] = proc.pid
    _atomic_json(pending_path, pending)
    start = time.time()
    timed_out = False
    try:
        while proc.poll() is None:
            if time.time() - start > timeout:
                timed_out = True
                break
            if on_progress:
                on_progress(_progress_seconds(log_path))
            time.sleep(0.2)
    finally:
        _kill_group(proc.pid, grace=0 if proc.poll() is not None else 5.0)  # leftovers and grandchildren too
        proc.wait()
    return (None if timed_out else proc.returncode), timed_out


def read_result(run_dir: Path, log_text: str) -> tuple[dict | None, str]:
    """The run's result.json, cross-checked with the final val_bpb= line. (result, problem)."""
    lines = FINAL_LINE.findall(log_text)
    path = run_dir / "result.json"
    if not lines:
        return None, "no final val_bpb= line"
    if not path.exists():
        return None, "no result.json"
    try:
        result = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None, "result.json is not valid JSON"
    val, _, steps = lines[-1]
    if f"{result.get('val_bpb', float('nan')):.4f}" != val or result.get("num_steps") != int(steps):
        return None, f"result.json (val_bpb={result.get('val_bpb')}) disagrees with the log's final line ({val})"
    return result, ""


def run_experiment(repo: Path, description: str, seed: int = 42, timeout: float | None = None,
                   on_progress=None, log=print) -> Outcome:
    description = " ".join(description.split()) or "(no description)"
    config = load_tag(repo)
    recover(repo, log)
    results = repo / "results.tsv"
    rows = ledger.read(results, config["tag"])
    run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    run_dir = state_dir(repo) / "runs" / run_id
    run_dir.mkdir(parents=True)
    best_row = ledger.best(rows, config["fingerprint"], config["budget_s"])
    best_before = best_row.val_bpb if best_row else None

    def refuse(reason: str) -> NoReturn:
        row = _row(config, git.head(repo), f"{description} [refused: {reason}]", run_id, "refused", seed=seed)
        ledger.append(results, row)
        raise HarnessError(f"Refused: {reason}")

    changed = git.changed_files(repo)
    others = [p for p in changed if p != EDITABLE]
    if others:
        refuse(f"files other than {EDITABLE} changed ({', '.join(others[:5])}); only {EDITABLE} may be edited. "
               f"Undo them (`git checkout -- FILE`, or delete new files) and run again")
    if fixed_fingerprint(repo) != config["fingerprint"]:
        refuse("the fixed half (prepare.py, the prepared data or the tokenizer) differs from when this tag was "
               "set up; restore it (`git checkout -- prepare.py`, `python prepare.py --force` for the data) or "
               "start a new tag")
    budget = current_budget()
    if budget != config["budget_s"]:
        refuse(f"the time budget is {budget} s but this tag was set up with {config['budget_s']} s; "
               f"set AUTORESEARCH_TIME_BUDGET accordingly (unset for 300 s)")

    commit = git.commit_file(repo, EDITABLE, description) if EDITABLE in changed else git.head(repo)
    pending_path = state_dir(repo) / "pending.json"
    pending = {"run_id": run_id, "tag": config["tag"], "commit": commit, "description": description,
               "seed": seed, "started": _now(), "pgid": None}
    _atomic_json(pending_path, pending)

    timeout = timeout if timeout is not None else 2 * config["budget_s"] + TIMEOUT_MARGIN
    t0 = time.time()
    code, timed_out = train(repo, run_dir, seed, timeout, pending, pending_path, on_progress)
    wall = time.time() - t0
    log_text = (run_dir / "run.log").read_text(errors="replace")
    shutil.copyfile(run_dir / "run.log", repo / "run.log.tmp")
    os.replace(repo / "run.log.tmp", repo / "run.log")  # for agents that follow the public protocol

    result, problem = (None, "") if timed_out or code != 0 else read_result(run_dir, log_text)
    if result is not None and result.get("time_budget") != config["budget_s"]:
        result, problem = None, f"the run used a {result.get('time_budget')} s budget, not {config['budget_s']} s"
    if result is None:
        if timed_out:
            reason = f"timeout after {timeout:.0f} s, killed"
        elif "FAST_FAIL" in log_text:
            reason = "FAST_FAIL (loss NaN, infinite or exploding)"
        elif code != 0:
            reason = f"exit status {code}"
        else:
            reason = problem
        row = _row(config, commit, f"{description} [crash: {reason}]", run_id, "crash", wall=wall, seed=seed)
    else:
        better = best_before is None or result["val_bpb"] < best_before
        row = _row(config, commit, description, run_id, "keep" if better else "discard", result["val_bpb"],
                   result["memory_gb"], result["num_steps"], wall, seed)
    ledger.append(results, row)
    if row.status != "keep":
        git.reset_hard(repo, last_kept_commit(repo, config, rows))
        (run_dir / "model.safetensors").unlink(missing_ok=True)  # only kept models are worth their disk
    pending_path.unlink()
    return Outcome(row=row, best_before=best_before, log_tail=_tail(run_dir / "run.log"), run_dir=run_dir,
                   result=result)


def summary(outcome: Outcome) -> str:
    row, result = outcome.row, outcome.result
    if row.status == "crash":
        return (f"crash: {row.description}\n--- last 50 lines of the log ({outcome.run_dir / 'run.log'}) ---\n"
                f"{outcome.log_tail}\n--- the branch is back on the last kept commit; fix train.py and run again")
    delta = "" if outcome.best_before is None else f" ({row.val_bpb - outcome.best_before:+.6f} vs best " \
                                                     f"{outcome.best_before:.6f})"
    base = "baseline, " if outcome.best_before is None else ""
    return (f"{row.status}: val_bpb={row.val_bpb:.6f}{delta} | {base}steps={row.steps} | memory_gb={row.memory_gb:.1f} "
            f"| tok/s={result['tokens_per_second']:.0f} | wall={row.wall_s:.0f}s | commit={row.commit}"
            + ("" if row.status == "keep" else " | train.py is back at the last kept commit"))
