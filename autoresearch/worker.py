"""A worker of `autoresearch loop --workers N`: one device, its own working copy, runs exactly as `autoresearch run`.

driver.py makes each worker a Ray actor holding k CPU cores (or one GPU and k cores). The worker
- makes its own working copy of the repository found on its machine: a `git clone --shared` at the tag's base
  commit, in a folder beside the data cache (~/.cache/autoresearch-workers/<tag>-<repo hash>/<name>), outside
  every repository the guard watches;
- refuses to join when its machine cannot give comparable results: another fixed half (prepare.py, the data:
  checked by fingerprint), other hardware, fewer cores than the tag's threads per run;
- runs each candidate (its train.py and the tag's seed) with execute.execute: the sandbox, the hard timeout, the
  process group, the integrity checks and the harness's evaluation, with the tag's budget and clock and the
  thread count set explicitly (Ray sets OMP_NUM_THREADS=1 in its workers);
- returns what happened, and nothing else: only the driver writes results.tsv and moves the branch.

It is a plain class so that it can be tested without Ray; driver.py wraps it with ray.remote.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from dataclasses import asdict
from pathlib import Path

from autoresearch import (baseline, compiled, errors, execute, fixed, git, ledger, machine, processes, record, sandbox,
                          state, supervise, tags)
from autoresearch.tagconfig import Tag


class WorkerRefused(RuntimeError):
    """This machine cannot run the tag's experiments comparably; the message says why and what to do."""


def workers_dir(tag: str, repo: Path | str) -> Path:
    """Where the working copies of one tag of one repository live on this machine."""
    import hashlib

    import prepare
    cache = prepare.cache_dir().resolve()
    key = hashlib.sha256(str(Path(repo).resolve()).encode()).hexdigest()[:8]
    return cache.parent / f"{cache.name}-workers" / f"{tag}-{key}"


def _find_repo(path: str) -> Path:
    """The repository on this machine: AUTORESEARCH_REPO where it is set (a machine that keeps it elsewhere),
    else the driver's path."""
    where = Path(os.environ.get("AUTORESEARCH_REPO") or path)
    if not (where / "prepare.py").exists() or not (where / ".git").exists():
        raise WorkerRefused(f"{socket.gethostname()} has no clone of the repository at {where}: clone it there "
                            "(and `pip install -e .` it), or set AUTORESEARCH_REPO to its path before `ray start`.")
    return where


def host_name() -> str:
    """The machine, and under Ray the node (several nodes may share a machine, as in the tests)."""
    try:
        import ray
        if ray.is_initialized():
            return f"{socket.gethostname()}:{ray.get_runtime_context().get_node_id()[:6]}"
    except ImportError:
        pass
    return socket.gethostname()


def _exit_with_parent() -> None:
    """End this process when its parent (Ray's raylet) dies: a driver killed with its local runtime takes the
    raylet along, and a worker re-parented to a subreaper (tmux, a container's init, a harness) may otherwise
    outlive it. Its training is tied to it (processes.tied_to_parent) and ends too."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


class Worker:
    def __init__(self, repo_path: str, config: Tag, name: str, sandbox_mode: str = "auto"):
        self.config, self.name = config, name
        self.host = host_name()
        self.threads = config.threads_per_run()
        self.error = None
        _exit_with_parent()
        processes.not_dumpable()  # its trainings may run as this user
        try:
            self._setup(repo_path, sandbox_mode)
        except (WorkerRefused, errors.HarnessError, git.GitError, sandbox.SandboxError) as e:
            self.error = str(e)
        except Exception as e:  # noqa: BLE001 - whatever it is, the driver shows it instead of a dead actor
            self.error = f"{type(e).__name__}: {e}"

    def _setup(self, repo_path: str, sandbox_mode: str) -> None:
        import prepare
        config = self.config
        # The tag's budget and clock, and the thread count, for this process and everything it starts.
        os.environ["AUTORESEARCH_TIME_BUDGET"] = ledger.format_budget(config.budget_s)
        os.environ["AUTORESEARCH_BUDGET_CLOCK"] = config.clock
        os.environ["OMP_NUM_THREADS"] = str(self.threads)
        if prepare.load_manifest() is None:
            raise WorkerRefused(f"{self.host} has no prepared data in {prepare.cache_dir()}: run `python prepare.py` "
                                "there with the same settings as on the driver (or copy the cache directory).")
        source = _find_repo(repo_path)
        self.driver_repo = Path(repo_path)
        self.copy = workers_dir(config.tag, source) / self.name
        base = config.base_commit
        if git.git(source, "cat-file", "-t", base, check=False) != "commit":
            raise WorkerRefused(f"the repository on {self.host} ({source}) lacks the tag's base commit {base[:12]}: "
                                "`git pull` it there.")
        if not (self.copy / ".git").exists():
            if self.copy.exists():
                shutil.rmtree(self.copy)
            self.copy.parent.mkdir(parents=True, exist_ok=True)
            git.git(source, "clone", "-q", "--shared", "--no-checkout", str(source), str(self.copy))
        self._recover()
        git.git(self.copy, "checkout", "-q", "-f", "--detach", base)
        git.git(self.copy, "clean", "-q", "-f", "-d", "-x", "-e", f"/{state.STATE_DIR}/")
        problem = tags.preflight(self.copy, config, worker=True)
        if problem:
            raise WorkerRefused(f"{self.name} on {self.host} refuses to join: {problem}")
        self.fixed = fixed.of_tag(self.copy, config)
        self.protection = sandbox.protection(sandbox_mode)
        if config.protection == "bwrap" and self.protection != "bwrap":
            raise WorkerRefused(f"{self.name} on {self.host} refuses to join: the tag runs every training in the "
                                "bubblewrap sandbox, and it does not work here (install bubblewrap)")
        self.device = config.device_label(machine.hardware())

    def _recover(self) -> None:
        """A worker of this name that died mid-run left its pending record: end whatever it started."""
        path = state.pending_file(self.copy)
        try:
            pending = record.read_pending(self.copy)
        except errors.HarnessError:
            pending = None
        if pending is not None:
            processes.kill_recorded(pending.processes)
        path.unlink(missing_ok=True)

    def join(self) -> dict:
        """Who this worker is, or why it refuses to join."""
        if self.error:
            return {"error": self.error, "worker": self.name, "host": self.host}
        return {"worker": self.name, "host": self.host, "device": self.device, "protection": self.protection,
                "copy": str(self.copy), "pid": os.getpid()}

    def run(self, job: dict) -> dict:
        """One run of a Trial (record.Trial, as a dict: Ray's) with its train.py (source); the execution, for the
        driver to record."""
        if self.error:
            raise WorkerRefused(self.error)
        trial = record.Trial.from_json(job)
        (self.copy / state.EDITABLE).write_text(trial.source)
        where = {"worker": self.name, "host": self.host, "device": self.device, "protection": self.protection}
        problem = tags.preflight(self.copy, self.config, worker=True)
        if problem:  # this machine changed since it joined (its data, say): every later run would be refused too
            return dict(where, status="refused", reason=problem, result=None, evaluation={},
                        training=asdict(supervise.Training(None, False, None, 0.0)), log="", retire=True)
        run_dir = state.run_dir(self.copy, trial.run_id)
        run_dir.mkdir(parents=True)
        pending = record.Pending(state.pending_file(self.copy), trial)
        pending.write()
        base = None
        if self.config.compile_cache != "off" and trial.source:
            try:  # the run's own configuration's base, new ones from a copy of the tag's base's
                wanted = compiled.Wanted(trial.config, trial.source, trial.compile_from)
                base = compiled.watched(self.copy, self.protection, lambda: compiled.ensure_base(
                    self.fixed, self.config, wanted, self.protection, log=lambda *a: None))
            except compiled.Tampered as e:
                pending.path.unlink(missing_ok=True)
                return dict(where, status="refused", reason=str(e), result=None, evaluation={},
                            training=asdict(supervise.Training(None, False, None, 0.0)), log="",
                            run_dir=str(run_dir), started=time.time())
        started = time.time()
        ex = execute.execute(execute.Context(self.copy, self.config, self.protection, self.fixed), execute.Attempt(
            run_dir, pending, compile_base=base,
            prune=baseline.Reference(**trial.pruning).check if trial.pruning else None))
        threshold = trial.test_threshold
        if ex.status != "ok" or (threshold is not None and ex.evaluation["val_bpb"] >= threshold):
            record.drop_model(run_dir)  # a model that may be a new best stays on this machine, in run_dir
        log_path = run_dir / state.RUN_LOG
        if base is not None:
            supervise.append_line(log_path, compiled.note(base))
        log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
        pending.path.unlink(missing_ok=True)
        return dict(where, status=ex.status, reason=ex.reason, result=ex.result, evaluation=ex.evaluation,
                    training=asdict(ex.training), log=log_text, run_dir=str(run_dir), started=started)

    def pid(self) -> int:
        return os.getpid()


# --- where a kept run lands ---------------------------------------------------------------------------------------

def keep_on_branch(repo: Path, job: record.Trial) -> str:
    """Move the branch to a kept candidate: its own commit when the branch is still on its parent, else a new
    commit of its train.py on top of the branch (a candidate kept after another one was), the candidate's own
    commit its second parent (what it was made from: git.parent_blobs). The commit."""
    head = git.head(repo)
    target = job.commit if head == job.parent else git.commit_with(repo, head, state.EDITABLE, job.source,
                                                                    job.description, merged=job.commit)
    git.reset_to(repo, target, state.EDITABLE)
    return target
