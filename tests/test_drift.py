"""benchmarks/drift.py: a training slowed in its slow periods by about the factor asked, drift itself nearly free
of CPU (the load guard would count it), and never a training left stopped, whatever ends the drift. No torch: the
"training" is a busy loop in a file called train.py, with a busy child of its own. A few seconds.

The machine is shared: CPU rates are compared loosely (a stall in one period moves them), never timed tightly."""

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from autoresearch import processes
from conftest import STALL_ROOM

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import drift  # noqa: E402

# a training that forks a helper, as torch's compile workers do: both must be slowed and both continued
BUSY = ("import ctypes, signal, subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import ctypes, signal; ctypes.CDLL(None).prctl(1, signal.SIGKILL, "
        "0, 0, 0)\\nwhile True: pass'])\n"
        "while True: pass\n")
WAIT = STALL_ROOM  # seconds any expected event may take on a stalled machine before the test fails


@pytest.fixture
def training(tmp_path):
    """A busy train.py under tmp_path, in its own process group (as the harness starts one), with a busy child:
    the psutil processes of both."""
    (tmp_path / "train.py").write_text(BUSY)
    proc = subprocess.Popen(processes.tied_to_parent([sys.executable, "train.py"]), cwd=tmp_path,
                            start_new_session=True)
    leader = psutil.Process(proc.pid)
    deadline = time.monotonic() + WAIT
    while not leader.children() and time.monotonic() < deadline:
        time.sleep(0.02)
    tree = [leader, *leader.children()]
    assert len(tree) == 2, "the training's child did not start"
    yield tree
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def cpu(tree) -> float:
    total = 0.0
    for p in tree:
        t = p.cpu_times()
        total += t.user + t.system
    return total


def stopped(tree) -> list[bool]:
    return [p.status() == psutil.STATUS_STOPPED for p in tree]


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} after {WAIT} s"
        time.sleep(0.02)


class Cli:
    """drift.py as a command, its log lines read as they come."""

    def __init__(self, under: Path, *args: str):
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "drift.py"), "--under", str(under),
                                      *args], stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_line(self, text: str) -> str:
        deadline = time.monotonic() + WAIT
        while True:
            line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if text in line:
                return line

    def end(self, sig=signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=WAIT)


@pytest.mark.serial  # samples a stopped process every 7 ms: a core shared with another test's work straddles
# the phase changes it reads
def test_a_slow_period_stops_the_training_for_about_the_share_asked_and_drift_costs_almost_no_cpu(training, tmp_path):
    """Whether the training is stopped is sampled, not how much CPU it got: a stall of the machine changes the
    second, not the first (a CPU-rate ratio failed when the normal period stalled)."""
    cli = Cli(tmp_path, "--slow", "0.6", "--period", "2")  # stopped 60 ms of every 100 ms when slow
    samples = {"slow": [], "normal": []}
    try:
        cli.wait_line("training found")
        own = psutil.Process(cli.proc.pid).cpu_times()
        t0 = time.monotonic()
        for phase in ("normal", "slow", "normal"):  # sample until each phase change is logged
            changed = threading.Event()
            threading.Thread(target=lambda: (cli.wait_line(phase + ":"), changed.set()), daemon=True).start()
            current = "slow" if phase == "normal" else "normal"
            while not changed.is_set() and time.monotonic() - t0 < 6 * WAIT:
                samples[current].append(stopped(training)[0])
                time.sleep(0.007)
        spent = sum(psutil.Process(cli.proc.pid).cpu_times()[:2]) - sum(own[:2])
        elapsed = time.monotonic() - t0
    finally:
        cli.end()
    slow = sum(samples["slow"]) / max(1, len(samples["slow"]))
    assert len(samples["slow"]) > 50 and 0.3 < slow < 0.9, (slow, len(samples["slow"]))  # 0.6 asked
    assert not any(samples["normal"][5:]), "stopped in a normal period"  # (the first samples may straddle)
    # what the load guard would count against a run: drift's own CPU, a few kill() calls per 100 ms
    assert spent < 0.05 * elapsed, f"drift used {spent:.3f} CPU s in {elapsed:.1f} s"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_training_is_never_left_stopped_when_drift_ends(training, tmp_path, sig):
    """--slow 1: stopped throughout its slow period. SIGTERM: drift continues it; SIGKILL: the guardian does."""
    cli = Cli(tmp_path, "--slow", "1", "--period", "60")
    try:
        cli.wait_line("training found")
        wait_for(lambda: all(stopped(training)), "stopped training")
        frozen = cpu(training)
        time.sleep(0.2)
        assert cpu(training) - frozen < 0.05
    finally:
        cli.end(sig)
    wait_for(lambda: not any(stopped(training)), "continued training")
    before = cpu(training)
    wait_for(lambda: cpu(training) > before + 0.05, "CPU used by the continued training")


def test_the_drift_as_a_context_manager_in_a_thread(training, tmp_path):
    lines = []
    with drift.Drift(tmp_path, slow=1.0, period=60, log=lines.append) as d:
        wait_for(lambda: all(stopped(training)), "stopped training")
        assert d.setting == "1:60"
        assert d.slow_share(d.t0, d.t0 + 30) == 1.0 and d.slow_share(d.t0 + 60, d.t0 + 90) == 0.0
    assert not any(stopped(training))
    assert any("slow:" in line for line in lines) and any("training found" in line for line in lines)


def test_only_trainings_under_the_directory_are_found(training, tmp_path):
    assert set(drift.trainings(tmp_path)) == {p.pid for p in training}
    assert drift.trainings(tmp_path / "elsewhere") == {}
    assert os.getpid() not in drift.trainings("/")  # never this process nor its ancestors


def test_phases_and_settings():
    assert drift.phase_at(0, 180, 180) == ("slow", 180)
    assert drift.phase_at(200, 180, 180) == ("normal", 160)
    assert drift.phase_at(370, 180, 180) == ("slow", 170)
    assert drift.parse_setting("0.33:180") == (0.33, 180.0)
    with pytest.raises(ValueError):
        drift.parse_setting("1.5:180")
    assert drift.slow_share(0, 360, 0, 180, 180) == pytest.approx(0.5)
