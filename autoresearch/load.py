"""Who else is using the machine: the load a run competes with, and the CPU its own training received.

On 2 cores a second torch process cuts a run's throughput to a third (BENCHMARKS.md), and under a wall-clock
budget that is a worse val_bpb for a reason that has nothing to do with train.py. So:
- before a run on the wall clock, wait_until_quiet() waits (up to AUTORESEARCH_LOAD_WAIT seconds, default 600)
  while other processes keep more than LOAD_LIMIT cores busy, and then refuses with the culprits' names;
- during every run, Meter measures the cores other processes kept busy (steal time of a VM included), which the
  ledger records as `load`;
- on the cpu clock (AUTORESEARCH_BUDGET_CLOCK=cpu) the run only counts the compute it received, so it does not
  wait; the harness checks that clock with tree_cpu_seconds().
"""

from __future__ import annotations

import os
import time

import psutil

LOAD_LIMIT = 0.5       # cores kept busy by other processes above which a wall-clock run waits
DEFAULT_WAIT = 600.0   # seconds to wait for a quiet machine before refusing
SAMPLE = 0.5           # seconds of one load sample


class Busy(RuntimeError):
    pass


def _busy_seconds() -> float:
    t = psutil.cpu_times()
    return sum(getattr(t, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq", "steal"))


def tree_cpu_seconds(identities) -> float:
    """CPU seconds (user + system) of the recorded processes that are still alive, their reaped children
    included."""
    total = 0.0
    for pid, started in identities:
        try:
            proc = psutil.Process(int(pid))
            if abs(proc.create_time() - float(started)) > 0.01:
                continue
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except (psutil.Error, TypeError, ValueError):
            continue
    return total


class Meter:
    """Cores kept busy by processes other than this one and its recorded tree, between start and read."""

    def __init__(self):
        self.busy, self.wall = _busy_seconds(), time.monotonic()
        self.own = self._own()

    @staticmethod
    def _own() -> float:
        t = psutil.Process().cpu_times()
        return t.user + t.system

    def others(self, tree_cpu: float = 0.0) -> float:
        """tree_cpu: CPU seconds the run's own processes used since start (they are not "others")."""
        wall = time.monotonic() - self.wall
        if wall <= 0:
            return 0.0
        spent = _busy_seconds() - self.busy - (self._own() - self.own) - tree_cpu
        return max(0.0, spent / wall)


def others_now(seconds: float = SAMPLE) -> float:
    meter = Meter()
    time.sleep(seconds)
    return meter.others()


def heaviest(n: int = 3) -> list[str]:
    """The processes using the most CPU right now, as 'name (pid N, X% of a core)'."""
    procs = list(psutil.process_iter(["pid", "name"]))
    for p in procs:
        try:
            p.cpu_percent(None)
        except psutil.Error:
            pass
    time.sleep(SAMPLE)
    usage = []
    me = os.getpid()
    for p in procs:
        try:
            if p.pid != me:
                usage.append((p.cpu_percent(None), p.info["name"], p.pid))
        except psutil.Error:
            continue
    usage.sort(reverse=True)
    return [f"{name} (pid {pid}, {pct:.0f}% of a core)" for pct, name, pid in usage[:n] if pct >= 10]


def clock_env(clock: str, threads: int) -> dict:
    """The training process's environment for a budget clock. On the cpu clock waiting threads sleep instead of
    spinning (a thread spinning while its peer is descheduled bills the budget for nothing: BENCHMARKS.md,
    Noise), and the thread count is set, as the clock divides by it. The thread count is set on the wall clock
    too: Ray sets OMP_NUM_THREADS=1 in its workers, and an unset count lets every run take every core."""
    env = {"AUTORESEARCH_BUDGET_CLOCK": clock, "OMP_NUM_THREADS": str(threads)}
    if clock == "cpu":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def max_wait() -> float:
    raw = os.environ.get("AUTORESEARCH_LOAD_WAIT", "").strip()
    if not raw:
        return DEFAULT_WAIT
    try:
        return max(0.0, float(raw))
    except ValueError:
        raise Busy(f"AUTORESEARCH_LOAD_WAIT={raw!r} is not a number of seconds.") from None


def wait_until_quiet(log=print, limit: float = LOAD_LIMIT) -> float:
    """Wait while other processes keep more than `limit` cores busy; the load found last. Raises Busy after
    AUTORESEARCH_LOAD_WAIT seconds of a busy machine."""
    deadline = time.monotonic() + max_wait()
    load = others_now()
    told = 0.0
    while load > limit:
        if time.monotonic() >= deadline:
            culprits = heaviest()
            raise Busy(f"other processes keep {load:.1f} cores busy ({', '.join(culprits) or 'not one process'}), "
                       "and a run on the wall clock would measure them, not train.py. Stop them, or start a tag "
                       "on the cpu clock (AUTORESEARCH_BUDGET_CLOCK=cpu, see README: Noise), or set "
                       "AUTORESEARCH_LOAD_WAIT to wait longer.")
        if time.monotonic() - told > 60:
            log(f"waiting for a quiet machine: other processes keep {load:.1f} cores busy "
                f"({', '.join(heaviest()) or 'several processes'})")
            told = time.monotonic()
        time.sleep(2)
        load = others_now()
    return load
