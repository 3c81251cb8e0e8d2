"""An agent started by hand is paused while the harness trains (pause.py): every process of its sandbox, a
daemon it started included, runs nothing from before a run is measured until it ends, and what was paused runs
again afterwards, even when the command that paused it was killed."""

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from autoresearch import pause, state
from conftest import STALL_ROOM

# The agent: a busy process that starts one in a pid namespace nested in its own (`unshare -Upf`: members of the
# sandbox's namespace alone would miss it) and daemonises a second one (its own session, its parent gone), then
# busy itself.
AGENT = textwrap.dedent("""
    import os, subprocess, sys, time
    LOOP = "import time\\nwhile True:\\n    time.sleep(0.002)"
    subprocess.Popen(["unshare", "-Upf", sys.executable, "-c", LOOP])
    # a process whose main thread exits while another runs on: /proc/PID/stat then says Z
    ZOMBIE_LEADER = (
        "import ctypes, threading, time\\ndef beat():\\n    while True:\\n        time.sleep(0.002)\\n"
        "threading.Thread(target=beat).start()\\nctypes.CDLL(None).pthread_exit(None)")
    subprocess.Popen([sys.executable, "-c", ZOMBIE_LEADER])
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            while True:
                time.sleep(0.002)
        os._exit(0)
    while True:
        time.sleep(0.002)
""")


def ticks(pid: str) -> int:
    """CPU ticks of every thread of the process (utime + stime)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total


def states(sandbox: str) -> dict[str, str]:
    return {pid: pause.stat(pid)[0] for pid in pause.members(sandbox)}


def nested(pid: str) -> bool:
    """Whether the process runs in a pid namespace nested in the sandbox's (its NSpid has three levels)."""
    with open(f"/proc/{pid}/status") as f:
        return len(next(line for line in f if line.startswith("NSpid:")).split()) > 3


def held(repo, namespace: str) -> bool:
    """Whether the agent is paused now: its cgroup frozen, or (no freezer) every process of it stopped."""
    from autoresearch import agentcgroup
    cgroup = pause.registered(repo)[0][2]
    return agentcgroup.frozen(cgroup) if cgroup is not None else set(states(namespace).values()) <= set(pause.STOPPED)


@pytest.fixture(params=["freezer", "sigstop"])
def agent(tmp_path, env, monkeypatch, bwrap_or_skip, request):
    """A sandboxed agent as `autoresearch agent` starts one (its own pid namespace, in a freezer cgroup of its
    own where one can be made), registered for tmp_path."""
    bwrap_or_skip()
    from autoresearch import agentcgroup
    frozen = agentcgroup.Freezer("test") if request.param == "freezer" else None
    if frozen is not None and frozen.dir is None:
        pytest.skip(frozen.how)
    monkeypatch.setenv("AUTORESEARCH_CACHE", env["AUTORESEARCH_CACHE"])
    from autoresearch import confine
    repo = tmp_path / "repo"
    (repo / "train.py").parent.mkdir()
    (repo / "train.py").write_text("")
    (repo / "agent.py").write_text(AGENT)
    private = tmp_path / "private"
    private.mkdir()
    argv = confine.wrap_agent([sys.executable, "agent.py"], repo, private=private)
    proc = subprocess.Popen(frozen.wrap(argv) if frozen else argv)
    entry = pause.register(repo, proc.pid, frozen and frozen.dir)
    namespace = pause.registered(repo)[0][0]  # the sandbox: its bubblewrap's pid
    deadline = time.monotonic() + 10
    def started():  # the nested one, and the one whose main thread exited (Z, its other thread running)
        found = pause.members(namespace)
        return any(nested(pid) for pid in found) and any(
            pause.stat(pid)[0] == "Z" and pause.runs(pid) for pid in found if pause.stat(pid))
    while not started() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started()
    yield repo, namespace, entry
    proc.kill()
    proc.wait()
    if frozen is not None:
        frozen.close()


def test_a_run_pauses_every_process_of_the_agents_sandbox_and_continues_them_after(agent):
    repo, namespace, _ = agent
    alive = [pid for pid, s in states(namespace).items() if s not in ("Z", "X")]
    assert len(alive) >= 4 and any(nested(pid) for pid in alive)  # the agent, its daemon, the nested one
    suspended = next(pid for pid in alive if not nested(pid) and pid != alive[0])
    os.kill(int(suspended), signal.SIGSTOP)  # a job the user suspended (Ctrl-Z) inside the sandbox
    time.sleep(0.1)
    with pause.paused(repo) as notes:
        assert len(notes) == 1
        before = {pid: ticks(pid) for pid in pause.members(namespace)}
        time.sleep(0.5)
        assert held(repo, namespace), states(namespace)
        assert {pid: ticks(pid) for pid in before} == before  # nothing ran while paused, no thread of it
    time.sleep(0.2)
    after = states(namespace)
    assert after[suspended] in ("T", "t")  # not the harness's to continue
    assert all(s not in ("T", "t") for pid, s in after.items() if pid != suspended), after  # the rest run
    assert not (notes[0]).exists()


def test_the_watchdog_continues_an_agent_whose_pausing_command_was_killed(agent):
    repo, namespace, entry = agent
    killed = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from autoresearch import pause, state
        repo = Path({str(repo)!r})
        with state.RepoLock(state.state_dir(repo), "autoresearch run"):
            with pause.paused(repo):
                os.kill(os.getpid(), signal.SIGKILL)
        """)], cwd=os.path.dirname(os.path.dirname(pause.__file__)))
    assert killed.returncode == -signal.SIGKILL
    assert held(repo, namespace)  # left paused
    watchdog = pause.Watchdog(repo)
    try:
        deadline = time.monotonic() + 5 * pause.WATCH_EVERY
        while held(repo, namespace) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not held(repo, namespace), states(namespace)
        assert not any(s in ("T", "t") for s in states(namespace).values()), states(namespace)
    finally:
        watchdog.close()
    # while a command holds the lock, the watchdog leaves its pause alone
    with state.RepoLock(state.state_dir(repo), "autoresearch run"), pause.paused(repo):
        watchdog = pause.Watchdog(repo)
        time.sleep(3 * pause.WATCH_EVERY)
        assert held(repo, namespace)
        watchdog.close()


def test_a_sandbox_that_ended_is_not_paused_and_a_stale_entry_names_no_namespace(agent):
    repo, namespace, entry = agent
    data = entry.read_text()
    ident = json.loads(data)["process"]
    entry.write_text(json.dumps({"process": [ident[0], ident[1] + 60]}))  # another process now has its pid
    assert pause.registered(repo) == []
    with pause.paused(repo) as notes:
        assert notes == [] and not any(s in ("T", "t") for s in states(namespace).values())


def test_what_the_broker_runs_that_computes_never_runs_beside_a_run(repo, capsys, monkeypatch):
    """Red team: `autoresearch sample` (the model, run by the broker outside the sandbox) sent just before
    `autoresearch run` went on beside the run, where pausing the agent's sandbox did not reach it. The broker runs
    it under the repository's lock: while a run holds it, the agent is told so."""
    from autoresearch import broker, cli
    server = broker.Broker(repo, cli.build_parser())
    server.ready.set()
    monkeypatch.setenv(broker.BROKER_ENV, str(server.dir / "socket" / broker.SOCKET_NAME))
    try:
        with state.RepoLock(state.state_dir(repo), "autoresearch run"):
            assert broker.forward(["sample", "--tokens", "5"]) == 1
        assert "`autoresearch run`" in capsys.readouterr().out
    finally:
        server.close()


# The attack on SIGSTOP: a process that arms a POSIX timer of its own whose signal is SIGCONT (timer_create,
# SIGEV_SIGNAL): the kernel continues it every 0.3 s, however often it is stopped (seldom enough that a scan of
# /proc finds it stopped: one that never stops is killed), and it continues a busy sibling in turn. Both keep
# burning CPU while "paused".
SIGCONT_TIMER = textwrap.dedent("""
    import ctypes, os, signal, subprocess, sys, time
    sibling = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    signal.signal(signal.SIGCONT, lambda *_: None)  # handled, not ignored: the kernel rearms an ignored timer never
    libc = ctypes.CDLL(None, use_errno=True)
    event = (ctypes.c_int * 16)()          # struct sigevent: sigev_value, sigev_signo, sigev_notify (SIGEV_SIGNAL)
    event[2], event[3] = signal.SIGCONT, 0
    timer = ctypes.c_void_p()
    assert libc.timer_create(1, event, ctypes.byref(timer)) == 0, ctypes.get_errno()  # CLOCK_MONOTONIC
    every = (ctypes.c_long * 4)(0, 300_000_000, 0, 300_000_000)  # it_interval, it_value: 0.3 s
    assert libc.timer_settime(timer, 0, every, None) == 0, ctypes.get_errno()
    print("ARMED", flush=True)
    while True:
        os.kill(sibling.pid, signal.SIGCONT)
        for _ in range(10000):
            pass
""")
LAUNCHER = "import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', sys.argv[1]])\ntime.sleep(600)"


def cpu_seconds(sandbox: str) -> float:
    return sum(ticks(pid) for pid in [sandbox, *pause.members(sandbox)] if os.path.exists(f"/proc/{pid}")) / \
        os.sysconf("SC_CLK_TCK")


def burned_while_paused(repo, seconds: float = 2.0) -> float:
    """CPU seconds the registered agent's processes used while a command held the pause for `seconds`."""
    sandbox = pause.registered(repo)[0][0]
    with pause.paused(repo):
        before = cpu_seconds(sandbox)
        time.sleep(seconds)
        return cpu_seconds(sandbox) - before


@pytest.fixture(params=["sigstop", "v2", "v1"])
def timer_agent(tmp_path, request, monkeypatch):
    """An agent merely registered (no bubblewrap needed): a launcher whose child arms the SIGCONT timer, started
    as `autoresearch agent` starts its sandbox: in a freezer cgroup of its own (v2 or v1, where this machine can
    make one), or without one (SIGSTOP)."""
    from autoresearch import agentcgroup
    if request.param == "v1":
        monkeypatch.setattr(agentcgroup, "v2_parent", lambda: None)
    cgroup = None
    with contextlib.ExitStack() as stack:
        argv = [sys.executable, "-c", LAUNCHER, SIGCONT_TIMER]
        if request.param != "sigstop":
            frozen = stack.enter_context(agentcgroup.Freezer("test"))
            if frozen.dir is None or agentcgroup.kind(frozen.dir) != request.param:
                pytest.skip(frozen.how if frozen.dir is None else f"a cgroup {agentcgroup.kind(frozen.dir)} here")
            argv, cgroup = frozen.wrap(argv), frozen.dir
        repo = tmp_path / "repo"
        repo.mkdir()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)  # the child's ARMED line comes through it
        stack.callback(proc.stdout.close)
        pause.register(repo, proc.pid, cgroup)
        ready, _, _ = select.select([proc.stdout], [], [], STALL_ROOM)
        assert ready and proc.stdout.readline().strip() == "ARMED", "the agent's timer was never armed"
        deadline = time.monotonic() + STALL_ROOM
        while len(pause.members(str(proc.pid))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        yield repo, proc, cgroup
        for pid in pause.members(str(proc.pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        proc.kill()
        proc.wait()


def test_a_sigcont_timer_of_the_agents_own_undoes_a_pause_by_sigstop_not_a_frozen_cgroup(timer_agent, capsys):
    repo, proc, cgroup = timer_agent
    burned = burned_while_paused(repo)
    print(f"{'SIGSTOP' if cgroup is None else cgroup.parent}: {burned:.2f} CPU-s burned in 2 s of pause")
    if cgroup is None:
        assert burned > 0.1  # the attack wins against SIGSTOP
        assert "NO freezer" in capsys.readouterr().err  # and the pause says so
        return
    assert burned < 0.05, burned  # frozen: nothing ran, however often its timer fired
    time.sleep(0.5)
    after = cpu_seconds(str(proc.pid))
    time.sleep(0.5)
    assert cpu_seconds(str(proc.pid)) > after  # thawed at the end: it runs again
    assert not list(pause.registry(repo).glob("*.stopped"))


def test_a_cgroup_thawed_during_the_pause_is_frozen_again_and_one_that_cannot_freeze_is_killed(timer_agent):
    from autoresearch import agentcgroup
    repo, proc, cgroup = timer_agent
    if cgroup is None:
        pytest.skip("the freezer's")
    with pause.paused(repo):
        agentcgroup.thaw(cgroup)  # another process of the user's, say
        assert not agentcgroup.frozen(cgroup)
        deadline = time.monotonic() + 10 * pause.CHECK_EVERY
        while not agentcgroup.frozen(cgroup) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert agentcgroup.frozen(cgroup)
    assert not agentcgroup.frozen(cgroup)
    # a registered freezer that is gone (or will not freeze): the sandbox is killed, never left running
    pause.register(repo, proc.pid, cgroup.parent / "gone")
    with pause.paused(repo):
        assert proc.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 30  # its busy sibling, killed too, leaves the cgroup as the kernel gets to it
        while agentcgroup.pids(cgroup) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert agentcgroup.pids(cgroup) == []
