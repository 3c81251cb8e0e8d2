"""The processes a run starts, and how the harness ends them: every process of a training's tree, and nothing else.

A process is identified by its pid and its start time, so a pid the system has reused for something else is
never killed in our name. The harness becomes a subreaper, so orphans of a training (a daemonized child, a
setsid escapee) stay in the tree it kills; on Linux each training also dies with its parent (tied_to_parent).
"""

from __future__ import annotations

import os
import signal
import sys

import psutil

def identity(pid: int) -> list | None:
    """[pid, start time] of a live process, None if there is none."""
    try:
        return [pid, psutil.Process(pid).create_time()]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def same_process(ident) -> psutil.Process | None:
    """The process with this recorded identity, if it is still the same process."""
    try:
        pid, started = ident
        proc = psutil.Process(int(pid))
        if abs(proc.create_time() - float(started)) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, TypeError, ValueError):
        pass
    return None


def kill_all(identities, grace: float = 5.0) -> int:
    """SIGTERM every recorded process that is still itself, then SIGKILL what is left after grace seconds.
    Returns how many were signalled."""
    procs = [p for p in (same_process(i) for i in identities) if p is not None]
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace) if procs else ([], [])
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
    return len(procs)


def reap(identities) -> None:
    """Collect the exit status of recorded processes that ended as our children (orphans that became ours as
    subreaper), so that none is left as a zombie over a night of runs."""
    me = os.getpid()
    for ident in identities:
        try:
            pid = int(ident[0])
            proc = psutil.Process(pid)
            if proc.ppid() == me and proc.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError, TypeError, ValueError, IndexError):
            continue


PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36  # prctl(2) options (linux/prctl.h)


def _prctl(option: int, value: int) -> bool:
    """prctl(option, value) on Linux; False where it does not exist or fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def not_dumpable() -> bool:
    """Linux: no other non-root process of this uid may ptrace this one or open its /proc memory and files
    (PR_SET_DUMPABLE 0). A harness that trains without a sandbox runs the training as the same user: without this
    (and without Yama's ptrace scope) the training could write the harness's memory. Its children are dumpable
    again after exec, as they must be for the harness to read their /proc."""
    return _prctl(PR_SET_DUMPABLE, 0)


def become_subreaper() -> bool:
    """Linux: orphaned descendants (a daemon that double-forks, a setsid escapee whose parent died) are
    re-parented to this process instead of init, so they stay in its process tree and can be found."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def descendants(spare=()) -> list[list]:
    """Identities of every live descendant of this process (zombies left out), less the subtrees rooted at the
    pids in `spare` (an evaluator started early, in its own sandbox)."""
    spare = set(spare)
    out = []
    for child in psutil.Process().children(recursive=True):
        try:  # by ancestry, checked per process: one forked in the spare tree a moment ago is still spare
            if child.pid in spare or any(a.pid in spare for a in child.parents()):
                continue
            if child.status() != psutil.STATUS_ZOMBIE:
                out.append([child.pid, child.create_time()])
        except psutil.Error:
            continue
    return out


def reap_zombies(keep=()) -> None:
    """Collect every child of this process that has ended (orphans of a training re-parented here as its
    subreaper), but those in `keep` (a Popen's own child, whose status its owner collects): so that their CPU
    time counts in this process's RUSAGE_CHILDREN. A grandchild that lives 50 ms between two polls is never
    seen alive; uncollected, its CPU counted nowhere (benchmarks/redteam.py, hidden-cpu)."""
    for child in psutil.Process().children():
        try:
            if child.pid not in keep and child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            continue


def end_descendants(spare=(), rounds: int = 5) -> list[list]:
    """Kill every descendant of this process but the `spare` subtrees, in rounds: one forked while its parent
    was being killed is re-parented here (become_subreaper) and found by the next round. Returns those still
    alive after the last round: none, unless a process cannot be killed."""
    left = descendants(spare)
    for _ in range(rounds):
        if not left:
            break
        kill_all(left, grace=0.5)
        reap(left)
        left = descendants(spare)
    return left


# Exec'd in front of a command: it dies (SIGKILL) when the process that started it dies, e.g. a Ray worker killed
# with its node, which leaves no one to kill a training in its own session. PR_SET_PDEATHSIG is 1 and outlives
# exec; the parent check covers a parent that died before the prctl.
_TIED = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0); "
         "os.getppid() == int(sys.argv[1]) or os._exit(70); os.execvp(sys.argv[2], sys.argv[2:])")


def tied_to_parent(argv: list[str]) -> list[str]:
    """argv, made to die with this process (Linux; elsewhere argv unchanged)."""
    if not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-c", _TIED, str(os.getpid()), *argv]


def kill_recorded(processes: list) -> None:
    """Kill the processes of a recorded run (pending.json's "processes", the leader first): the leader's process
    group, then every process of its tree that was seen, each only if it is still the process that was recorded."""
    leader = same_process(processes[0]) if processes else None
    if leader is not None:
        try:
            os.killpg(leader.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    kill_all(processes)
