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

from autoresearch import compiled, fixed, sandbox, scratch, state
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
    with pytest.raises(scratch.Unaccepted, match="headers"):
        compiled.private_copy(base, run_dir)
    assert not (run_dir / sandbox.COMPILE_DIR).exists()
    (base / "headers").unlink()
    os.mkfifo(base / "pipe")
    with pytest.raises(scratch.Unaccepted, match="pipe"):
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
    try:
        out = subprocess.run(argv, cwd=repo, capture_output=True, text=True, timeout=120)
    finally:
        scratch.release(run_dir / sandbox.COMPILE_DIR)
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


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may mount the tmpfs; elsewhere out/ is on the disk")
def test_out_is_a_tmpfs_of_its_size_and_holds_only_the_contract_files_after(tmp_path):
    from autoresearch import scratch
    from autoresearch.evaluator import safe_read
    out = tmp_path / "out"
    assert scratch.bounded_dir(out, 2 << 20) and os.path.ismount(out)
    with pytest.raises(OSError) as e, open(out / "junk", "wb") as f:  # the disk is never reached
        for _ in range(4):
            f.write(os.urandom(1 << 20))
            f.flush()
    assert e.value.errno == 28  # ENOSPC
    (out / "junk").unlink()
    (out / "result.json").write_text("{}")
    (out / "model.graph.json").symlink_to("/etc/passwd")
    os.mkfifo(out / "model.safetensors")
    (out / "extra").mkdir()
    os.close(os.open(os.path.join(os.fsencode(out), b"x\xff\nstep=99999 | loss=0.0"), os.O_CREAT | os.O_WRONLY))
    dropped = scratch.settle(out, ("result.json", "model.graph.json", "model.safetensors"),
                             {"result.json": safe_read.RESULT_LIMIT})
    assert not os.path.ismount(out) and sorted(os.listdir(out)) == ["result.json"]
    assert not (out / "result.json").is_symlink() and (out / "result.json").read_text() == "{}"
    assert {d.split(" ")[0] for d in dropped} == {"'model.graph.json'", "'model.safetensors'", "'extra'",
                                                  "'x\\udcff\\nstep=99999"}
    # a name is the training's text: written to the run's log as ascii() writes it, one line, never a crash
    log = tmp_path / "run.log"
    log.write_text("")
    from autoresearch import supervise
    supervise.append_line(log, "out/: " + ", ".join(dropped))
    assert log.read_text().count("\n") == 1 and "step=99999" in log.read_text()
    assert scratch.settle(out, ("result.json",), {}) == []  # a second settle keeps what is there


def test_a_cgroup_counts_the_cpu_of_a_child_the_kernel_reaped():
    """The attack of issue 50: a training that ignores SIGCHLD trains in a child, reaped by the kernel: neither
    the harness's scan of live processes nor RUSAGE_CHILDREN sees it (133 s of a 10 s budget, kept). The
    kernel's count in the run's cgroup does."""
    from autoresearch import cgroups
    cg, how = cgroups.make("test")
    if cg is None:
        pytest.skip(f"no cgroup can be made here ({how})")
    child = ("import os, signal, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
             "if os.fork() == 0:\n    end = time.process_time() + 1.0\n    while time.process_time() < end: pass\n"
             "    os._exit(0)\ntry:\n    os.wait()\nexcept ChildProcessError:\n    pass\n")
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with cg:
        subprocess.run(cg.wrap([sys.executable, "-c", child]), check=True, timeout=120)
        counted = cg.cpu_seconds()
        assert cg.pids() == []
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert counted >= 1.0
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) < 0.9  # what the old clock saw


ATTACK_PRELUDE = '''import os as _os, signal as _signal, time as _time
_signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)  # the child is reaped by the kernel, unseen
if _os.fork() == 0:
    _end = _time.process_time() + 40
    while _time.process_time() < _end:
        pass
    _os._exit(0)
'''
ATTACK_END = '''    try:
        _os.wait()  # with SIGCHLD ignored: returns once the child is gone, no status, no rusage
    except ChildProcessError:
        pass
    os._exit(0)'''


@pytest.mark.slow
def test_on_the_cpu_clock_every_process_of_a_run_is_billed_and_an_honest_baseline_is_not(repo, env,
                                                                                         bwrap_or_skip):
    """Through the CLI: a 40 KB honest train.py's stat baseline on the cpu clock keeps its 3 runs (each audited: an
    evaluation's CPU was billed to the next run, and the second was refused), and a candidate that burns 40 CPU-s
    in a child the kernel reaps is refused on the clock (it was kept: issue 50)."""
    bwrap_or_skip()
    import random

    from conftest import cli, sh
    # a 40 KB honest train.py: functions without repeats (zlib's 32 KB window charged such a file 12 KB unchanged,
    # and its baseline was refused)
    rng = random.Random(0)
    filler = "".join(f"\n\ndef unused_{i}_{rng.getrandbits(40):x}(x):\n    return x * {rng.random():.9f}\n"
                     for i in range(600))
    (repo / "train.py").write_text((repo / "train.py").read_text() + filler)
    assert len((repo / "train.py").read_bytes()) > 40_000
    sh(repo, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "a larger train.py")
    cpu = dict(env, AUTORESEARCH_BUDGET_CLOCK="cpu", AUTORESEARCH_OUTSIDE_ALLOWANCE="12")
    assert cli(repo, "setup", "--tag", "c", env=cpu).returncode == 0
    tag = json.loads((repo / ".autoresearch" / "tags" / "c.json").read_text())
    assert tag["accounting"].startswith("cgroup")
    out = cli(repo, "run", "-m", "baseline", env=cpu)
    assert out.returncode == 0 and out.stdout.count("| baseline ") == 3, out.stdout + out.stderr
    source = (repo / "train.py").read_text()
    head, tail = source.rsplit("    os._exit(0)", 1)  # train.py ends its process itself, after the result
    (repo / "train.py").write_text(ATTACK_PRELUDE + head + ATTACK_END + tail)
    out = cli(repo, "run", "-m", "a child trains unseen", env=cpu)
    assert "of CPU per thread" in out.stdout + out.stderr, out.stdout + out.stderr
    from autoresearch import ledger
    last = ledger.read(repo / "results.tsv")[-1]
    assert last.status == "refused"


def test_a_base_keeps_no_setuid_bit_and_nothing_writable_by_others(tmp_path):
    """A compile phase is uid 0 inside its sandbox where root starts it, and owns what it writes: it made a copy of
    /bin/sh setuid root in its base, on the host's disk (the red team's). check() clears every mode bit beyond
    0755 (the phase has ended: nothing races it)."""
    base = tmp_path / "base"
    (base / "headers").mkdir(parents=True)
    (base / "sh").write_bytes(b"#!/bin/sh\n")
    os.chmod(base / "sh", 0o4777)
    os.chmod(base / "headers", 0o1777)
    compiled.check(base)
    assert stat.S_IMODE((base / "sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((base / "headers").stat().st_mode) == 0o755


def test_a_seed_base_that_fails_to_copy_starts_the_new_base_empty_and_bounded(tmp_path, monkeypatch):
    """A new configuration's base starts as a copy of the tag's base configuration's; when that copy fails halfway
    (the seed pruned meanwhile, a file swapped for a FIFO after the check) the new base starts empty, on the
    bounded directory the phase was given. The failed copy used to remove that directory (unmounting its tmpfs)
    and the fallback then crashed on it: FileNotFoundError out of the compile phase."""
    from autoresearch.evaluator import safe_read
    bases = tmp_path / "bases"
    (bases / "seed" / "headers").mkdir(parents=True)
    (bases / "seed" / "graph.bin").write_bytes(b"x" * 100)
    (bases / "seed.done").write_text("{}")
    dest = tmp_path / "base"
    mounted = scratch.bounded_dir(dest, 1 << 20)

    def vanished(src, dst, limit):
        raise FileNotFoundError(2, "No such file or directory", str(src))
    monkeypatch.setattr(safe_read, "copy_regular", vanished)
    try:
        assert compiled.begin_base(dest, bases, "seed") == "empty"
        assert (dest / "headers").is_dir() and not (dest / "graph.bin").exists()
        assert os.path.ismount(dest) == mounted  # still the bounded directory the phase was given
    finally:
        scratch.release(dest)


def test_a_compile_phase_runs_bounded_by_the_kernel(tmp_path, small_cache, monkeypatch):
    """The phase in a cgroup of its own (memory, processes; all of it killed after) with every file capped, on a
    scratch base (a tmpfs where the harness may mount): it wrote 513 MB of real disk, unbounded, for up to 300 s."""
    from autoresearch import cgroups
    if cgroups.make("probe")[0] is None:
        pytest.skip("no cgroup can be made here")
    monkeypatch.setenv("AUTORESEARCH_CACHE", str(small_cache))
    cache = tmp_path / "cache"
    cache.symlink_to(small_cache)
    probe = ('import os, resource, sys\nprint("CGROUP", open("/proc/self/cgroup").read().replace(chr(10), " "))\n'
             'print("FSIZE", resource.getrlimit(resource.RLIMIT_FSIZE)[0])\n'
             'print("BASE", os.environ["TORCHINDUCTOR_CACHE_DIR"])\nsys.exit(1)\n')
    logs = []
    protection = "bwrap" if sandbox.bwrap_works() else "none"
    compiled.ensure_base(half(cache), TAG, compiled.Wanted("0123456789ab", probe), protection, log=logs.append)
    text = "\n".join(logs)
    assert "CGROUP" in text and cgroups.PREFIX in text, text
    assert f"FSIZE {compiled.BASE_LIMIT}" in text
    assert str(compiled.root(cache)) not in text.split("BASE", 1)[1]  # a scratch base, not the one on disk
    mine = f"{cgroups.PREFIX}{os.getpid()}-phase-"
    assert not any(p.name.startswith(mine) for d in (cgroups.v1_dir("cpuacct"), cgroups.v2_dir())
                   if d is not None for p in d.iterdir())  # removed after the phase


def test_the_evaluator_sees_only_what_the_harness_accepted_from_out(tmp_path):
    """Under bubblewrap the evaluator starts while the training does; it has the harness's directory of accepted
    files bound at out/'s path, never the tmpfs the training writes (the red team read a link and 32 MB of junk
    through it after settle() had dropped them)."""
    out, kept = tmp_path / "out", tmp_path / "out.kept"
    out.mkdir()
    kept.mkdir()
    argv = sandbox.wrap_evaluator(["true"], tmp_path, tmp_path, out, kept)
    at = argv.index(str(out))
    assert argv[at - 1] == str(kept) and argv[at - 2] == "--ro-bind"
    assert str(out) not in argv[:at - 1]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may mount the tmpfs")
def test_a_tmpfs_whose_harness_died_is_unmounted_by_the_next_one(tmp_path):
    """A parallel loop's worker killed mid-run never settles its run's out/: its tmpfs (and what the training wrote
    in it, in memory) stayed mounted until reboot. Each is named by its maker's pid; the next mount sweeps those of
    a process that is gone."""
    from autoresearch import scratch
    out = tmp_path / "out"
    out.mkdir()
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r}); "
            f"from autoresearch import scratch; from pathlib import Path; scratch.mount(Path({str(out)!r}), 1 << 20)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)  # mounted, then its process is gone
    assert os.path.ismount(out)
    other = tmp_path / "other"
    assert scratch.bounded_dir(other, 1 << 20)
    try:
        assert not os.path.ismount(out)
    finally:
        scratch.release(other)


# --- what the training left never makes the harness itself fail (issue 50, a red team's round after it landed) ---

def test_every_value_of_result_json_the_harness_reads_is_typed_before_it_is_read():
    """An `export_error` of 1 made the harness fail slicing it, after the training: the run was left
    "interrupted" and the same train.py ran again on its seed (a redraw on demand). Every key the harness reads is
    typed now, and a dtype is one the evaluator scores."""
    from autoresearch import fixed
    good = {"memory_gb": 0.1, "num_steps": 3, "training_seconds": 2.0, "time_budget": 2.0, "check_bpb": 2.5,
            "device": "cpu", "dtype": "float32", "seed": 42}
    assert fixed.check_result(good) == [] and fixed.check_result(dict(good, export_error=None, val_bpb=None)) == []
    for bad, says in [({"export_error": 1}, "export_error"), ({"val_bpb": "low"}, "val_bpb"),
                      ({"val_bpb": float("nan")}, "not finite"), ({"check_bpb": float("inf")}, "not finite"), ({"compile_seconds": [1]}, "compile_seconds"),
                      ({"data_seed": 4.2}, "data_seed"), ({"dtype": "float8"}, "float8"),
                      ({"memory_gb": 10 ** 400}, "memory_gb"), ({"num_steps": -10 ** 20}, "num_steps"),
                      ({"dtype": "\x1b]52;c;x\x07"}, "dtype")]:
        problems = fixed.check_result(dict(good, **bad))
        assert problems and says in problems[0] and "\x1b" not in problems[0], (bad, problems)


@pytest.mark.slow
def test_a_failure_while_reading_what_a_training_left_is_its_crash_never_an_interruption(repo, env, monkeypatch):
    """Through run_once with a real training: anything that fails in the harness while it reads what the run left
    (here the evaluation, made to raise) is recorded as the run's crash, with pending.json gone, and the same
    train.py may not start again (it was an interruption, redrawn on its seed, on demand). And through the CLI: a
    result.json whose export_error is 1 is a crash that names the key."""
    from conftest import cli

    from autoresearch import execute, ledger, run
    assert cli(repo, "setup", "--tag", "r", env=env).returncode == 0
    assert cli(repo, "run", "-m", "baseline", env=env).returncode == 0
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(repo)

    def fails(*args, **kwargs):
        raise TypeError("'int' object is not subscriptable")
    monkeypatch.setattr(execute, "evaluated", fails)
    (repo / "train.py").write_text((repo / "train.py").read_text() + "# a candidate\n")
    outcome = run.run_once(repo, "a candidate", run.Options(log=lambda *a: None))
    assert outcome.row.status == "crash" and "could not check what the run left (TypeError" in outcome.row.description
    assert outcome.row.decision != "interrupted" and not (repo / ".autoresearch" / "pending.json").exists()
    monkeypatch.undo()

    source = (repo / "train.py").read_text()
    call = '    finish(model, {**budget.stats(), "num_params": model.num_params()}, EVAL_BATCH_SIZE)'
    assert call in source
    (repo / "train.py").write_text(source.replace(call, call.replace('"num_params"', '"export_error": 1, "num_params"')))
    out = cli(repo, "run", "-m", "export_error 1", env=env)
    last = ledger.read(repo / "results.tsv")[-1]
    assert not (repo / ".autoresearch" / "pending.json").exists(), out.stdout + out.stderr
    assert last.status == "crash" and "export_error=1" in last.description, out.stdout + out.stderr


def test_the_training_sees_the_fa3_kernel_of_the_hugging_face_cache_and_nothing_else(tmp_path, small_cache,
                                                                                     monkeypatch):
    """The whole HF_HOME was bound into every training, for FA3: a user's cached datasets with it (climbmix's
    held-out pool is one). Only the kernel's repository is."""
    hf = tmp_path / "hf"
    (hf / "hub" / sandbox.FA3_CACHE / "snapshots").mkdir(parents=True)
    (hf / "hub" / "datasets--karpathy--climbmix-400b-shuffle").mkdir(parents=True)
    (hf / "token").write_text("secret")
    monkeypatch.setenv("HF_HOME", str(hf))
    run_dir = tmp_path / "run"
    (run_dir / sandbox.OUT_DIR).mkdir(parents=True)
    manifest = json.loads((small_cache / "manifest.json").read_text())
    sandbox.make_view(run_dir, small_cache, manifest)
    argv = sandbox.wrap([sys.executable, "train.py"], tmp_path, run_dir, small_cache, manifest)
    bound = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--ro-bind", "--bind")]
    assert str(hf / "hub" / sandbox.FA3_CACHE) in bound
    assert not [b for b in bound if b.startswith(str(hf)) and b != str(hf / "hub" / sandbox.FA3_CACHE)], bound


def test_the_text_a_run_wrote_reaches_the_terminal_printable(tmp_path):
    """A training's log lines (a crash's tail, the loop's tail, plain step lines) and the reasons quoting it were
    printed raw: an OSC 52 clipboard write and a title escape reached the user's terminal."""
    from autoresearch import descriptions, state, supervise
    log = tmp_path / "run.log"
    log.write_text("step=1 | loss=9.0 | tok/s=100 | mfu=1.0% | elapsed=1s \x1b]52;c;cGF5bG9hZA==\x07\n"
                   "\x1b]0;title\x07crash\tdetail\n")
    assert "\x1b" not in state.tail(log) and "\x07" not in state.tail(log) and "crash\tdetail" in state.tail(log)
    elapsed, line = supervise.progress(log)
    assert line is not None and "\x1b" not in line
    assert "\x1b" not in descriptions.noted("x", descriptions.CRASH, "bad \x1b[2J\nthing")


def test_an_agent_may_not_choose_a_runs_seed_through_the_broker(repo):
    """An agent sees every run's seed and val_bpb (status --json): its own `--seed` would start a candidate on
    seeds that were lucky for other configurations."""
    from autoresearch import broker
    from autoresearch.cli import build_parser
    with pytest.raises(broker.BrokerError, match="seed"):
        broker.check(["run", "-m", "x", "--seed", "44"], repo, build_parser())


def test_a_train_py_that_is_not_a_plain_file_is_refused_before_anything_reads_it(repo, env):
    """An agent may leave anything at train.py's path: a FIFO (a read blocks for ever), a sparse file of 100 GB
    (read whole by `status` and the run's checks, outside the agent's memory limit). Refused with the fix named,
    before git or the harness hashes it; `status` still answers."""
    from conftest import cli
    assert cli(repo, "setup", "--tag", "f", env=env).returncode == 0
    (repo / "train.py").unlink()
    os.mkfifo(repo / "train.py")
    out = cli(repo, "run", "-m", "a fifo", env=env, timeout=60)
    assert out.returncode == 2 and "cannot be read as a plain file" in out.stderr and "git checkout" in out.stderr
    (repo / "train.py").unlink()
    with open(repo / "train.py", "wb") as f:
        f.truncate(100 << 30)
    out = cli(repo, "run", "-m", "sparse", env=env, timeout=60)
    assert out.returncode == 2 and "cannot be read as a plain file" in out.stderr, out.stderr
    assert cli(repo, "status", env=env, timeout=60).returncode == 0


def test_a_tree_thousands_of_directories_deep_is_removed_without_recursion_or_following_links(tmp_path):
    """A training may leave a tree 1,500 directories deep in out/ or its compile copy: Python's recursive walks
    raised RecursionError (not an OSError) while the harness cleaned up after the run, which left the run
    unrecorded and redrawn. Removed, paths past PATH_MAX included, a link inside never followed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    top = tmp_path / "out"
    top.mkdir()
    here = os.getcwd()
    try:
        os.chdir(top)
        for i in range(3000):
            os.mkdir("a")
            os.chdir("a")
            if i % 1000 == 0:
                os.symlink(outside, "link")
                Path("f").write_text("x")
        os.chmod(".", 0)
    finally:
        os.chdir(here)
    assert scratch.remove_tree(top) and not top.exists()
    assert (outside / "keep").read_text() == "x"


def test_a_base_too_deep_to_name_is_refused_not_a_crash(tmp_path):
    """A training without bubblewrap can add to its compile base an empty chain of directories whose paths pass
    PATH_MAX (or, as a user other than root, one directory it may not list): state() does not see it, so its own
    run passes, and the next run's check raised OSError, which left that run unrecorded and the base in place for
    every later run of the configuration (a helper's read). Now it is Unaccepted: the run is refused, the base
    thrown away."""
    base = tmp_path / "base"
    (base / "headers").mkdir(parents=True)
    (base / "graph.bin").write_bytes(b"x")
    here = os.getcwd()
    try:
        os.chdir(base)
        for _ in range(25):
            os.mkdir("d" * 200)
            os.chdir("d" * 200)
    finally:
        os.chdir(here)
    try:
        with pytest.raises(scratch.Unaccepted, match="cannot be read whole"):
            compiled.check(base)
        with pytest.raises(scratch.Unaccepted):
            compiled.private_copy(base, tmp_path / "run")
    finally:
        scratch.remove_tree(base)
