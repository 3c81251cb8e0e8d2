"""One experiment, end to end: check, commit, train under a hard timeout, record, keep or discard.

State lives in three places, each safe against a kill at any moment:
- results.tsv (ledger.py): append-only rows, the record of truth;
- .autoresearch/tags/<tag>.json: written once by setup (fingerprint, budget, base commit);
- .autoresearch/pending.json: written before a run starts and removed after its row is recorded. Finding it
  later means the harness died mid-run: recover() records the crash (unless the row made it) and puts the
  branch back on the last kept commit, or on the candidate whose confirmation series is still open.

An experiment is a series of runs of one train.py (decide.py says how many); each run is one row, and what
series is open is read from the ledger alone, so a kill between any two runs loses nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from statistics import fmean
from pathlib import Path
from typing import NoReturn

from autoresearch import compiled, decide, evaluate, git, guard, ledger, load, lock, machine, sandbox

STATE_DIR = ".autoresearch"
BRANCH_PREFIX = "autoresearch/"
EDITABLE = "train.py"
TIMEOUT_MARGIN = 120  # seconds on top of twice the budget, for startup, compilation and export
# Seconds a run may take beyond its budget until its process ends (startup, the last step's overshoot, export,
# the check): a fixed part plus a share of the budget, recorded in the tag at setup. The default model needs
# ~5 s on 2 CPU cores outside a 300 s budget (BENCHMARKS.md); a GPU adds CUDA and kernel start-up.
ALLOWANCE_FIXED = {"cpu": 10.0, "gpu": 30.0}
ALLOWANCE_SHARE = 0.1
# A train.py larger than this is refused (the tag records its own): the default is ~25 KB, and a file of many
# times that is data (embedded text to train on), not code.
MAX_TRAIN_BYTES = 100_000
EVAL_TIMEOUT = 1200   # seconds for the harness's evaluation of one model
WAITING_FILE = "waiting.json"  # under STATE_DIR while a run waits for a quiet machine (`autoresearch status`)
LOG_KEEP = 2 << 20    # bytes of a run's output kept from its start, and as many from its end


class HarnessError(RuntimeError):
    """A problem the user can fix; the message says how."""


class Refused(HarnessError):
    """A run refused before it trained, and recorded as such."""


class MachineBusy(HarnessError):
    """Other processes kept the machine busy for longer than AUTORESEARCH_LOAD_WAIT: nothing ran."""


@dataclass
class Outcome:
    row: ledger.Row
    best_before: float | None
    log_tail: str
    run_dir: Path
    result: dict | None
    evaluation: dict


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
    """Write path whole or not at all. The temporary file is created new (O_EXCL, never through a link) and
    renamed over path, which replaces whatever path was, a link a run left there included, without following it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def fixed_fingerprint(repo: Path) -> str:
    """The fingerprint of the fixed half as this repository has it (its own prepare.py, the prepared data, every
    data file checked by sha256). prepare.py is also hashed here, so an edited fingerprint() cannot vouch for
    itself."""
    import prepare
    try:
        digest = prepare.fingerprint(prepare_path=repo / "prepare.py", full=True)
    except prepare.PrepareError as e:
        raise HarnessError(str(e)) from None
    return hashlib.sha256(digest.encode() + (repo / "prepare.py").read_bytes()).hexdigest()


def current_budget() -> float:
    import prepare
    try:
        return prepare.time_budget()
    except prepare.PrepareError as e:
        raise HarnessError(str(e)) from None


def current_clock() -> str:
    import prepare
    try:
        return prepare.budget_clock_kind()
    except prepare.PrepareError as e:
        raise HarnessError(str(e)) from None


def setup(repo: Path, tag: str, threads: int | None = None, sandbox_mode: str = "auto", rule: str = "stat",
          timeout: float | None = None) -> dict:
    """A new experiment branch and its tag file. The tag pins what makes its runs comparable and honest: the
    fixed half's fingerprint, the budget and its clock, the hardware and its measured peak FLOP/s, and the rules:
    the protection (sandbox), the decision rule, the hard timeout, the allowance outside the budget and the
    largest train.py. A run that asks for weaker settings than its tag is refused (pin_problems)."""
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
    if rule not in decide.RULES:
        raise HarnessError(f"--decision {rule!r}: use stat (the default) or naive.")
    try:
        protection = sandbox.protection(sandbox_mode)
    except sandbox.SandboxError as e:
        raise HarnessError(str(e)) from None
    fingerprint = fixed_fingerprint(repo)
    prepare_source = git.git(repo, "show", "HEAD:prepare.py", strip=False).encode()
    import prepare
    budget, clock = current_budget(), current_clock()
    profile = prepare.require_manifest()["profile"]
    config = {"tag": tag, "branch": name, "fingerprint": fingerprint, "budget_s": budget,
              "clock": clock,
              "base_commit": git.head(repo), "prepare_sha256": hashlib.sha256(prepare_source).hexdigest(),
              "hardware": machine.hardware(), "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
              "protection": protection, "decision": rule, "allowance_s": outside_allowance(profile, budget),
              "timeout_s": timeout or default_timeout(budget, clock), "max_train_bytes": MAX_TRAIN_BYTES,
              "compile_cache": compile_cache_mode()}
    if threads is not None:  # parallel workers: each run gets this many threads (tag_threads)
        config["threads"] = threads
    config["peak_flops"] = machine_peaks(prepare_source, tag_threads(config), config["hardware"])
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
    try:
        config = json.loads(path.read_text())
        missing = [k for k in ("tag", "branch", "fingerprint", "budget_s", "base_commit", "prepare_sha256")
                   if k not in config]
    except (OSError, ValueError, TypeError) as e:
        config, missing = None, [f"readable JSON ({e})"]
    if missing:
        raise HarnessError(f"{path} is damaged (no {', '.join(missing)}). Restore it from a backup, or start a new "
                           "tag with `autoresearch setup --tag NEWTAG` (results.tsv keeps every row).")
    config.setdefault("clock", "wall")  # tags set up before the cpu clock existed
    # tags set up before the rules were pinned: the defaults of that time, the protection asked for at each run
    config.setdefault("allowance_s", OLD_ALLOWANCE)
    config.setdefault("max_train_bytes", MAX_TRAIN_BYTES)
    return config


OLD_ALLOWANCE = 30.0  # a tag from before allowances were recorded had a fixed 30 s on the cpu profile


def compile_cache_mode() -> str:
    """champion (the default: every run starts from the champion's compile cache, compiled.py) or off (every run
    compiles cold; AUTORESEARCH_COMPILE_CACHE=off at setup, for tests of eager code)."""
    mode = os.environ.get("AUTORESEARCH_COMPILE_CACHE", "").strip() or "champion"
    if mode not in ("champion", "off"):
        raise HarnessError(f"AUTORESEARCH_COMPILE_CACHE={mode!r}: use champion (the default) or off.")
    return mode


def default_timeout(budget: float, clock: str) -> float:
    """The hard timeout: twice the budget plus a margin (four times on the cpu clock, where a busy machine
    stretches the budget's wall time)."""
    return (2 if clock == "wall" else 4) * budget + TIMEOUT_MARGIN


def machine_peaks(prepare_source: bytes, threads: int, hardware: dict) -> dict:
    """measure_peaks, remembered per machine, thread count and torch in a file beside the data cache that only the
    harness writes (a sandboxed training cannot see it): setting up a tag costs ~4 s of probing once per
    machine, not once per tag."""
    import prepare
    cache = prepare.cache_dir()
    path = cache.parent / f"{cache.name}-machine.json"
    key = json.dumps([hardware, threads], sort_keys=True)
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict) or not isinstance(known.get(key), dict):
        known = known if isinstance(known, dict) else {}
        known[key] = measure_peaks(prepare_source, threads)
        _atomic_json(path, known)
    return known[key]


def measure_peaks(prepare_source: bytes, threads: int) -> dict:
    """The machine's peak FLOP/s per dtype, measured by the harness in a fresh process with the clean prepare.py
    and the runs' thread count, once per tag: every run reads it from its view, none can change it."""
    with tempfile.TemporaryDirectory(prefix="autoresearch-peak-") as d:
        (Path(d) / "prepare.py").write_bytes(prepare_source)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTORESEARCH_", "PYTHON"))}
        env["OMP_NUM_THREADS"] = str(threads)
        proc = subprocess.run([sys.executable, "-I", "-c", "import json, sys; sys.path.insert(0, sys.argv[1]); "
                               "import prepare; print(json.dumps(prepare.measure_peaks(int(sys.argv[2]))))",
                               d, str(threads)], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise HarnessError(f"measuring this machine's peak FLOP/s failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tag_sandbox_mode(config: dict) -> str:
    """The --sandbox a run of this tag gets when it names none: the tag's (auto for tags from before pins)."""
    return {"bwrap": "auto", "none": "off"}.get(config.get("protection"), "auto")


def pin_problems(config: dict, protection: str, rule: str, timeout: float | None) -> list[str]:
    """Where a run asks for weaker settings than its tag pinned at setup (tags from before pins: none)."""
    problems = []
    pinned = config.get("protection")
    if pinned == "bwrap" and protection != "bwrap":
        problems.append("this tag was set up with the bubblewrap sandbox, and this run asked for none "
                        "(--sandbox off, or bubblewrap no longer works here)")
    if config.get("decision") and rule != config["decision"]:
        problems.append(f"this tag decides by the {config['decision']} rule, and this run asked for {rule}")
    if timeout is not None and config.get("timeout_s") and timeout > config["timeout_s"]:
        problems.append(f"this tag's timeout is {config['timeout_s']:g} s, and this run asked for {timeout:g} s")
    raw = os.environ.get("AUTORESEARCH_OUTSIDE_ALLOWANCE")
    if raw and "allowance_s" in config and _float_or_none(raw) != config["allowance_s"]:
        problems.append(f"this tag allows {config['allowance_s']:g} s outside the budget, and "
                        f"AUTORESEARCH_OUTSIDE_ALLOWANCE asks for {raw}")
    return problems


def _float_or_none(raw: str) -> float | None:
    try:
        return float(raw)
    except ValueError:
        return None


def last_kept_commit(repo: Path, config: dict, rows: list[ledger.Row]) -> str:
    kept = [r for r in rows if r.status == "keep"]
    return git.git(repo, "rev-parse", kept[-1].commit) if kept else config["base_commit"]


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


def _row(tag_config, commit, description, run_id, status, val_bpb=0.0, memory_gb=0.0, steps=0, wall=0.0, seed=0,
         protection="none", **stats):
    return ledger.Row(commit=commit[:7], val_bpb=val_bpb, memory_gb=memory_gb, status=status,
                      description=description, tag=tag_config["tag"], run_id=run_id, time=_now(),
                      budget_s=tag_config["budget_s"], steps=steps, wall_s=wall,
                      fingerprint=tag_config["fingerprint"][:12], seed=seed, protection=protection,
                      clock=tag_config.get("clock", "wall"), **stats)


def branch_target(repo: Path, config: dict, rows: list[ledger.Row]) -> str:
    """Where the branch belongs between runs: on the candidate while its confirmation series is open, else on
    the champion (the last kept commit)."""
    series = decide.open_series(rows)
    if series is not None and series.kind == "candidate":
        return git.git(repo, "rev-parse", series.commit)
    return last_kept_commit(repo, config, rows)

# --- recovery -----------------------------------------------------------------------------


def _kill_training(pending: dict) -> None:
    """Kill the training recorded in pending: its process group and every process of its tree that was seen,
    each only if it is still the process that was recorded (pid and start time)."""
    processes = pending.get("processes") or []
    leader = lock.same_process(processes[0]) if processes else None
    if leader is not None:
        try:
            os.killpg(leader.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    lock.kill_all(processes)


def read_pending(repo: Path) -> dict | None:
    path = state_dir(repo) / "pending.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise HarnessError(f"{path} is unreadable ({e}). It records the experiment that was in flight; look at "
                           "it, then delete it to go on.") from None


INFLIGHT_DIR = "inflight"  # under STATE_DIR: one JSON per run a parallel driver (cluster.py) has dispatched


def interrupted_row(config: dict, job: dict, reason: str) -> ledger.Row:
    """The row of a run whose harness, driver or worker died before it was recorded."""
    return _row(config, job.get("commit") or job["parent"], f"{job['description']} [interrupted: {reason}]",
                job["run_id"], "crash", seed=job.get("seed", 0), protection=job.get("protection", "none"),
                config=job.get("config", ""), repeat=job.get("repeat", 1), decision="interrupted",
                worker=job.get("worker", ""), host=job.get("host", ""), device=job.get("device", ""))


def recover_inflight(repo: Path, log=print, reason: str = "the driver died mid-run") -> list[ledger.Row]:
    """Record every run a dead parallel driver had dispatched and not recorded (its workers died with it)."""
    recorded = []
    for path in sorted((state_dir(repo) / INFLIGHT_DIR).glob("*.json")):
        try:
            job = json.loads(path.read_text())
        except (OSError, ValueError):  # torn by a kill while written: it never reached a worker
            path.unlink()
            continue
        config = json.loads((state_dir(repo) / "tags" / f"{job['tag']}.json").read_text())
        if not any(r.run_id == job["run_id"] for r in ledger.read(repo / "results.tsv", config["tag"])):
            row = interrupted_row(config, job, reason)
            ledger.append(repo / "results.tsv", row)
            recorded.append(row)
            log(f"recovered an interrupted run ({job['run_id']} on {job.get('worker') or 'a worker'}): recorded as crash")
        path.unlink()
    return recorded


def recover(repo: Path, log=print, reason: str = "harness died mid-run", parallel: bool = False) -> ledger.Row | None:
    """Finish an experiment whose harness died: kill its training, record it as a crash unless its row was
    recorded, and put the branch back on the last kept commit (or on the candidate whose series is open, for
    `autoresearch run`; a parallel driver never moves the branch to a candidate). Only a holder of the
    repository's lock may call this (run and loop do): then the harness that wrote pending.json is certainly
    dead."""
    inflight = recover_inflight(repo, log)
    pending = read_pending(repo)
    if pending is None:
        if inflight or parallel:
            _branch_back(repo, parallel, inflight[-1].tag if inflight else None)
        return inflight[-1] if inflight else None
    _kill_training(pending)
    config = json.loads((state_dir(repo) / "tags" / f"{pending['tag']}.json").read_text())
    rows = ledger.read(repo / "results.tsv", config["tag"])
    row = None
    if not any(r.run_id == pending["run_id"] for r in rows):
        row = interrupted_row(config, pending, reason)
        ledger.append(repo / "results.tsv", row)
        log(f"recovered an interrupted experiment ({pending['run_id']}): recorded as crash")
    _branch_back(repo, parallel, pending["tag"])
    (state_dir(repo) / "pending.json").unlink()
    return row


def _branch_back(repo: Path, parallel: bool, tag: str | None) -> None:
    """The branch back where it belongs between runs, if it is the tag's (or, tag None, any experiment branch)."""
    name = git.branch(repo)
    if not name.startswith(BRANCH_PREFIX) or (tag is not None and name != BRANCH_PREFIX + tag):
        return
    config = load_tag(repo)
    rows = ledger.read(repo / "results.tsv", config["tag"])
    # an open confirmation series of `autoresearch run` stays on its candidate
    target = last_kept_commit(repo, config, rows) if parallel else branch_target(repo, config, rows)
    if git.head(repo) != target:
        git.reset_to(repo, target, EDITABLE)


# --- running one experiment -------------------------------------------------------------


def _tail(path: Path, n: int = 50) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def _progress(log_path: Path) -> tuple[float | None, str | None]:
    """Training seconds elapsed according to the newest step line in the log, and that line."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            found = re.findall(rb"^(step=.*elapsed=(\d+)s.*)$", f.read(), re.M)
    except OSError:
        return None, None
    if not found:
        return None, None
    line, elapsed = found[-1]
    return float(elapsed), line.decode(errors="replace").strip()


@dataclass
class Training:
    code: int | None        # exit status, None when killed at the timeout
    timed_out: bool
    result_after: float | None  # seconds from the start until result.json first appeared, by the harness's clock
    wall: float
    cpu_at_result: float | None = None  # CPU seconds of the training's processes when result.json appeared
    load: float | None = None   # cores other processes kept busy meanwhile
    done_after: float | None = None  # seconds from the start until the training's process ended
    cpu_at_done: float | None = None  # CPU seconds of its processes until then
    rewritten: list | None = None  # contract files (result, model) changed after result.json first appeared


def contract_files() -> tuple[str, ...]:
    contract = prepare_contract()
    return contract.RESULT_FILE, contract.GRAPH_FILE, contract.TENSORS_FILE


def files_state(out: Path) -> dict:
    """The contract files in out/ by identity (inode, size, mtime): a second write shows as a change."""
    state = {}
    for name in contract_files():
        try:
            st = os.lstat(out / name)
            state[name] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
        except OSError:
            state[name] = None
    return state


class CappedLog:
    """Writes a process's output to a file, keeping the first and the last LOG_KEEP bytes: a train.py that
    prints gigabytes costs the disk at most 2 x LOG_KEEP, and the log still starts and ends as it should."""

    def __init__(self, path: Path):
        # created new, before the training starts: never a file (or a link) the training put there
        self.file = os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb")
        self.path, self.dropped = path, 0

    def start(self, pipe) -> None:
        self.pipe = pipe
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        head, tail, last_flush = 0, bytearray(), 0.0
        with self.file as f:
            while True:
                chunk = os.read(self.pipe.fileno(), 1 << 16)
                eof = not chunk
                if head < LOG_KEEP:  # the start of the log, written as it comes
                    take = chunk[:LOG_KEEP - head]
                    f.write(take)
                    f.flush()
                    head += len(take)
                    chunk = chunk[len(take):]
                if chunk:  # past it: a rolling window of the end, rewritten after the head twice a second
                    tail += chunk
                    if len(tail) > LOG_KEEP:
                        self.dropped += len(tail) - LOG_KEEP
                        del tail[:len(tail) - LOG_KEEP]
                if head >= LOG_KEEP and (eof or time.time() - last_flush > 0.5):
                    f.seek(head)
                    if self.dropped:
                        f.write(f"\n[... {self.dropped} bytes of output dropped here: the log keeps the first and "
                                f"the last {LOG_KEEP} bytes ...]\n".encode())
                    f.write(tail)
                    f.truncate()
                    f.flush()
                    last_flush = time.time()
                if eof:
                    break

    def close(self) -> None:
        self.thread.join(timeout=30)
        self.pipe.close()


def train(repo: Path, run_dir: Path, seed: int, timeout: float, pending: dict, pending_path: Path,
          view: Path, wrap=None, on_progress=None, clock: str = "wall", threads: int = 1, spare=()) -> Training:
    """Run train.py in its own process group (inside `wrap`, the sandbox, if given), its output to
    run_dir/run.log (capped), watching for its result.json and recording every process of its tree in
    pending.json so that a later recovery can kill exactly those. `spare`: pids of this process's children
    that are not the training's (the waiting evaluator)."""
    out = run_dir / sandbox.OUT_DIR
    contract = prepare_contract()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTORESEARCH_", "TORCHINDUCTOR_"))}
    env.update(AUTORESEARCH_RUN_DIR=str(out), AUTORESEARCH_CACHE=str(view),
               PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1")
    env[contract.SEED_ENV] = str(seed)
    if "AUTORESEARCH_TIME_BUDGET" in os.environ:
        env["AUTORESEARCH_TIME_BUDGET"] = os.environ["AUTORESEARCH_TIME_BUDGET"]
    env.update(load.clock_env(clock, threads))
    if (run_dir / sandbox.COMPILE_DIR).is_dir():
        env["TORCHINDUCTOR_CACHE_DIR"] = str(run_dir / sandbox.COMPILE_DIR)
    if wrap is not None:
        env["TMPDIR"] = "/tmp"
    argv = [sys.executable, EDITABLE]
    lock.become_subreaper()  # orphans of the training become our children: still in the tree we kill
    log = CappedLog(run_dir / "run.log")  # created before the training exists
    proc = subprocess.Popen(lock.tied_to_parent(wrap(argv) if wrap else argv), cwd=repo, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    log.start(proc.stdout)
    known = [lock.identity(proc.pid) or [proc.pid, 0.0]]
    pending["processes"] = known
    _atomic_json(pending_path, pending)
    start = time.time()
    meter = load.Meter()
    children_before = _children_cpu()
    result_path = out / contract.RESULT_FILE
    result_after = cpu_at_result = written = None
    timed_out = False
    try:
        while proc.poll() is None:
            now = time.time()
            if result_after is None and os.path.lexists(result_path):
                result_after = now - start
                cpu_at_result = load.tree_cpu_seconds(known)
                written = files_state(out)
            if now - start > timeout:
                timed_out = True
                break
            tree = [i for i in lock.descendants(spare) if i not in known]
            if tree:
                known += tree
                _atomic_json(pending_path, pending)
            if on_progress:
                on_progress(*_progress(run_dir / "run.log"))
            time.sleep(0.2)
    finally:
        # The budget runs until the training's process ends, whenever it wrote its result: a placeholder
        # result.json written at once buys no time.
        done_after = time.time() - start
        cpu_at_done = load.tree_cpu_seconds(known)
        known += [i for i in lock.descendants(spare) if i not in known]
        _kill_training(pending)  # pending["processes"] is `known`: leftovers, grandchildren, setsid escapees
        proc.wait()
        lock.reap(known)
        log.close()
    wall = time.time() - start
    tree_cpu = _children_cpu() - children_before
    final = files_state(out)
    if result_after is None and final[contract.RESULT_FILE] is not None:
        result_after, cpu_at_result, written = wall, tree_cpu, final
    rewritten = [name for name in final if written is not None and final[name] != written[name]]
    return Training(None if timed_out else proc.returncode, timed_out, result_after, wall, cpu_at_result,
                    round(meter.others(tree_cpu), 3), done_after, max(cpu_at_done or 0.0, 0.0) or tree_cpu,
                    rewritten)


def _children_cpu() -> float:
    """CPU seconds of every child this process has waited for (the training, and orphans it reaped)."""
    import resource
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fault_point(name: str) -> None:
    """For the fault-injection tests and benchmark (benchmarks/faults.py): AUTORESEARCH_KILL_AT=name makes the
    harness SIGKILL itself here, at a moment a test could not otherwise hit reliably."""
    if os.environ.get("AUTORESEARCH_KILL_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)


def prepare_contract():
    """The harness's own copy of the fixed half (the installed one, imported once at the CLI's start)."""
    import prepare
    return prepare


def read_result(run_dir: Path) -> tuple[dict | None, str]:
    """The run's result.json, checked against the contract's schema. (result, problem)."""
    contract = prepare_contract()
    path = run_dir / sandbox.OUT_DIR / contract.RESULT_FILE
    try:
        result = json.loads(evaluate.read_regular(path, evaluate.RESULT_LIMIT))
    except FileNotFoundError:
        return None, "no result.json (train.py must end with prepare.finish)"
    except evaluate.Unsafe as e:
        return None, str(e)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        return None, f"result.json is not valid JSON ({e})"
    problems = contract.check_result(result)
    if problems:
        return None, "result.json: " + "; ".join(problems[:4])
    return result, ""


def outside_allowance(profile: str, budget: float) -> float:
    """Seconds a run may take beyond its budget until its process ends: startup (imports, data, model), the last
    step's overshoot, the export and check in prepare.finish. A fixed part and a share of the budget (a fixed
    30 s would be 300% of a 10 s budget); AUTORESEARCH_OUTSIDE_ALLOWANCE at setup overrides it. Recorded in
    the tag. See docs/integrity.md."""
    raw = os.environ.get("AUTORESEARCH_OUTSIDE_ALLOWANCE")
    if raw:
        value = _float_or_none(raw)
        if value is None or not value >= 0:
            raise HarnessError(f"AUTORESEARCH_OUTSIDE_ALLOWANCE={raw!r} is not a number of seconds.")
        return value
    return round(ALLOWANCE_FIXED[profile] + ALLOWANCE_SHARE * budget, 3)


def clean_prepare(repo: Path, config: dict) -> bytes:
    """prepare.py as committed when the tag was set up: the evaluator's copy, never the working tree's."""
    source = git.git(repo, "show", f"{config['base_commit']}:prepare.py", strip=False).encode()
    if hashlib.sha256(source).hexdigest() != config["prepare_sha256"]:
        raise HarnessError("prepare.py in git at the tag's base commit is not the one the tag was set up with; "
                           "the repository was rewritten. Start a new tag.")
    return source


def experiment(repo: Path, description: str, rule: str | None = None, seed: int = 42, on_outcome=None,
               **kw) -> list[Outcome]:
    """One experiment under the decision rule (the tag's by default): its first run, then (stat) the repeats its
    series needs, each recorded as it ends. An open series left by a killed harness is finished first (see
    run_experiment)."""
    if rule is not None and rule not in decide.RULES:
        raise HarnessError(f"--decision {rule!r}: use stat (repeats until the rule is sure, the default) or naive "
                           "(one run, kept when below the best single run: the public project's rule).")
    outcomes = []
    while True:
        outcome = run_experiment(repo, description, seed=seed, rule=rule, **kw)
        outcomes.append(outcome)
        if on_outcome:
            on_outcome(outcome)
        if outcome.row.status in ("crash", "refused"):
            break
        if decide.open_series(ledger.read(repo / "results.tsv", outcome.row.tag)) is None:
            break
    return outcomes


def _config_of(repo: Path, commit: str) -> str:
    """A configuration's name: the git blob of its train.py, 12 hex digits."""
    return git.git(repo, "rev-parse", f"{commit}:{EDITABLE}")[:12]


def tag_threads(config: dict) -> int:
    """Threads every run of the tag trains with: set at setup (parallel workers: each its share of the cores),
    else the cores of the machine the tag was set up on."""
    return int(config.get("threads") or config.get("hardware", {}).get("cores") or machine.hardware()["cores"])


def device_label(config: dict, hw: dict | None = None) -> str:
    """What a row ran on, for its `device` column: the accelerator's name, or the CPU and its thread count."""
    hw = hw or config.get("hardware") or machine.hardware()
    return f"{hw['device']} {hw['name']}" if hw["device"] == "cuda" else f"{hw['device']} x{tag_threads(config)}"


def preflight(repo: Path, config: dict, worker: bool = False) -> str | None:
    """Why a run from `repo` would not be comparable with the tag's other runs, or None: the fixed half, the
    budget, the clock and the hardware must all be the tag's. A worker may have more cores than its share."""
    try:
        fingerprint = fixed_fingerprint(repo)
    except HarnessError as e:  # a data file no longer matches its sha256
        return str(e).rstrip(".")
    if fingerprint != config["fingerprint"]:
        return ("the fixed half (prepare.py, the prepared data or the tokenizer) differs from when this tag was "
                "set up; restore it (`git checkout -- prepare.py`, `python prepare.py --force` for the data) or "
                "start a new tag")
    budget = current_budget()
    if budget != config["budget_s"]:
        return (f"the time budget is {budget} s but this tag was set up with {config['budget_s']} s; "
                f"set AUTORESEARCH_TIME_BUDGET accordingly (unset for 300 s)")
    clock = config["clock"]
    if current_clock() != clock:
        return (f"AUTORESEARCH_BUDGET_CLOCK is {current_clock()} but this tag runs on the {clock} clock, and "
                f"results under different clocks are never compared; set it to {clock} (wall: unset it), or "
                f"start a new tag")
    here = machine.hardware()
    recorded = config.get("hardware", here)
    changed_hw = machine.differences(recorded, here, ignore=("cores",) if worker else ())
    if worker and here["cores"] < tag_threads(config):
        changed_hw.append(f"{here['cores']} cores for {tag_threads(config)} threads per run")
    if changed_hw:
        return (f"this tag was set up on {machine.describe(recorded)}, and this machine is "
                f"{machine.describe(here)} ({'; '.join(changed_hw)}): its results would not be comparable. Start a "
                "new tag here (`autoresearch setup --tag NEWTAG`, or `autoresearch loop --tag NEWTAG`); the old "
                "tag's rows stay in results.tsv")
    return None


@dataclass
class Fixed:
    """What every run of a tag evaluates with, read before a run starts."""
    source: bytes      # prepare.py as committed at the tag's base commit
    cache: Path
    manifest: dict


def fixed_half(repo: Path, config: dict) -> Fixed:
    contract = prepare_contract()
    return Fixed(clean_prepare(repo, config), contract.cache_dir(), contract.require_manifest())


@dataclass
class Execution:
    status: str               # ok, crash or refused
    reason: str               # why it crashed or was refused
    result: dict | None       # train.py's result.json
    evaluation: dict          # the harness's evaluation
    training: Training


def execute(repo: Path, config: dict, run_dir: Path, seed: int, pending: dict, pending_path: Path,
            protection: str, fixed: Fixed, timeout: float | None = None, on_progress=None,
            test_threshold: float | None = None, run_no: int = 1, compile_base: Path | None = None) -> Execution:
    """Train repo's train.py once under the tag's protocol (sandbox, hard timeout, process group, the
    integrity checks) and evaluate the model it exported. Writes nothing but run_dir and pending; the caller
    records the result. `autoresearch run` calls it in the repository, a worker (worker.py) in its own copy.
    compile_base: the compile cache the run gets a private copy of (compiled.py), None for none."""
    clock, threads, budget = config["clock"], tag_threads(config), config["budget_s"]
    out = run_dir / sandbox.OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    view = sandbox.make_view(run_dir, fixed.cache, fixed.manifest, config.get("peak_flops"))
    if compile_base is not None:
        compiled.private_copy(compile_base, run_dir)
        base_before = compiled.state(compile_base) if protection != "bwrap" else None
    wrap = ((lambda argv: sandbox.wrap(argv, repo, run_dir, fixed.cache, fixed.manifest)) if protection == "bwrap"
            else None)
    watch = guard.Guard(repo, exclude=[run_dir, pending_path])
    timeout = min(timeout or config.get("timeout_s") or default_timeout(budget, clock),
                  config.get("timeout_s") or float("inf"))
    # The evaluator imports torch while train.py starts (evaluate.Evaluator); closed unused if the run fails.
    with contextlib.closing(evaluate.Evaluator(fixed.source, fixed.cache, out, protection)) as evaluator:
        try:
            training = train(repo, run_dir, seed, timeout, pending, pending_path, view, wrap, on_progress, clock,
                             threads, spare=[evaluator.proc.pid])
        finally:
            shutil.rmtree(run_dir / sandbox.COMPILE_DIR, ignore_errors=True)  # throwaway: no run reads it again
        log_text = (run_dir / "run.log").read_text(errors="replace")

        # Integrity first: the harness's state and the data must be as they were, whatever the run reports.
        tampered = watch.changes()
        refusal = crash = None
        evaluation = {}
        if tampered:
            lost = watch.restore()
            refusal = ("the run changed files outside its run directory: " + ", ".join(tampered[:5]) +
                       (" (restored)" if not lost else f" (restored, but not {', '.join(lost[:3])})"))
        elif compile_base is not None and base_before is not None and compiled.state(compile_base) != base_before:
            compiled.discard(fixed.cache, compile_base.name)
            refusal = "the run wrote into the shared compile cache (thrown away; the next run fills a new one)"
        else:
            try:
                fingerprint_after = fixed_fingerprint(repo)
            except HarnessError as e:
                fingerprint_after = str(e)
            if fingerprint_after != config["fingerprint"]:
                refusal = ("the prepared data or prepare.py changed during the run; every later run is refused until "
                           "`python prepare.py --force` restores it")
        result = None
        allowance = config["allowance_s"]
        took = budget + outside_seconds(config, training)
        if refusal is None:
            result, problem = (None, "") if training.timed_out or training.code != 0 else read_result(run_dir)
            if training.timed_out:
                crash = f"timeout after {timeout:.0f} s, killed"
            elif "FAST_FAIL" in log_text:
                crash = "FAST_FAIL (loss NaN, infinite or exploding)"
            elif protection == "bwrap" and log_text.startswith("bwrap:"):  # the sandbox itself failed to start
                crash = (f"the sandbox could not start the training ({log_text.splitlines()[0][:300]}): a path it "
                         f"needs is not mounted in it. The sandbox mounts /usr, /etc, the interpreter's prefixes "
                         f"({', '.join(map(str, sandbox.python_dirs()))}) and PYTHONPATH; put what is missing there, "
                         "or set up a tag with --sandbox off (no enforcement)")
            elif training.code != 0:
                crash = f"exit status {training.code}"
            elif result is None:
                crash = problem
            elif result.get("export_error"):
                crash = f"the model could not be exported: {result['export_error'][:300]}"
            elif training.rewritten:
                refusal = (f"{', '.join(training.rewritten)} changed after result.json first appeared; "
                           "prepare.finish writes the result and the model once, when training is over")
            elif result["time_budget"] != budget:
                refusal = f"the run used a {result['time_budget']} s budget, not {budget} s"
            elif result["seed"] != seed or result.get("data_seed") not in (None, seed):
                refusal = (f"the run used seed {result['seed']} (data order: {result.get('data_seed')}), not the "
                           f"harness's {seed}: train.py must seed from AUTORESEARCH_SEED, so that repeats are "
                           "independent samples")
            elif took > budget + allowance:
                first_step = result.get("compile_seconds")
                if isinstance(first_step, (int, float)) and first_step > budget:
                    crash = (f"the first step (compilation and warm-up) took {first_step:.0f} s, more than the "
                             f"whole {budget:g} s budget: this budget is too short for this train.py. Use a longer "
                             f"budget, or USE_COMPILE = False for smoke tests")
                else:
                    refusal = (f"the run took {took:.0f} s {'of CPU per thread ' if clock == 'cpu' else ''}until "
                               f"its process ended, more than the {budget:g} s budget plus the {allowance:g} s "
                               "allowance for startup and export")
        if refusal is None and crash is None:
            def evaluator_started(pid):  # recorded, so that recovery also ends an evaluator left by a killed harness
                pending["processes"].append(lock.identity(pid) or [pid, 0.0])
                _atomic_json(pending_path, pending)
                fault_point("evaluating")
                fault_point(f"evaluating-run-{run_no}")  # the n-th run of a series

            evaluation = evaluator.run(
                result["dtype"], result["device"], result["check_bpb"],
                test_threshold if test_threshold is not None else float("inf"), timeout=EVAL_TIMEOUT,
                on_start=evaluator_started)
            evaluation["outside_s"] = round(took - budget, 3)
            evaluation["allowance_s"] = allowance
            if "refused" in evaluation:
                refusal = evaluation["refused"]
            elif "error" in evaluation:
                crash = evaluation["error"]
            elif result.get("val_bpb") is not None and abs(result["val_bpb"] - evaluation["val_bpb"]) > \
                    evaluate.CHECK_TOLERANCE[result["dtype"]]:
                refusal = (f"train.py reported val_bpb {result['val_bpb']:.6f}, the harness measured "
                           f"{evaluation['val_bpb']:.6f}")
            _atomic_json(run_dir / "evaluation.json", evaluation)
        status = "refused" if refusal is not None else "crash" if crash is not None else "ok"
        return Execution(status, refusal or crash or "", result, evaluation, training)


def outside_seconds(config: dict, training: Training) -> float:
    """Seconds the training ran beyond its budget until its process ended, on the tag's clock (cpu: CPU seconds
    per thread)."""
    if config["clock"] == "cpu":
        took = (training.cpu_at_done or 0.0) / tag_threads(config)
    else:
        took = training.done_after if training.done_after is not None else training.wall
    return round(took - config["budget_s"], 3)


def test_threshold(rows: list[ledger.Row], config: dict, rule: str) -> float | None:
    """The val_bpb below which a run may be a new best, so the held-out test split is scored for it: the best
    single run (naive) or the champion's mean (stat)."""
    champ_row = decide.champion(rows)
    values = decide.samples(rows).get(champ_row.key, []) if champ_row else []
    if rule == "stat" and values:
        return fmean(values)
    best_row = ledger.best(rows, config["fingerprint"], config["budget_s"])
    return best_row.val_bpb if best_row else None


def result_row(config: dict, ex: Execution, rows: list[ledger.Row], rule: str, series: decide.Series | None,
               commit: str, description: str, run_id: str, seed: int, protection: str, config_id: str,
               repeat: int, **where) -> ledger.Row:
    """The ledger row of a finished execution, judged against the rows recorded before it."""
    common = dict(seed=seed, protection=protection, config=config_id, repeat=repeat, load=ex.training.load,
                  wall=ex.training.wall, outside_s=outside_seconds(config, ex.training) if ex.training.wall else None,
                  **where)
    if ex.status == "refused":
        return _row(config, commit, f"{description} [refused: {ex.reason}]", run_id, "refused", **common)
    if ex.status == "crash":
        return _row(config, commit, f"{description} [crash: {ex.reason}]", run_id, "crash", decision=(
            "crashed during its confirmation: discarded" if series is not None and series.kind == "candidate"
            else ""), **common)
    champ_row = decide.champion(rows)
    champ_values = decide.samples(rows).get(champ_row.key, []) if champ_row else []
    best_row = ledger.best(rows, config["fingerprint"], config["budget_s"])
    val_bpb = ex.evaluation["val_bpb"]
    cold_after = max(decide.COLD_COMPILE * config["budget_s"], decide.COLD_COMPILE_S)  # a new shape's first run
    cold = (ex.result.get("compile_seconds") or 0) > cold_after
    status, stats = judge(rows, rule, series, champ_row, champ_values, config_id, val_bpb,
                          best_row.val_bpb if best_row else None, cold)
    test_bpb = ex.evaluation.get("test_bpb")
    flags = [decide.identical_flag(rows, config_id, val_bpb, seed)]
    if status == "keep":
        flags.append(decide.test_gap_flag(rows, val_bpb, test_bpb, decide.pooled_noise(decide.samples(rows))))
    return _row(config, commit, description, run_id, status, val_bpb=val_bpb, memory_gb=ex.result["memory_gb"],
                steps=ex.result["num_steps"], test_bpb=test_bpb, flags="; ".join(f for f in flags if f), **stats,
                **common)


def run_experiment(repo: Path, description: str, seed: int = 42, timeout: float | None = None,
                   on_progress=None, log=print, sandbox_mode: str | None = None, rule: str | None = None,
                   give_up=None) -> Outcome:
    """One run. Under the stat rule it is the next run of the open series if there is one (the baseline's
    repeats, a candidate's confirmation), else a new candidate: train.py as the agent left it. sandbox_mode,
    rule and timeout default to the tag's; weaker ones than the tag's are refused."""
    description = " ".join(description.split()) or "(no description)"
    config = load_tag(repo)
    recover(repo, log)
    try:
        protection = sandbox.protection(sandbox_mode or tag_sandbox_mode(config))
    except sandbox.SandboxError as e:
        raise HarnessError(str(e)) from None
    rule = rule or config.get("decision") or "stat"
    results = repo / "results.tsv"
    rows = ledger.read(results, config["tag"])
    series = decide.open_series(rows)
    if series is not None:
        if EDITABLE in git.changed_files(repo):
            raise HarnessError(
                f"The {series.kind} series of {series.commit} ({series.description!r}) is unfinished: "
                f"{series.runs} run(s) so far, a harness was killed during the next. It must finish before "
                f"another change runs. Set your edit aside and finish it: `git stash && autoresearch run -m "
                f"resume && git stash pop`.")
        if git.head(repo)[:7] != series.commit[:7]:
            git.reset_to(repo, git.git(repo, "rev-parse", series.commit), EDITABLE)
        repeat = sum(r.config == series.config for r in rows if r.status != "refused") + 1
        description = f"{series.description}{decide.REPEAT_MARK}{series.runs + 1}]"
        log(f"{series.kind} {series.commit}: run {series.runs + 1}")
    run_id = new_run_id()
    run_dir = state_dir(repo) / "runs" / run_id
    best_row = ledger.best(rows, config["fingerprint"], config["budget_s"])
    best_before = best_row.val_bpb if best_row else None
    # Every run of a tag gets its own seed under the stat rule, so repeats are independent samples; the naive
    # rule keeps the one seed, like the public project.
    if rule == "stat":
        seed = seed + len(rows)
    where = dict(host=socket.gethostname(), device=device_label(config))

    def refuse(reason: str) -> NoReturn:
        ledger.append(results, _row(config, git.head(repo), f"{description} [refused: {reason}]", run_id,
                                    "refused", seed=seed, protection=protection, **where))
        raise Refused(f"Refused: {reason}")

    pins = pin_problems(config, protection, rule, timeout)
    if pins:
        refuse("; ".join(pins) + ". A tag's rules are fixed at setup: run without those options, or set up a new "
               "tag with the settings you want")
    changed = git.changed_files(repo)
    others = [p for p in changed if p != EDITABLE]
    if others:
        refuse(f"files other than {EDITABLE} changed ({', '.join(others[:5])}); only {EDITABLE} may be edited. "
               f"Undo them (`git checkout -- FILE`, or delete new files) and run again")
    size = (repo / EDITABLE).stat().st_size
    if size > config["max_train_bytes"]:
        refuse(f"{EDITABLE} has {size:,} bytes, more than this tag's limit of {config['max_train_bytes']:,} (set at "
               f"setup): a file that size carries data, not code. Remove what it embeds")
    problem = preflight(repo, config)
    if problem:
        refuse(problem)
    fixed = fixed_half(repo, config)
    base = compile_base(repo, config, rows, fixed, protection, log)
    if config["clock"] == "wall":  # a competing process would be measured, not train.py (load.py)
        waiting = state_dir(repo) / WAITING_FILE
        try:
            load.wait_until_quiet(log, on_wait=lambda text: _atomic_json(waiting, {"since": _now(), "text": text}),
                                  give_up=give_up)
        except load.Busy as e:
            raise MachineBusy(str(e)) from None
        finally:
            waiting.unlink(missing_ok=True)

    # From here on a kill at any moment is recovered: pending.json first, then the run directory and the commit.
    pending_path = state_dir(repo) / "pending.json"
    pending = {"run_id": run_id, "tag": config["tag"], "commit": None, "parent": git.head(repo),
               "description": description, "seed": seed, "started": _now(), "protection": protection,
               "processes": []}
    _atomic_json(pending_path, pending)
    fault_point("pending-written")
    run_dir.mkdir(parents=True)
    commit = git.commit_file(repo, EDITABLE, description) if EDITABLE in changed else git.head(repo)
    fault_point("committed")
    config_id = _config_of(repo, commit)
    if series is None:
        repeat = sum(r.config == config_id for r in rows if r.status != "refused") + 1
    pending.update(commit=commit, config=config_id, repeat=repeat)
    _atomic_json(pending_path, pending)

    ex = execute(repo, config, run_dir, seed, pending, pending_path, protection, fixed, timeout, on_progress,
                 test_threshold(rows, config, rule), series.runs + 1 if series else 1, base)
    outcome_row = result_row(config, ex, rows, rule, series, commit, description, run_id, seed, protection,
                             config_id, repeat, **where)
    log_path = run_dir / "run.log"
    if ex.status == "ok":  # the public protocol's last line, now the harness's number
        append_line(log_path, prepare_contract().final_line(outcome_row.val_bpb, outcome_row.memory_gb,
                                                            outcome_row.steps))
    fault_point("recording")
    ledger.append(results, outcome_row)
    fault_point("recorded")
    publish_log(repo, log_path)
    if outcome_row.status not in ("keep", "confirm"):
        git.reset_to(repo, last_kept_commit(repo, config, rows), EDITABLE)
        fault_point("reset")
    if outcome_row.status != "keep":
        drop_model(run_dir)
    pending_path.unlink()
    return Outcome(row=outcome_row, best_before=best_before, log_tail=_tail(log_path), run_dir=run_dir,
                   result=ex.result, evaluation=ex.evaluation)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def publish_log(repo: Path, log_path: Path) -> None:
    """The finished run's log as repo/run.log, for agents that follow the public protocol. Read as a regular file
    only: a link left in its place would otherwise copy whatever it points to into the work tree."""
    try:
        data = evaluate.read_regular(log_path, 4 * LOG_KEEP)
    except (OSError, evaluate.Unsafe) as e:
        data = f"(the run's log could not be read: {e})\n".encode()
    tmp = state_dir(repo) / f".run.log.{uuid.uuid4().hex[:8]}.tmp"  # same filesystem, outside the work tree
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, repo / "run.log")


def append_line(path: Path, line: str) -> None:
    """Append to a harness file, never through a link."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    except OSError:
        return
    with os.fdopen(fd, "a") as f:
        f.write(line + "\n")


def drop_model(run_dir: Path) -> None:
    """Only kept models are worth their disk."""
    contract = prepare_contract()
    for name in (contract.TENSORS_FILE, contract.GRAPH_FILE):
        (run_dir / sandbox.OUT_DIR / name).unlink(missing_ok=True)


def compile_base(repo: Path, config: dict, rows: list[ledger.Row], fixed: Fixed, protection: str,
                 log=print) -> Path | None:
    """The compile cache this tag's next run starts from: the champion's base, filled by a compile phase the
    first time (compiled.py); None when the tag was set up with AUTORESEARCH_COMPILE_CACHE=off."""
    if config.get("compile_cache", "champion") == "off":
        return None
    champion = last_kept_commit(repo, config, rows)
    source = git.git(repo, "show", f"{champion}:{EDITABLE}", strip=False)
    return compiled.ensure_base(fixed.cache, _config_of(repo, champion), source, fixed.source, fixed.manifest,
                                config.get("peak_flops"), protection, tag_threads(config), log)


def judge(rows, rule, series, champ_row, champ_values, config_id, val_bpb, best_before,
          cold: bool = False) -> tuple[str, dict]:
    """The status of a finished run and the statistics its row carries (decide.py)."""
    values = decide.samples(rows)
    values[config_id] = values.get(config_id, []) + [val_bpb]
    mine = values[config_id]
    noise = decide.pooled_noise(values)
    stats = {"mean": fmean(mine), "n": len(mine), "sem": decide.sem(mine, noise) if noise else None}
    if rule == "naive":
        better = best_before is None or val_bpb < best_before
        return ("keep" if better else "discard"), dict(stats, decision="naive: " + (
            "first run" if best_before is None else f"{'below' if better else 'not below'} the best {best_before:.6f}"))
    if champ_row is None or (series is not None and series.kind == "baseline"):
        return "keep", dict(stats, decision=f"baseline {len(mine)}/{decide.BASELINE_RUNS}")
    if config_id == champ_row.key:
        return "keep", dict(stats, decision="a repeat of the champion")
    verdict = decide.decide(mine, champ_values, noise, cold=cold)
    return verdict.status, dict(stats, p_better=verdict.p, decision=verdict.reason)


def crash_hint(commit: str) -> str:
    """What to do after a crash: train.py is back at the champion, the crashed one is in git."""
    return (f"train.py is back at the last kept commit; the train.py that crashed is commit {commit}. To fix it "
            f"rather than start over: `git show {commit}:train.py > train.py`, edit, and run again")


def summary(outcome: Outcome) -> str:
    row, result = outcome.row, outcome.result
    if row.status == "refused":
        return (f"refused: {row.description}\n--- the branch is back on the last kept commit; the rules are in "
                f"program.md")
    if row.status == "crash":
        return (f"crash: {row.description}\n--- last 50 lines of the log ({outcome.run_dir / 'run.log'}) ---\n"
                f"{outcome.log_tail}\n--- {crash_hint(row.commit)}")
    config = f"mean {row.mean:.6f}" + (f" +- {row.sem:.6f}" if row.sem is not None else "") + f" over {row.n} run(s)"
    p = "" if row.p_better is None else f" | P(better) {row.p_better:.3f}"
    after = {"keep": "the branch holds it", "confirm": "it runs again, with another seed",
             "discard": "train.py is back at the champion"}[row.status]
    return (f"{row.status}: val_bpb={row.val_bpb:.6f} | {config}{p} | {row.decision} | steps={row.steps} "
            f"| memory_gb={row.memory_gb:.1f} | tok/s={result.get('tokens_per_second', 0):.0f} | wall={row.wall_s:.0f}s "
            f"| load={row.load or 0:.2f} | commit={row.commit} | {after}")
