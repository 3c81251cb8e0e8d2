"""The sandbox holds whoever starts it, root included (CI runs as root): what runs inside holds no capability,
so it cannot open a file by handle outside its mounts, mount or remount, or see a held-out file; and what root's
uid may still write without a capability is out of reach: kernel settings in /proc/sys are read-only, and /dev
holds bubblewrap's minimal set (no loop device, no disk). Fast: one
bubblewrap start each, no training."""

import json
import os
import subprocess
import sys

import pytest

from autoresearch import sandbox

PROBE = r'''
import ctypes, json, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
out = {"caps": [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]}
fd = os.open(sys.argv[1], os.O_RDONLY)
ino = os.fstat(fd).st_ino
handle = ctypes.create_string_buffer(struct.pack("=IiII", 8, 1, int(sys.argv[2]), 0), 16)
got = libc.open_by_handle_at(fd, handle, os.O_RDONLY)
out["by_handle"] = "opened" if got >= 0 else os.strerror(ctypes.get_errno())
got = libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)
out["mount"] = "mounted" if got == 0 else os.strerror(ctypes.get_errno())
got = libc.mount(None, b"/usr", None, 32 | 4096, None)  # MS_REMOUNT | MS_BIND, read-write
out["remount"] = "remounted" if got == 0 else os.strerror(ctypes.get_errno())
out["held_out_visible"] = os.path.exists(sys.argv[3])
try:  # the same value back: harmless if it goes through
    pattern = open("/proc/sys/kernel/core_pattern").read()
    open("/proc/sys/kernel/core_pattern", "w").write(pattern)
    out["core_pattern"] = "written"
except OSError as e:
    out["core_pattern"] = e.strerror
out["host_devices"] = sorted(d for d in os.listdir("/dev") if d.startswith(("loop", "vd", "sd", "nvme", "kvm", "zram")))
try:  # the host's OFD locks: a channel from an agent beside the run
    out["locks"] = open("/proc/locks").read()
except OSError as e:
    out["locks"] = e.strerror
print(json.dumps(out))
'''


def test_inside_the_sandbox_nothing_has_a_capability(tmp_path, bwrap_or_skip):
    bwrap_or_skip()
    visible, held_out = tmp_path / "train.bin", tmp_path / "val.bin"
    visible.write_text("train")
    held_out.write_text("secret")
    argv = [*sandbox.empty_root(), "--ro-bind", str(visible), str(visible), "--",
            sys.executable, "-c", PROBE, str(visible), str(os.stat(held_out).st_ino), str(held_out)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen == {"caps": "0000000000000000", "by_handle": "Operation not permitted",
                    "mount": "Operation not permitted", "remount": "Operation not permitted",
                    "held_out_visible": False, "core_pattern": "Read-only file system", "host_devices": [],
                    "locks": "Permission denied"}, seen


@pytest.mark.skipif(os.geteuid() != 0, reason="what root keeps without a user namespace: only root can show it")
def test_as_root_a_sandbox_without_a_user_namespace_would_not_hold(tmp_path, bwrap_or_skip):
    """The attack the user namespace closes, shown winning without it: the same probe, bubblewrap as root before
    issue 31, opens the held-out file by its inode number."""
    bwrap_or_skip()
    visible, held_out = tmp_path / "train.bin", tmp_path / "val.bin"
    visible.write_text("train")
    held_out.write_text("secret")
    base = [a for a in sandbox.empty_root() if a not in sandbox.CONFINED]
    argv = [*base, "--ro-bind", str(visible), str(visible), "--",
            sys.executable, "-c", PROBE, str(visible), str(os.stat(held_out).st_ino), str(held_out)]
    seen = json.loads(subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout)
    assert seen["by_handle"] == "opened" and seen["caps"] != "0000000000000000"


# Fail closed. The attack: an agent exhausts the user namespaces (it holds them open, or /proc/sys/user/
# max_user_namespaces is reached), so that bubblewrap fails as it does then; `--sandbox auto` then quietly became
# `none`: a tag set up meanwhile was pinned `protection none` for good, and a loop's agent ran unconfined.
EXHAUSTED = "#!/bin/sh\necho 'bwrap: Creating new namespace failed: No space left on device' >&2\nexit 1\n"


@pytest.fixture
def fake_bwrap(tmp_path, monkeypatch):
    """A `bwrap` first on PATH whose behaviour the test sets (works(True/False)); the record of bubblewrap having
    worked kept in tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "bwrap"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    def works(ok: bool) -> None:
        fake.write_text("#!/bin/sh\nexit 0\n" if ok else EXHAUSTED)
        fake.chmod(0o755)
        sandbox.bwrap_works.cache_clear()
    yield works
    sandbox.bwrap_works.cache_clear()


def test_where_bubblewrap_never_worked_auto_is_none_and_once_it_has_auto_never_is(fake_bwrap):
    fake_bwrap(False)
    assert sandbox.protection("auto") == "none"  # macOS, a container without namespaces: as before
    fake_bwrap(True)
    assert sandbox.protection("auto") == "bwrap"
    fake_bwrap(False)  # the agent exhausted the namespaces
    with pytest.raises(sandbox.SandboxError) as e:
        sandbox.protection("auto")
    said = str(e.value)
    assert "worked here before" in said and "No space left on device" in said and "--sandbox off" in said, said
    assert str(sandbox.bwrap_record()) in said
    assert sandbox.protection("off") == "none"  # asked for explicitly: still possible


def test_an_agent_is_never_run_unconfined_where_bubblewrap_is_expected(fake_bwrap, tmp_path):
    from autoresearch import agents, state
    repo = tmp_path / "repo"
    for protection in ("bwrap", "none"):
        state.atomic_json(state.tag_file(repo, protection), {"protection": protection})
    fake_bwrap(False)  # never worked here: the tag's word decides
    with pytest.raises(agents.AgentError, match="No space left on device"):
        agents.ExternalAgent(repo, "bwrap", "true", 10).confined()
    assert agents.ExternalAgent(repo, "none", "true", 10).confined() is False  # set up with --sandbox off
    fake_bwrap(True)
    assert agents.ExternalAgent(repo, "bwrap", "true", 10).confined() is True
    fake_bwrap(False)  # worked before: an older tag without a protection is refused too
    state.atomic_json(state.tag_file(repo, "old"), {})
    with pytest.raises(agents.AgentError, match="worked here before"):
        agents.ExternalAgent(repo, "old", "true", 10).confined()
