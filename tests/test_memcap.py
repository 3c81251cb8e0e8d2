"""An agent's sandbox holds no more memory than memcap allows: a paused agent keeps its memory, and a private /tmp
filled before a control runs would crowd it out (agentcgroup.py). The attack first (without a limit the sandbox holds
what it wrote), then the defence through `autoresearch agent` itself. No training: a few seconds."""

import os
import subprocess
import sys
import textwrap

import pytest

from autoresearch import agentcgroup, errors

from conftest import cli

# the attack: fill the sandbox's private /tmp (a tmpfs: its pages belong to no process) and keep it, then say so
FILL = textwrap.dedent("""
    import sys
    with open("/tmp/ballast", "wb") as f:
        for _ in range(int(sys.argv[1])):
            f.write(b"x" * (1 << 20))
            f.flush()
    print("HELD", flush=True)
""")
# the agent raises its own limit: a cgroup namespace of its own, the memory hierarchy mounted there (its cgroup the
# root), and the limit written (root underneath: the files are its uid's); then it fills /tmp as above
RAISE = textwrap.dedent("""
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x10000000 | 0x00020000 | 0x02000000) == 0:  # user, mount, cgroup namespaces
        os.makedirs("/tmp/cg", exist_ok=True)
        libc.mount(b"none", b"/", None, 0x40000 | 0x4000, None)
        if libc.mount(b"cgroup", b"/tmp/cg", b"cgroup", 0, b"memory") == 0:
            try:
                open("/tmp/cg/memory.limit_in_bytes", "w").write(str(1 << 30))
            except OSError as e:
                print("refused", e)
            print("RAISED to", open("/tmp/cg/memory.limit_in_bytes").read().strip(), flush=True)
    exec(open("fill.py").read())
""")
MIB = 300  # written by the agent; the limit in the tests is 128 MiB


def test_the_limit_is_read_from_the_users_environment(monkeypatch):
    monkeypatch.setenv(agentcgroup.ENV, "512M")
    assert agentcgroup.limit() == 512 << 20
    monkeypatch.setenv(agentcgroup.ENV, "8GiB")
    assert agentcgroup.limit() == 8 << 30
    monkeypatch.setenv(agentcgroup.ENV, "none")
    assert agentcgroup.limit() is None
    monkeypatch.setenv(agentcgroup.ENV, "lots")
    with pytest.raises(errors.HarnessError, match="e.g. 4G"):
        agentcgroup.limit()
    monkeypatch.delenv(agentcgroup.ENV)
    assert agentcgroup.limit() >= agentcgroup.AGENT_FLOOR


@pytest.fixture
def capped_or_skip(monkeypatch, bwrap_or_skip):
    bwrap_or_skip()
    monkeypatch.setenv(agentcgroup.ENV, "128M")
    with agentcgroup.Cap("probe") as cap:
        if not cap.prefix:
            if os.environ.get("CI"):
                pytest.fail(f"CI runs as root with a memory cgroup: {cap.how}")
            pytest.skip(cap.how)


def test_a_sandbox_without_a_limit_holds_what_it_wrote_and_with_one_it_cannot(tmp_path, env, capped_or_skip,
                                                                               monkeypatch):
    monkeypatch.setenv("AUTORESEARCH_CACHE", env["AUTORESEARCH_CACHE"])
    from autoresearch import confine
    (tmp_path / "train.py").write_text("")
    (tmp_path / "fill.py").write_text(FILL)
    argv = confine.wrap_agent([sys.executable, "fill.py", str(MIB)], tmp_path)
    free = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert free.returncode == 0 and "HELD" in free.stdout, free.stderr  # the attack, with no limit: it wins
    with agentcgroup.Cap("test") as cap:
        capped = subprocess.run(cap.wrap(argv), capture_output=True, text=True, timeout=120)
    assert capped.returncode != 0 and "HELD" not in capped.stdout, (capped.returncode, capped.stdout)
    assert cap.dir is None or not cap.dir.exists()  # removed once the sandbox ended
    (tmp_path / "raise.py").write_text(RAISE)
    with agentcgroup.Cap("test") as cap:
        raised = subprocess.run(cap.wrap(confine.wrap_agent([sys.executable, "raise.py", str(MIB)], tmp_path)),
                                capture_output=True, text=True, timeout=120)
    assert raised.returncode != 0 and "HELD" not in raised.stdout, (raised.returncode, raised.stdout)
    assert not cap.dir.exists()


def test_autoresearch_agent_starts_its_agent_inside_the_limit(repo, env, capped_or_skip):
    (repo / "fill.py").write_text(FILL)
    with open(repo / ".git" / "info" / "exclude", "a") as f:
        f.write("fill.py\n")
    proc = cli(repo, "agent", "--", sys.executable, "fill.py", str(MIB), env=dict(env, **{agentcgroup.ENV: "128M"}),
               timeout=120)
    assert "memory limited to 0.1 GiB" in proc.stderr, proc.stderr
    assert proc.returncode != 0 and "HELD" not in proc.stdout, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert "reached its memory limit" in proc.stderr and agentcgroup.ENV in proc.stderr, proc.stderr[-2000:]
    proc = cli(repo, "agent", "--", sys.executable, "fill.py", "16", env=dict(env, **{agentcgroup.ENV: "128M"}),
               timeout=120)  # what an agent needs, it has
    assert proc.returncode == 0 and "HELD" in proc.stdout, proc.stderr[-2000:]


def test_what_the_harness_keeps_for_an_agent_is_bounded(tmp_path):
    """Outside its limit: the loop keeps the end of an agent's output and its DESCRIPTION lines, not all of it;
    the broker reads a request line of at most MAX_REQUEST bytes (a red team held 465 and 201 MiB that way)."""
    import io
    import json
    import socket

    from autoresearch import agents, broker, cli as cli_module
    flood = "DESCRIPTION: the first try\n" + ("x" * 999 + "\n") * 5000 + "DESCRIPTION: halve the MLP\nbye"
    out = agents.Output(io.StringIO(flood)).text()
    assert len(out) < 2 * agents.OUTPUT_TAIL and out.endswith("bye")
    assert out.splitlines()[:2] == ["DESCRIPTION: the first try", "DESCRIPTION: halve the MLP"]
    server = broker.Broker(tmp_path, cli_module.build_parser())
    try:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(server.dir / "socket" / broker.SOCKET_NAME))
            conn.sendall(b"x" * (broker.MAX_REQUEST + 10))
            conn.shutdown(socket.SHUT_WR)  # without the bound, the whole line is read (and fails as JSON)
            answer = conn.makefile("rb").read().decode()
        assert "at most" in answer and json.loads(answer.splitlines()[-1]) == {"rc": 2}, answer
    finally:
        server.close()
