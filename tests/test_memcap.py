"""An agent's sandbox holds no more memory than memcap allows: a paused agent keeps its memory, and a private /tmp
filled before a control runs would crowd it out (memcap.py). The attack first (without a limit the sandbox holds
what it wrote), then the defence through `autoresearch agent` itself. No training: a few seconds."""

import os
import subprocess
import sys
import textwrap

import pytest

from autoresearch import errors, memcap

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
MIB = 300  # written by the agent; the limit in the tests is 128 MiB


def test_the_limit_is_read_from_the_users_environment(monkeypatch):
    monkeypatch.setenv(memcap.ENV, "512M")
    assert memcap.limit() == 512 << 20
    monkeypatch.setenv(memcap.ENV, "8GiB")
    assert memcap.limit() == 8 << 30
    monkeypatch.setenv(memcap.ENV, "none")
    assert memcap.limit() is None
    monkeypatch.setenv(memcap.ENV, "lots")
    with pytest.raises(errors.HarnessError, match="e.g. 4G"):
        memcap.limit()
    monkeypatch.delenv(memcap.ENV)
    assert memcap.limit() >= memcap.AGENT_FLOOR


@pytest.fixture
def capped_or_skip(monkeypatch, bwrap_or_skip):
    bwrap_or_skip()
    monkeypatch.setenv(memcap.ENV, "128M")
    with memcap.Cap("probe") as cap:
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
    with memcap.Cap("test") as cap:
        capped = subprocess.run(cap.wrap(argv), capture_output=True, text=True, timeout=120)
    assert capped.returncode != 0 and "HELD" not in capped.stdout, (capped.returncode, capped.stdout)
    assert cap.dir is None or not cap.dir.exists()  # removed once the sandbox ended


def test_autoresearch_agent_starts_its_agent_inside_the_limit(repo, env, capped_or_skip):
    (repo / "fill.py").write_text(FILL)
    with open(repo / ".git" / "info" / "exclude", "a") as f:
        f.write("fill.py\n")
    proc = cli(repo, "agent", "--", sys.executable, "fill.py", str(MIB), env=dict(env, **{memcap.ENV: "128M"}),
               timeout=120)
    assert "memory limited to 0.1 GiB" in proc.stderr, proc.stderr
    assert proc.returncode != 0 and "HELD" not in proc.stdout, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert "reached its memory limit" in proc.stderr and memcap.ENV in proc.stderr, proc.stderr[-2000:]
    proc = cli(repo, "agent", "--", sys.executable, "fill.py", "16", env=dict(env, **{memcap.ENV: "128M"}),
               timeout=120)  # what an agent needs, it has
    assert proc.returncode == 0 and "HELD" in proc.stdout, proc.stderr[-2000:]
