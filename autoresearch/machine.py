"""What machine a tag's experiments run on: the hardware that decides how many steps fit in the budget.

Results are only comparable on the same hardware (an AVX-512 Xeon trains about twice as fast as an AVX2 EPYC
with the same 2 cores), so a tag records this at setup and a run on other hardware is refused. It is read
without importing torch, so every command stays fast.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import time
from importlib import metadata

import psutil



KEYS = ("device", "name", "cores", "torch")


def _cpu_name() -> str:
    """The model name, plus family/model and the widest vector unit: a VM often names only "Intel(R) Xeon(R)
    Processor", which says nothing about the generation."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
                if not line.strip():
                    break  # the first processor is enough
    except OSError:
        pass
    if "model name" in fields:
        flags = set(fields.get("flags", "").split())
        isa = next((name for name, flag in (("amx", "amx_tile"), ("avx512", "avx512f"), ("avx2", "avx2"))
                    if flag in flags), "no avx2")
        return f"{fields['model name']} (family {fields.get('cpu family')} model {fields.get('model')}, {isa})"
    if sys.platform == "darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=5).stdout.strip() or platform.machine()
        except (OSError, subprocess.TimeoutExpired):
            pass
    return platform.processor() or platform.machine()


def gpu_names() -> list[str]:
    """The names of this machine's NVIDIA GPUs, one per device (none without nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def _gpu_name() -> str | None:
    names = gpu_names()
    return names[0] if names else None


def hardware() -> dict:
    """device (cuda, mps or cpu), its name, the cores this process may use, and the torch version."""
    gpu = _gpu_name()
    if gpu:
        device, name = "cuda", gpu
    elif sys.platform == "darwin" and platform.machine() == "arm64":
        device, name = "mps", _cpu_name()
    else:
        device, name = "cpu", _cpu_name()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    return {"device": device, "name": name, "cores": cores, "torch": torch}


def describe(hw: dict) -> str:
    return f"{hw['device']} {hw['name']} ({hw['cores']} cores, torch {hw['torch']})"


def differences(recorded: dict, current: dict, ignore: tuple = ()) -> list[str]:
    return [f"{k} {recorded.get(k)!r} -> {current.get(k)!r}" for k in KEYS
            if k not in ignore and recorded.get(k) != current.get(k)]


# --- other processes' CPU use and the cpu clock -------------------------------------------------------------------
# Who else is using the machine: the load a run competes with, and the CPU its own training received.
#
# On 2 cores a second torch process cuts a run's throughput to a third (BENCHMARKS.md), and under a wall-clock
# budget that is a worse val_bpb for a reason that has nothing to do with train.py. So:
# - before a run on the wall clock, wait_until_quiet() waits while other processes keep more than limit() cores
#   busy (a tenth of the machine, at least half a core), saying so at once and every minute with the culprits'
#   names. A busy machine delays a night, it does not end it: the wait has no end unless AUTORESEARCH_LOAD_WAIT
#   gives one (then `autoresearch run` gives up with the culprits' names, and the loop waits again);
# - during every run, Meter measures the cores other processes kept busy (steal time of a VM included), which the
#   ledger records as `load`;
# - on the cpu clock (AUTORESEARCH_BUDGET_CLOCK=cpu) the run only counts the compute it received, so it does not
#   wait; the harness checks that clock with tree_cpu_seconds().

# Cores other processes may keep busy before a wall-clock run waits: a tenth of the machine, at least half a
# core (on 2 cores a second torch process cuts a run's throughput to a third; desktop daemons on a 64-core box
# keep a few cores busy without touching a run that uses 8). AUTORESEARCH_LOAD_LIMIT sets it in cores.
LOAD_SHARE, LOAD_MIN = 0.1, 0.5
SAMPLE = 0.5           # seconds of one load sample
TELL_EVERY = 60.0      # seconds between two "waiting for a quiet machine" lines


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


class Settings(ValueError):
    """A load setting that is not a number: the message names the variable."""


def _number_env(name: str) -> float | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value >= 0:
        raise Settings(f"{name}={raw!r} is not a number (unset it for the default).")
    return value


def max_wait() -> float:
    """Seconds `autoresearch run` waits for a quiet machine before giving up: none, unless AUTORESEARCH_LOAD_WAIT."""
    value = _number_env("AUTORESEARCH_LOAD_WAIT")
    return float("inf") if value is None else value


def limit(cores: int | None = None) -> float:
    """Cores other processes may keep busy before a wall-clock run waits (LOAD_SHARE of the machine)."""
    value = _number_env("AUTORESEARCH_LOAD_LIMIT")
    if value is not None:
        return value
    return max(LOAD_MIN, LOAD_SHARE * (cores or psutil.cpu_count() or 1))


def check_settings() -> None:
    """Raise Settings for a malformed load variable, before anything runs."""
    max_wait()
    limit()


def wait_until_quiet(log=print, on_wait=None, give_up=None) -> float:
    """Wait while other processes keep more than limit() cores busy, saying so at once and every TELL_EVERY
    seconds (on_wait(text) too, for `autoresearch status`); the load found last. Raises Busy after
    AUTORESEARCH_LOAD_WAIT seconds of a busy machine (no end without it), or as soon as give_up() is true (the
    loop's stop button or its --hours). 0.0, unmeasured, when the limit is the machine's cores or more."""
    most, wait = limit(), max_wait()
    if most >= (psutil.cpu_count() or 1):  # no load can exceed it (AUTORESEARCH_LOAD_LIMIT set that high): the
        return 0.0                         # 0.5 s sample would decide nothing
    start = time.monotonic()
    load = others_now()
    told = -TELL_EVERY
    while load > most:
        waited = time.monotonic() - start
        if give_up is not None and give_up():
            raise Busy("stopped while waiting for a quiet machine")
        if waited >= wait:
            culprits = heaviest()
            raise Busy(f"other processes keep {load:.1f} cores busy ({', '.join(culprits) or 'not one process'}), "
                       f"more than {most:g}, and a run on the wall clock would measure them, not train.py. Stop them, "
                       "or start a tag on the cpu clock (AUTORESEARCH_BUDGET_CLOCK=cpu, BENCHMARKS.md: Noise), "
                       "or unset AUTORESEARCH_LOAD_WAIT to wait as long as it takes.")
        if waited - told >= TELL_EVERY:
            text = (f"waiting for a quiet machine ({waited / 60:.0f} min so far): other processes keep {load:.1f} "
                    f"cores busy, more than {most:g} ({', '.join(heaviest()) or 'several processes'}); the run "
                    "starts when they stop")
            log(text)
            if on_wait:
                on_wait(text)
            told = waited
        time.sleep(2)
        load = others_now()
    return load
