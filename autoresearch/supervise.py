"""Supervising one training: its process tree, its output, its clock.

run_training starts train.py in its own process group (inside the sandbox when there is one), copies its output
to run.log (capped: the first and last LOG_KEEP bytes), records every process of its tree in pending.json as
it appears (so that a later recovery kills exactly those), watches for result.json and ends the whole tree at
the hard timeout or when the training's process ends. What it measured (exit status, seconds, CPU seconds, the
load of other processes) is a Training; judging it is execute.py's job.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autoresearch import descriptions, fixed, ledger, machine, processes, sandbox, scratch, state

LOG_KEEP = 2 << 20    # bytes of a run's output kept from its start, and as many from its end


def progress(log_path: Path) -> tuple[float | None, str | None]:
    """Training seconds elapsed according to the newest step line in the log (runtime.STEP_RE), and that line."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            text = f.read().decode(errors="replace")
    except OSError:
        return None, None
    found = list(fixed.runtime().STEP_RE.finditer(text))
    if not found:
        return None, None
    line = descriptions.printable(text[found[-1].start():].split("\n", 1)[0].strip())
    return float(found[-1]["elapsed"]), line


@dataclass
class Training:
    code: int | None        # exit status, None when killed at the timeout
    timed_out: bool
    result_after: float | None  # seconds from the start until result.json first appeared, by the harness's clock
    wall: float
    cpu_at_result: float | None = None  # CPU seconds of the training's processes when result.json appeared
    load: float | None = None   # cores other processes kept busy meanwhile
    survivors: int = 0          # processes of its tree still alive after it was ended (none, unless unkillable)
    done_after: float | None = None  # seconds from the start until the training's process ended
    cpu_at_done: float | None = None  # CPU seconds of its processes until then
    rewritten: list | None = None  # contract files (result, model) changed after result.json first appeared
    pruned: str | None = None   # why it was stopped early (baseline.py), None when it was not


def files_state(out: Path) -> dict:
    """The contract files in out/ by identity (inode, size, mtime): a second write shows as a change."""
    found = {}
    for name in fixed.contract_files():
        try:
            st = os.lstat(out / name)
            found[name] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
        except OSError:
            found[name] = None
    return found


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


@dataclass
class Launch:
    """How one training starts: train.py in `repo` with the run's seed, directory and data view, inside `wrap`
    (the sandbox's argv wrapper, sandbox.wrap) if given, on the tag's clock and threads, killed after timeout s."""
    repo: Path
    run_dir: Path
    seed: int
    timeout: float
    view: Path
    wrap: Callable[[list[str]], list[str]] | None = None
    clock: str = "wall"
    threads: int = 1
    spare: tuple = ()  # pids whose trees are not the training's: an evaluator started early, in its own sandbox
    cgroup: object = None  # its runcgroup.RunCgroup: the kernel's count of its CPU time, its processes; None: none
    file_limit: int | None = None  # bytes any file it writes may reach (RLIMIT_FSIZE; scratch.limit_files)
    budget: float | None = None  # a budget other than this process's (a verification's longer one, verify.py)

    def environment(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTORESEARCH_", "TORCHINDUCTOR_"))}
        env.update(AUTORESEARCH_RUN_DIR=str(self.run_dir / sandbox.OUT_DIR), AUTORESEARCH_CACHE=str(self.view),
                   PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1")
        env[fixed.runtime().SEED_ENV] = str(self.seed)
        if "AUTORESEARCH_TIME_BUDGET" in os.environ:
            env["AUTORESEARCH_TIME_BUDGET"] = os.environ["AUTORESEARCH_TIME_BUDGET"]
        if self.budget is not None:
            env["AUTORESEARCH_TIME_BUDGET"] = ledger.format_budget(self.budget)
        env.update(machine.clock_env(self.clock, self.threads))
        if (self.run_dir / sandbox.COMPILE_DIR).is_dir():
            env["TORCHINDUCTOR_CACHE_DIR"] = str(self.run_dir / sandbox.COMPILE_DIR)
        if self.wrap is not None:
            env["TMPDIR"] = "/tmp"
        return env


def run_training(launch: Launch, pending, on_progress=None, prune=None) -> Training:
    """Run train.py in its own process group (inside launch.wrap, the sandbox, if given), its output to
    run_dir/run.log (capped), watching for its result.json and recording every process of its tree in
    pending.json so that a later recovery can kill exactly those. Every descendant of this process but the
    launch.spare subtrees is the training's: it returns once all of them have ended, so that nothing of it runs
    beside the evaluation. prune(elapsed, step_line) -> a reason to stop the training now (baseline.py), or None."""
    processes.become_subreaper()  # orphans of the training become our children: still in the tree we kill
    log = CappedLog(launch.run_dir / state.RUN_LOG)  # created before the training exists
    argv = [sys.executable, state.EDITABLE]
    argv = launch.wrap(argv) if launch.wrap else argv
    if launch.cgroup is not None:  # every process it ever starts is charged there, reaped by anyone or not
        argv = launch.cgroup.wrap(argv)
    proc = subprocess.Popen(processes.tied_to_parent(argv), cwd=launch.repo,
                            env=launch.environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=scratch.limit_files(launch.file_limit) if launch.file_limit else None)
    log.start(proc.stdout)
    watch = _Watch(launch, proc, pending)
    try:
        while proc.poll() is None and watch.poll(on_progress, prune):
            time.sleep(0.2)
    finally:
        survivors = watch.end()
        log.close()
    return watch.training(len(survivors))


class _Watch:
    """One training watched from its start (run_training): its processes recorded in `pending` as they appear,
    when its result appeared and the CPU spent until then, its end (the whole tree killed) and what it used."""

    def __init__(self, launch: Launch, proc: subprocess.Popen, pending):
        self.launch, self.proc, self.pending, self.cgroup = launch, proc, pending, launch.cgroup
        self.out = launch.run_dir / sandbox.OUT_DIR
        self.result_file = fixed.contract().RESULT_FILE
        self.known = pending.processes = [processes.identity(proc.pid) or [proc.pid, 0.0]]
        pending.write()
        self.start = time.monotonic()  # not the wall clock: a root training without a sandbox can set that back
        self.meter = machine.Meter()
        self.children_before = children_cpu()
        self.result_after = self.cpu_at_result = self.written = self.pruned = None
        self.timed_out = False

    def poll(self, on_progress, prune) -> bool:
        """One look at the training; False when it must end now (its timeout, or pruned)."""
        now = time.monotonic()
        if self.result_after is None and os.path.lexists(self.out / self.result_file):
            self.result_after = now - self.start
            self.cpu_at_result = (self.cgroup.cpu_seconds() if self.cgroup
                                  else machine.tree_cpu_seconds(self.known))
            self.written = files_state(self.out)
        if now - self.start > self.launch.timeout:
            self.timed_out = True
            return False
        processes.reap_zombies(keep={self.proc.pid, *self.launch.spare})
        tree = [i for i in processes.descendants(self.launch.spare) if i not in self.known]
        if tree:
            self.known += tree
            self.pending.write()
        if on_progress or prune:
            seen = progress(self.launch.run_dir / state.RUN_LOG)
            if on_progress:
                on_progress(*seen)
            if prune and self.result_after is None and (pruned := prune(*seen)):
                self.pruned = pruned
                return False
        return True

    def end(self) -> list:
        """The whole tree ended, whatever happened; what survived the kill (forked meanwhile)."""
        # The budget runs until the training's process ends, whenever it wrote its result: a placeholder
        # result.json written at once buys no time.
        proc, spare, cgroup, known = self.proc, self.launch.spare, self.cgroup, self.known
        self.done_after = time.monotonic() - self.start
        processes.reap_zombies(keep={*spare, *([proc.pid] if proc.returncode is None else [])})
        # every CPU second of the tree until now: the live processes', and the ended ones' (collected here)
        self.cpu_at_done = machine.tree_cpu_seconds(known) + (children_cpu() - self.children_before)
        if cgroup is not None:  # the kernel's count: every process of the tree, reaped by anyone or not
            self.cpu_at_done = cgroup.cpu_seconds()
        known += [i for i in processes.descendants(spare) if i not in known]
        processes.kill_recorded(known)  # pending.processes is `known`: leftovers, grandchildren, setsid escapees
        if cgroup is not None:
            cgroup.kill()  # and whatever is in its cgroup, seen or not
        proc.wait()
        processes.reap(known)
        survivors = processes.end_descendants(spare)  # forked while the tree was being killed: re-parented here
        if cgroup is not None:
            survivors += cgroup.pids()
        return survivors

    def training(self, survivors: int) -> Training:
        wall = time.monotonic() - self.start
        cgroup = self.cgroup
        tree_cpu = cgroup.cpu_seconds() if cgroup is not None else children_cpu() - self.children_before
        final = files_state(self.out)
        result_after, cpu_at_result, written = self.result_after, self.cpu_at_result, self.written
        if result_after is None and final[self.result_file] is not None:
            result_after, cpu_at_result, written = wall, tree_cpu, final
        rewritten = [name for name in final if written is not None and final[name] != written[name]]
        return Training(None if self.timed_out or self.pruned else self.proc.returncode, self.timed_out,
                        result_after, wall, cpu_at_result, round(self.meter.others(tree_cpu), 3), survivors,
                        self.done_after, max(self.cpu_at_done, 0.0) or tree_cpu, rewritten, self.pruned)


def append_line(path: Path, line: str) -> None:
    """Append to a harness file, never through a link."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    except OSError:
        return
    with os.fdopen(fd, "a", errors="backslashreplace") as f:
        f.write(line + "\n")


def children_cpu() -> float:
    """CPU seconds of every child this process has waited for (the training, and orphans it reaped)."""
    import resource
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime
