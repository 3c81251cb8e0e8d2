"""A drifting machine, switched on: every training under a directory slowed by a hidden factor, in alternating
periods, so that the decision rule can be measured under a known drift as well as on a steady machine.

    python benchmarks/drift.py --under /tmp/decisions-x --slow 0.33 --period 180 --log drift.log   # until killed
    python benchmarks/decisions.py --budget 10 --aa 20 --drift 0.33:180                            # the same, inside

Why: a 2-core VM's speed drifts by a third for minutes at a time (56-64 steps per 30 s run, then 89-95), and
under a wall-clock budget a run made in a slow stretch gets fewer steps and a worse val_bpb, for a reason that
has nothing to do with train.py (BENCHMARKS.md, the A/A at 30 s; issue 33). Waiting for the machine to drift is
no benchmark; this makes the drift happen on a schedule, with a known size.

How: a SIGSTOP/SIGCONT duty cycle. In a slow period every CYCLE seconds the trainings are stopped for a share
`slow` of the cycle and continued for the rest, so they run at (1 - slow) of their speed (0.33: a third fewer
steps, like the VM); in a normal period they are left alone. The periods alternate, slow first, on a schedule
fixed at the start (phase_at), so a run's phase can be read back from its time. A training is any process whose
command line runs a `train.py` under the directory (an argument of that name whose path, or the process's
working directory, is under it: the harness's `python train.py`, its `bwrap ... train.py` sandbox, a benchmark's
training by hand), with every descendant and, where it leads a process group of its own (the harness starts one
with start_new_session), every member of that group. /proc is searched at the start of each slow period and every
SCAN_EVERY seconds during one, so a training that starts mid-period is slowed within a second.

Hidden from the harness: its load guard (autoresearch/machine.py) counts the CPU that OTHER processes keep
busy; a stopped training uses none (a stopped process is neither running nor in the load average), and this
process sleeps between a few kill() calls, well under a percent of a core (tests/test_drift.py measures it). On
the cpu budget clock (AUTORESEARCH_BUDGET_CLOCK=cpu) a stopped training's budget does not run, so the drift
costs it nothing but wall time: that clock is a remedy for a slow machine, this benchmarks the wall clock.

Never leaves a training stopped: SIGTERM, SIGINT and SIGHUP continue every training it stopped before it exits,
and a guardian process (started first, in its own session, deaf to those signals) continues them too when this
process dies by SIGKILL: it holds the other end of a pipe and acts on its end-of-file.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

DEFAULT_SLOW = 0.33     # share of each cycle a training is stopped in a slow period: it runs at 1 - slow of its speed
DEFAULT_PERIOD = 180.0  # seconds of each slow and each normal period: the VM's drift lasted minutes
CYCLE = 0.1             # seconds of one stop/continue cycle: short against a step (0.2-1 s on 2 cores), so every
                        # step is slowed evenly rather than some steps frozen whole
SCAN_EVERY = 1.0        # seconds between two searches of /proc during a slow period (each costs ~2 ms of CPU
                        # for ~200 processes): a training that starts mid-period is slowed within this
TRAINING = "train.py"   # the file whose runs are slowed

# The guardian: reads "pid starttime" lines of the processes drift stopped; at end of file (drift exited, however)
# it continues each one that is still the process it was told about.
_GUARDIAN = r"""
import os, signal, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
told = {}
for line in sys.stdin:
    pid, start = line.split()
    told[int(pid)] = start
def start_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None
for pid, start in told.items():
    if start_of(pid) == start:
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:
            pass
"""


def parse_setting(text: str) -> tuple[float, float]:
    """'SLOW:PERIOD' (decisions.py --drift) as (slow, period): '0.33:180'."""
    try:
        slow, period = (float(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"drift setting {text!r} is not SLOW:PERIOD, e.g. 0.33:180") from None
    check(slow, period, period)
    return slow, period


def check(slow: float, period: float, normal: float) -> None:
    if not 0 < slow <= 1:
        raise ValueError(f"slow {slow} is not a share of the time in (0, 1]")
    if period <= 0 or normal < 0:
        raise ValueError(f"periods {period}, {normal} must be positive")


def phase_at(elapsed: float, period: float, normal: float) -> tuple[str, float]:
    """The phase `elapsed` seconds after the start (slow first) and the seconds left in it."""
    into = elapsed % (period + normal)
    return ("slow", period - into) if into < period else ("normal", period + normal - into)


def slow_share(start: float, end: float, t0: float, period: float, normal: float, step: float = 0.5) -> float:
    """The share of [start, end] (epoch seconds) that fell in slow periods of a drift started at t0."""
    if end <= start:
        return 0.0
    n = max(1, int((end - start) / step))
    return sum(phase_at(start + (i + 0.5) * (end - start) / n - t0, period, normal)[0] == "slow"
               for i in range(n)) / n


# --- finding the trainings ----------------------------------------------------------------------------------


def _stat(pid: str) -> tuple[int, int, str] | None:
    """(ppid, process group, start time in clock ticks) of a process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[2]), fields[19]
    except (OSError, IndexError, ValueError):
        return None


def _is_under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _runs_training(pid: str, root: str) -> bool:
    """Whether the process's command line runs a train.py under root."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return False
    named = [a for a in argv[1:] if os.path.basename(a) == TRAINING]
    if not named:
        return False
    if any(os.path.isabs(a) and _is_under(a, root) for a in named):
        return True
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    return _is_under(cwd, root)


def _own_line() -> set[int]:
    """This process and its ancestors: never stopped, nor any process group they are in."""
    line, pid = set(), os.getpid()
    while pid > 1 and pid not in line:
        line.add(pid)
        stat = _stat(str(pid))
        if stat is None:
            break
        pid = stat[0]
    return line


def trainings(root: str | Path) -> dict[int, str]:
    """pid -> start time of every training process under root (see the top): the processes that run a train.py
    there, their descendants, and the members of the process groups they lead."""
    root = os.path.realpath(root)
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(entry)
            if stat is not None:
                stats[int(entry)] = stat
    own = _own_line()
    own_groups = {stats[p][1] for p in own if p in stats}
    found = {pid for pid in stats if pid not in own and _runs_training(str(pid), root)}
    groups = {stats[pid][1] for pid in found if stats[pid][1] == pid} - own_groups
    children: dict[int, list[int]] = {}
    for pid, (ppid, group, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
        if group in groups and pid not in own:
            found.add(pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and child not in own:
                found.add(child)
                todo.append(child)
    return {pid: stats[pid][2] for pid in found}


# --- the drift --------------------------------------------------------------------------------------------------


def _signal(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:  # gone, or not ours
            pass


class Drift:
    """The drift over the trainings under `under`, in a thread of this process: start() and stop(), or a context
    manager. slow: share of each cycle stopped in a slow period; period: seconds of a slow period; normal:
    seconds of a normal one (default: period). log(line) is called at each phase change and for each training
    found (a line with an ISO timestamp). t0: the epoch second the schedule started (phase_at, slow_share)."""

    def __init__(self, under: str | Path, slow: float = DEFAULT_SLOW, period: float = DEFAULT_PERIOD,
                 normal: float | None = None, log=None, cycle: float = CYCLE):
        normal = period if normal is None else normal
        check(slow, period, normal)
        self.under, self.slow, self.period, self.normal, self.cycle = str(under), slow, period, normal, cycle
        self.log = log or (lambda line: None)
        self.t0: float | None = None
        self.stopped: dict[int, str] = {}  # every process this drift ever stopped: pid -> start time
        self.told: set[int] = set()        # the processes whose command line is a training, logged once
        self._quit = threading.Event()
        self._thread: threading.Thread | None = None
        self._guardian: subprocess.Popen | None = None

    @property
    def setting(self) -> str:
        """SLOW:PERIOD, as decisions.py --drift takes it (and NORMAL when it differs)."""
        text = f"{self.slow:g}:{self.period:g}"
        return text if self.normal == self.period else f"{text}:{self.normal:g}"

    def slow_share(self, start: float, end: float) -> float:
        return slow_share(start, end, self.t0, self.period, self.normal) if self.t0 is not None else 0.0

    def start(self) -> "Drift":
        self._guardian = subprocess.Popen([sys.executable, "-c", _GUARDIAN], stdin=subprocess.PIPE, text=True,
                                          start_new_session=True, stdout=subprocess.DEVNULL)
        self.t0 = time.time()
        self._thread = threading.Thread(target=self.run, name="drift", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Continue every training and end the thread (and the guardian)."""
        self._quit.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        _signal(self.stopped, signal.SIGCONT)
        if self._guardian is not None:
            try:
                self._guardian.stdin.close()
            except OSError:
                pass
            self._guardian.wait(timeout=5)
            self._guardian = None

    def __enter__(self) -> "Drift":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _say(self, text: str) -> None:
        self.log(f"{time.strftime('%Y-%m-%dT%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} {text}")

    def _scan(self) -> list[int]:
        found = trainings(self.under)
        for pid, start in found.items():
            if self.stopped.get(pid) != start:
                self.stopped[pid] = start
                if self._guardian is not None:
                    try:  # before the first SIGSTOP: the guardian knows every process that may be stopped
                        self._guardian.stdin.write(f"{pid} {start}\n")
                        self._guardian.stdin.flush()
                    except OSError:
                        pass
                if pid not in self.told and _runs_training(str(pid), os.path.realpath(self.under)):
                    self.told.add(pid)
                    self._say(f"training found: pid {pid}")
        return list(found)

    def run(self) -> None:
        """The schedule, until stop(): slow and normal periods in turn, from t0."""
        t0 = self.t0 if self.t0 is not None else time.time()
        self.t0 = t0
        told = None
        while not self._quit.is_set():
            phase, left = phase_at(time.time() - t0, self.period, self.normal)
            if phase != told:
                told = phase
                self._say(f"{phase}: trainings under {self.under} " + (
                    f"stopped {self.slow:.0%} of every {self.cycle * 1000:.0f} ms for {self.period:g} s"
                    if phase == "slow" else f"left alone for {self.normal:g} s"))
            if phase == "normal":
                self._quit.wait(left)
                continue
            self._slow_period(time.time() + left)

    def _slow_period(self, until: float) -> None:
        pids, scanned = self._scan(), time.monotonic()
        tick = time.monotonic()
        end = tick + (until - time.time())
        while not self._quit.is_set() and tick < end:
            if time.monotonic() - scanned >= SCAN_EVERY:
                pids, scanned = self._scan(), time.monotonic()
            _signal(pids, signal.SIGSTOP)
            try:
                if self._quit.wait(max(0.0, tick + self.slow * self.cycle - time.monotonic())):
                    break
            finally:
                if self.slow < 1:
                    _signal(pids, signal.SIGCONT)
            tick += self.cycle
            self._quit.wait(max(0.0, tick - time.monotonic()))
        _signal(pids, signal.SIGCONT)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--under", required=True, help="slow the trainings (train.py) under this directory")
    parser.add_argument("--slow", type=float, default=DEFAULT_SLOW,
                        help="share of each cycle a training is stopped in a slow period (1: stopped throughout)")
    parser.add_argument("--period", type=float, default=DEFAULT_PERIOD, help="seconds of each slow period")
    parser.add_argument("--normal", type=float, help="seconds of each normal period (default: --period)")
    parser.add_argument("--cycle", type=float, default=CYCLE, help="seconds of one stop/continue cycle")
    parser.add_argument("--log", help="append the phase changes here (default: stdout)")
    args = parser.parse_args(argv)
    out = open(args.log, "a") if args.log else sys.stdout

    def log(line: str) -> None:
        print(line, file=out, flush=True)

    drift = Drift(args.under, args.slow, args.period, args.normal, log, args.cycle)
    done = threading.Event()

    def quit_(signum, frame):
        done.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, quit_)
    drift.start()
    log(f"drift {drift.setting} started at {drift.t0:.3f} (epoch s), pid {os.getpid()}")
    try:
        while not done.wait(3600):
            pass
    finally:
        drift.stop()
        log(f"drift stopped: every training continued ({len(drift.stopped)} processes were slowed)")


if __name__ == "__main__":
    main()
