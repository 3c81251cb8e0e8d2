"""The training's boundary (issue 50): nothing a training or its compile phase leaves behind is read back or
mounted as if the harness had made it. Fast: a compile phase and a training here are a few lines of Python in
the real sandbox, no torch."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from autoresearch import compiled, fixed, sandbox, state
from autoresearch.tagconfig import Tag

ROOT = Path(__file__).resolve().parent.parent
TAG = Tag("t", "autoresearch/t", "f", 100, "c")

# a compile phase (train.py under AUTORESEARCH_COMPILE_ONLY) that replaces its base's headers directory by a link
# to the host's / and leaves a FIFO beside it: the attack of issue 50, kept at 0.037 against the honest 2.53
PLANT = r'''
import os
base = os.environ["TORCHINDUCTOR_CACHE_DIR"]
os.rename(os.path.join(base, "headers"), os.path.join(base, "old-headers"))
os.symlink("/", os.path.join(base, "headers"))
os.mkfifo(os.path.join(base, "fifo"))
open(os.path.join(base, "kernel.so"), "w").write("fine")
'''

# a training that looks through inductor's header directory for a file of the host's
PROBE = r'''
import os, sys
print("SEEN" if os.path.exists(os.path.join(sys.argv[1], sys.argv[2].lstrip("/"))) else "UNSEEN")
'''


def half(cache: Path) -> fixed.FixedHalf:
    return fixed.FixedHalf({name: (ROOT / name).read_bytes() for name in state.FIXED}, cache,
                           json.loads((cache / "manifest.json").read_text()))


def test_a_link_a_compile_phase_leaves_in_its_base_is_never_mounted(tmp_path, small_cache, bwrap_or_skip,
                                                                     monkeypatch):
    bwrap_or_skip()
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(small_cache))
    canary = tmp_path / "host-secret"
    canary.write_text("the tag's draw")
    cache = tmp_path / "cache"
    cache.symlink_to(small_cache)  # its bases beside it, in this test's directory
    logs = []
    base = compiled.ensure_base(half(cache), TAG, compiled.Wanted("0123456789ab", PLANT), "bwrap", log=logs.append)
    record = compiled.ready(cache, base.name)
    # the phase's base is refused as a whole: emptied, recorded as failed, the reason in the log
    assert record["ok"] is False and "does not accept" in "\n".join(logs) and "headers" in "\n".join(logs)
    assert sorted(os.listdir(base)) == ["headers"] and not (base / "headers").is_symlink()
    # a configuration that starts from it gets nothing of what the phase left
    nxt = compiled.ensure_base(half(cache), TAG, compiled.Wanted("ba9876543210", "pass\n", "0123456789ab"), "bwrap",
                               log=logs.append)
    assert not any(p.is_symlink() or stat.S_ISFIFO(p.lstat().st_mode) for p in nxt.rglob("*"))

    # the same link planted in a base after its phase (a run without a sandbox, say) is refused by the copy
    os.rename(base / "headers", base / "h")
    (base / "headers").symlink_to("/")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(compiled.Unaccepted, match="headers"):
        compiled.private_copy(base, run_dir)
    assert not (run_dir / sandbox.COMPILE_DIR).exists()
    (base / "headers").unlink()
    os.mkfifo(base / "pipe")
    with pytest.raises(compiled.Unaccepted, match="pipe"):
        compiled.private_copy(base, run_dir)
    (base / "pipe").unlink()
    os.rename(base / "h", base / "headers")

    # and a training started on the accepted copy sees nothing of the host through inductor's header directory
    compiled.private_copy(base, run_dir)
    repo = tmp_path / "repo"
    repo.mkdir()
    (run_dir / sandbox.SOURCE).write_text(PROBE)
    manifest = json.loads((small_cache / "manifest.json").read_text())
    sandbox.make_view(run_dir, small_cache, manifest)
    (run_dir / sandbox.OUT_DIR).mkdir()
    argv = sandbox.wrap([sys.executable, "train.py", sandbox.inductor_default_dir(), str(canary)], repo, run_dir,
                        small_cache, manifest)
    out = subprocess.run(argv, cwd=repo, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "UNSEEN", out.stdout + out.stderr


def test_a_bind_source_that_is_not_a_directory_the_harness_made_is_refused(tmp_path, small_cache):
    """Fail closed: a run's compile copy or out/ that is a link when the sandbox is built stops the run."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    manifest = json.loads((small_cache / "manifest.json").read_text())
    sandbox.make_view(run_dir, small_cache, manifest)
    (run_dir / sandbox.OUT_DIR).symlink_to("/")
    with pytest.raises(sandbox.SandboxError, match="out"):
        sandbox.wrap([sys.executable, "train.py"], tmp_path, run_dir, small_cache, manifest)
    (run_dir / sandbox.OUT_DIR).unlink()
    (run_dir / sandbox.OUT_DIR).mkdir()
    (run_dir / sandbox.COMPILE_DIR).mkdir()
    (run_dir / sandbox.COMPILE_DIR / "headers").symlink_to("/")
    with pytest.raises(sandbox.SandboxError, match="headers"):
        sandbox.wrap([sys.executable, "train.py"], tmp_path, run_dir, small_cache, manifest)
