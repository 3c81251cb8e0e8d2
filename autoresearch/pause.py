"""A confined agent is paused while the harness trains: nothing it runs can share the machine with a run it is
judged by.

Why: on the wall clock a process kept busy beside a run takes its steps. An agent started by hand
(`autoresearch agent`) lives beside the harness all night and may keep processes running, so it could slow the
runs that judge it: a control of the control rule (a change that does nothing then looks better beside it), a
champion's run, the baseline. The row's `load` (the cores others kept busy) records such load, but a red team
found no margin on it that holds: a hog a quarter of a core strong, under any margin the machine's own noise
allows, still kept a no-op 10-38% of the time, and a nice-19 hog inflates a run's `load` for nothing
(BENCHMARKS.md, Decisions on a drifting machine). So the load is not measured and judged: it is impossible.

How: `autoresearch agent` (broker.py) starts its sandbox in a freezer cgroup of its own (agentcgroup.py) and
registers it here, in the repository's state directory, which the agent cannot write: bubblewrap's pid (and its
start time) and the cgroup. Every command that trains (`run`, `loop`: cli.py) holds `paused(repo)` from the moment
it holds the repository's lock: the kernel freezes each registered agent's cgroup, and the pause begins once it
reports it frozen, before anything is measured or trained. A frozen task runs nothing, whatever signal it gets: a
SIGCONT timer of the agent's own (the attack that undid a pause by SIGSTOP) does not thaw it. While the pause is
held a thread checks every CHECK_EVERY that each cgroup is still frozen, freezes it again if not, and kills it if
that fails; a cgroup that cannot be frozen, or whose freezing the kernel does not confirm within
agentcgroup.FREEZE_WAIT, is killed (fail closed: an agent registered with a freezer is never paused with less). At the
end it is thawed. If the command dies by SIGKILL, the broker's watchdog thaws what it froze once the repository's
lock is free (the kernel releases it with its holder), within WATCH_EVERY.

Where there is no freezer (no writable cgroup: agentcgroup.Freezer says so as the agent starts), the registered
sandbox is paused as before, and said so on every pause: every process descending from bubblewrap (confine.
wrap_agent unshares a pid namespace, whose init, a descendant, adopts every orphan, and a namespace the agent
nests inside it has its init in the tree too) is sent SIGSTOP until a scan of /proc finds every one stopped, and
SIGCONT at the end. A SIGCONT timer of the agent's own undoes that (docs/integrity.md).

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
import sys
import threading
import time
from pathlib import Path

import psutil

from autoresearch import agentcgroup, errors, processes, state

REGISTRY = "agents"    # the state directory's folder of registered sandboxes, one JSON file each
STOP_TRIES = 200       # scans of /proc (a few seconds) before a process that will not stop is killed
WATCH_EVERY = 1.0      # seconds between two checks of the broker's watchdog
CHECK_EVERY = 1.0      # seconds between two checks that a held pause's cgroups are still frozen
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


def register(repo: Path, sandbox_pid: int, cgroup: Path | None = None) -> Path:
    """Note a running agent sandbox (its bubblewrap's pid) of this repository, and the freezer cgroup it started
    in (agentcgroup.Freezer; None: none here); its file (remove it when the sandbox ends)."""
    entry = registry(repo) / f"{sandbox_pid}.json"
    state.atomic_json(entry, {"process": processes.identity(sandbox_pid),
                              "freezer": None if cgroup is None else str(cgroup)})
    return entry


def registered(repo: Path) -> list[tuple[str, Path, Path | None]]:
    """(its bubblewrap's pid, the file listing what a pause stopped or froze, its freezer cgroup or None) of each
    agent sandbox of the repository that still runs (the same process: a pid is reused once its process is gone)."""
    found = []
    for entry in sorted(registry(repo).glob("*.json")) if registry(repo).is_dir() else []:
        try:
            data = json.loads(entry.read_text())
            ident, cgroup = data["process"], data.get("freezer")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if processes.same_process(ident) is not None:
            found.append((str(ident[0]), entry.with_suffix(".stopped"), None if cgroup is None else Path(cgroup)))
    return found


def hold(sandbox: str, cgroup: Path, note: Path) -> None:
    """Freeze the sandbox's cgroup, or kill every process of it (and of the sandbox's tree) if the kernel does not
    report it frozen: an agent set up with a freezer is never left running, nor paused with less."""
    state.atomic_json(note, {"frozen": str(cgroup)})
    if agentcgroup.freeze(cgroup):
        return
    print(f"autoresearch: the agent's freezer cgroup {cgroup} could not be frozen: the agent's sandbox is killed "
          "instead, so that nothing of it runs beside the run (docs/integrity.md)", file=sys.stderr)
    end(sandbox, cgroup)


def end(sandbox: str, cgroup: Path) -> None:
    """Kill the sandbox: its cgroup, and every process descending from its bubblewrap; PauseError if any lives."""
    killed = agentcgroup.kill(cgroup)
    for pid in [*members(sandbox), sandbox]:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + agentcgroup.FREEZE_WAIT
    while any(runs(pid) for pid in members(sandbox)) and time.monotonic() < deadline:
        time.sleep(0.01)
    if not killed or any(runs(pid) for pid in members(sandbox)):
        raise PauseError(f"the agent's sandbox {sandbox} could neither be frozen nor killed ({cgroup})")


class Keeper:
    """While a pause is held: every CHECK_EVERY, each frozen cgroup checked, frozen again if it was thawed, killed
    if that fails. `thawed`: the cgroups it found thawed."""

    def __init__(self, held: list[tuple[str, Path]]):
        self.held, self.thawed = held, []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._keep, daemon=True)
        self.thread.start()

    def _keep(self) -> None:
        while not self.done.wait(CHECK_EVERY):
            for sandbox, cgroup in self.held:
                if agentcgroup.frozen(cgroup) or self.done.is_set():
                    continue
                self.thawed.append(cgroup)
                print(f"autoresearch: the agent's freezer cgroup {cgroup} was thawed during a pause: frozen again",
                      file=sys.stderr)
                if not agentcgroup.freeze(cgroup):
                    try:
                        end(sandbox, cgroup)
                    except PauseError as e:
                        print(f"autoresearch: {e}", file=sys.stderr)

    def close(self) -> None:
        self.done.set()
        self.thread.join()


def release(note: Path) -> None:
    """Thaw or continue what a pause noted, and forget the note."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        done = json.loads(note.read_text())
        if "frozen" in done:
            agentcgroup.thaw(Path(done["frozen"]))
        else:
            cont(done["stopped"])
    note.unlink(missing_ok=True)


@contextlib.contextmanager
def paused(repo: Path):
    """Every registered agent of the repository frozen (or stopped, where it has no freezer), for the duration
    (cli.py: run and loop, under the lock). What its broker runs outside the sandbox is not the agent's code:
    `run` holds the lock, and the brokered commands that compute (broker.LOCKED: `sample` runs the model) take it
    too, so none runs beside a run."""
    done, held, keeper = [], [], None
    try:
        for sandbox, note, cgroup in registered(repo):
            done.append(note)
            if cgroup is None:
                print(f"autoresearch: the agent's sandbox {sandbox} has NO freezer: paused with SIGSTOP, which a "
                      "process of its own can undo (a SIGCONT timer; docs/integrity.md)", file=sys.stderr)
                stop(lambda sandbox=sandbox: members(sandbox), note)
            else:
                hold(sandbox, cgroup, note)
                held.append((sandbox, cgroup))
        keeper = Keeper(held) if held else None
        yield done
    finally:
        if keeper is not None:
            keeper.close()
        for note in done:
            release(note)


class Watchdog:
    """The broker's: thaws or continues what a pause froze or stopped once no command holds the repository's lock
    (a command that paused and died by SIGKILL never released it)."""

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
                with state.RepoLock(state.state_dir(self.repo), "autoresearch agent (continuing its paused agent)"):
                    for note in notes:
                        release(note)
            except state.LockHeld:
                continue  # a command holds it: it continues what it paused when it ends

    def close(self) -> None:
        self.done.set()
