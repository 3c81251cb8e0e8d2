"""A confined agent is paused while the harness trains: nothing it runs can share the machine with a run it is
judged by.

Why: on the wall clock a process kept busy beside a run takes its steps. An agent started by hand
(`autoresearch agent`) lives beside the harness all night and may keep processes running, so it could slow the
runs that judge it: a control of the control rule (a change that does nothing then looks better beside it), a
champion's run, the baseline. The row's `load` (the cores others kept busy) records such load, but a red team
found no margin on it that holds: a hog a quarter of a core strong, under any margin the machine's own noise
allows, still kept a no-op 10-38% of the time, and a nice-19 hog inflates a run's `load` for nothing
(BENCHMARKS.md, Decisions on a drifting machine). So the load is not measured and judged: it is impossible.

How: `autoresearch agent` (broker.py) registers its sandbox here, in the repository's state directory, which the
agent cannot write: bubblewrap's pid (and its start time). Every process the agent starts, however it
daemonises, stays a descendant of it: confine.wrap_agent unshares a pid namespace, whose init (a descendant)
adopts every orphan, and a namespace the agent nests inside it has its init in the tree too. Every command that
trains (`run`,
`loop`: cli.py) holds `paused(repo)` from the moment it holds the repository's lock: each registered agent's
processes are sent SIGSTOP until a scan of /proc finds every one of them stopped (a stopped process cannot fork,
so this ends), before anything is measured or trained, and SIGCONT when the command ends. A stopped process uses
no CPU, memory bandwidth or disk. If the command dies by SIGKILL, the broker's watchdog continues what it stopped
once the repository's lock is free (the kernel releases it with its holder), within WATCH_EVERY.

What an agent sees: its `autoresearch run` returns when the run ends, as before; a `--detach`ed run returns at
once, and the agent's next step happens after the run ends. An agent the user runs without `autoresearch agent`
is not confined and not paused (docs/integrity.md); the loop's own agents (`loop --agent`) end before their
proposal trains, and their pid namespace with them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil

from autoresearch import errors, lock, processes, state

REGISTRY = "agents"    # the state directory's folder of registered sandboxes, one JSON file each
STOP_TRIES = 200       # scans of /proc (a few seconds) before a process that will not stop is killed
WATCH_EVERY = 1.0      # seconds between two checks of the broker's watchdog
STOPPED = ("T", "t", "Z", "X")  # /proc/PID/stat states of a process that runs nothing


class PauseError(errors.HarnessError):
    pass


def stat(pid: str) -> tuple[str, str] | None:
    """(state, start time) of a process's main thread, from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], fields[19]
    except (OSError, IndexError):
        return None


def members(sandbox: str) -> list[str]:
    """The pids of every process descending from the sandbox's bubblewrap. Not the processes of its pid
    namespace: one the agent nests inside it (`unshare -Upf` works there) has another, and an orphan is
    re-parented to its namespace's init, which is a descendant, so no process of the sandbox leaves the tree."""
    try:
        return [str(child.pid) for child in psutil.Process(int(sandbox)).children(recursive=True)]
    except (psutil.Error, ValueError):
        return []


def runs(pid: str) -> bool:
    """Whether a thread of the process may still run: /proc/PID/stat is its main thread's, which shows Z once it
    has exited while the others go on."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in STOPPED:
                    return True
        except (OSError, IndexError):
            continue
    return False


def stop(processes, note: Path | None = None) -> list[list[str]]:
    """SIGSTOP every process that processes() lists until all are stopped, every thread; the [pid, start time]
    of each it stopped (one stopped already, a job the user suspended, is left as it is). note: where the list is
    kept before each round of signals, for the watchdog. A process that will not stop (a vfork parent whose child
    blocks before exec waits where SIGSTOP cannot reach it, SIGKILL can) is killed; PauseError if even that fails."""
    sent: list[list[str]] = []
    running: list[list[str]] = []
    for attempt in range(STOP_TRIES + 50):
        running = [[pid, st[1]] for pid in processes() if runs(pid) and (st := stat(pid)) is not None]
        if not running:
            return sent
        sent += [r for r in running if r not in sent]
        if note is not None:
            state.atomic_json(note, {"stopped": sent})
        for pid, _ in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL if attempt >= STOP_TRIES else signal.SIGSTOP)
        time.sleep(0.01)
    raise PauseError(f"processes of the agent's sandbox did not stop: {', '.join(p for p, _ in running[:5])}")


def cont(stopped: list[list[str]]) -> None:
    """SIGCONT each process stopped (still the one it was: the same start time)."""
    for pid, started in stopped:
        st = stat(pid)
        if st is not None and st[1] == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGCONT)


def registry(repo: Path) -> Path:
    return state.state_dir(repo) / REGISTRY


def register(repo: Path, sandbox_pid: int) -> Path:
    """Note a running agent sandbox (its bubblewrap's pid) of this repository; its file (remove it when the
    sandbox ends)."""
    entry = registry(repo) / f"{sandbox_pid}.json"
    state.atomic_json(entry, {"process": processes.identity(sandbox_pid)})
    return entry


def registered(repo: Path) -> list[tuple[str, Path]]:
    """(its bubblewrap's pid, the file listing what a pause stopped) of each agent sandbox of the repository that
    still runs (the same process: a pid is reused once its process is gone)."""
    found = []
    for entry in sorted(registry(repo).glob("*.json")) if registry(repo).is_dir() else []:
        try:
            ident = json.loads(entry.read_text())["process"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if processes.same_process(ident) is not None:
            found.append((str(ident[0]), entry.with_suffix(".stopped")))
    return found


@contextlib.contextmanager
def paused(repo: Path):
    """Every registered agent of the repository stopped, for the duration (cli.py: run and loop, under the lock).
    What its broker runs outside the sandbox is not the agent's code: `run` holds the lock, and the brokered
    commands that compute (broker.LOCKED: `sample` runs the model) take it too, so none runs beside a run."""
    done = []
    try:
        for sandbox, note in registered(repo):
            done.append(note)
            stop(lambda sandbox=sandbox: members(sandbox), note)
        yield done
    finally:
        for note in done:
            with contextlib.suppress(OSError, ValueError, KeyError):
                cont(json.loads(note.read_text())["stopped"])
            note.unlink(missing_ok=True)


class Watchdog:
    """The broker's: continues what a pause stopped once no command holds the repository's lock (a command that
    paused and died by SIGKILL never continued it)."""

    def __init__(self, repo: Path):
        self.repo = repo
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.done.wait(WATCH_EVERY):
            notes = list(registry(self.repo).glob("*.stopped")) if registry(self.repo).is_dir() else []
            if not notes:
                continue
            try:  # held, no command can be pausing meanwhile
                with lock.RepoLock(state.state_dir(self.repo), "autoresearch agent (continuing its paused agent)"):
                    for note in notes:
                        with contextlib.suppress(OSError, ValueError, KeyError):
                            cont(json.loads(note.read_text())["stopped"])
                        note.unlink(missing_ok=True)
            except lock.LockHeld:
                continue  # a command holds it: it continues what it paused when it ends

    def close(self) -> None:
        self.done.set()
