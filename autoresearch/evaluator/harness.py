"""The harness's side of the evaluator: Evaluator starts the script (a private copy of this package's other
modules, __main__.py) in a fresh, isolated interpreter, in its own sandbox under bubblewrap, and returns its
JSON. Never copied, and imported by none of the script's modules."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from autoresearch import processes, sandbox

from .scoring import Request


TIMEOUT = 1200               # seconds for one evaluation of one model
PREFIX = "autoresearch-eval-"  # an evaluator's private directory, in the temporary directory
OWNER = "owner.json"          # in it: the identity of the harness that made it (processes.identity)


def sweep_stale() -> int:
    """Remove the private directories of evaluators whose harness is gone: one killed with SIGKILL (a fault test, a
    killed loop) ran nothing that would have removed its own (62 were left in /tmp by two days of tests). One with
    no owner recorded is left alone: it may be one being made this instant."""
    removed = 0
    for d in Path(tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            owner = json.loads((d / OWNER).read_text())
        except (OSError, ValueError):
            continue
        if processes.same_process(owner) is None:
            shutil.rmtree(d, ignore_errors=True)
            removed += 1
    return removed


def copy_script(private: Path) -> Path:
    """The script side of this package (every module but this one) copied into `private`, as source files only:
    no __pycache__ of the work tree's comes along. Returns the copy's directory."""
    package = Path(__file__).parent
    copy = private / package.name
    copy.mkdir()
    for source in sorted(package.glob("*.py")):
        if source.name != Path(__file__).name:
            (copy / source.name).write_bytes(source.read_bytes())
    return copy


class Evaluator:
    """The script (copy_script) in a fresh, isolated interpreter with the clean fixed files `sources` (file name ->
    bytes: prepare.py and the runtime.py it imports) as the only prepare it can import, on the run whose output
    directory is `out`; run() hands it the Request and returns its JSON: val_bpb (and test_bpb,
    check_bpb, seconds), or refused / error with a reason. One run per Evaluator; close() ends it.

    Nothing the training could reach feeds it (docs/integrity.md, the threat model). Without a sandbox it starts
    in run(), once the training's whole process tree has ended (supervise.py), with the Request on its command
    line: a training running as you could write into a process started earlier. Under protection "bwrap" it
    starts at once (early): it imports torch (~2.7 s on 2 CPU cores) while the training starts, at the lowest
    priority, then reads the Request on its stdin, which only the harness holds: the training's sandbox has its
    own process namespace and no capability, so it cannot see this process, let alone write to it. There it
    runs in its own sandbox (sandbox.wrap_evaluator): it reads the graph and weights a run wrote, so it may
    write nothing, reach no network, and see nothing but the data, its private directory and `out`."""

    def __init__(self, sources: dict[str, bytes], cache: Path, out: Path, protection: str = "none",
                 source: Path | None = None):
        # source: the directory bound at out's path in its sandbox (scratch.kept_dir: the files the harness
        # accepted from out/, never out/ itself, whose tmpfs the training wrote)
        self.cache, self.out, self.protection, self.proc = cache, out, protection, None
        self.source = source or out
        sweep_stale()
        self.private = Path(tempfile.mkdtemp(prefix=PREFIX))
        (self.private / OWNER).write_text(json.dumps(processes.identity(os.getpid())))
        (self.private / "fixed").mkdir()
        for name, source in sources.items():
            (self.private / "fixed" / name).write_bytes(source)
        script = copy_script(self.private) / "__main__.py"  # a copy: it depends on no file of the work tree
        # -I: no PYTHON* variables, no user site, no script directory on sys.path; -B: no bytecode written. The
        # fresh private directory has no __pycache__, so prepare and the script's modules are compiled from their
        # sources (__main__.py puts the private directory on sys.path, which holds them alone). The harness's
        # PYTHONPATH is passed as arguments (a Python whose packages come through it), never a repository's.
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                 if p and Path(p).is_dir() and not (Path(p) / "prepare.py").exists()]
        self.argv = [sys.executable, "-I", "-B", str(script), "--prepare-dir", str(self.private / "fixed"),
                     *[a for p in paths for a in ("--path", p)]]
        if protection == "bwrap":
            self._start(["--wait"])

    def _start(self, args: list[str]) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "AUTORESEARCH_"))}
        env["AUTORESEARCH_CACHE"] = str(self.cache)
        argv = self.argv + args
        if self.protection == "bwrap":
            argv = sandbox.wrap_evaluator(argv, self.private, self.cache, self.out, self.source)
        # dead with the harness from its first instruction: the script's own prctl comes after Python's start-up,
        # and a harness killed in between left it running (benchmarks/faults.py, a kill while evaluating)
        argv = processes.tied_to_parent(argv)
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     stdin=subprocess.PIPE, start_new_session=True)

    def run(self, request: Request, on_start=None) -> dict:
        """Evaluate the finished run `request` names. Call it only once the training's whole process tree has
        ended. on_start(pid) is called first, so that a harness killed meanwhile can be cleaned up after."""
        early = self.proc is not None
        if not early:
            self._start(request.argv())
        try:
            if on_start:
                on_start(self.proc.pid)
            stdout, stderr = self.proc.communicate(json.dumps(asdict(request)) + "\n" if early else None,
                                                   timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            return {"error": f"the evaluation took longer than {TIMEOUT:.0f} s"}
        finally:
            self.close()
        lines = stdout.strip().splitlines()
        try:
            return json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            return {"error": f"the evaluation failed (exit {self.proc.returncode}): {stderr.strip()[-800:]}"}

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        shutil.rmtree(self.private, ignore_errors=True)


def run_evaluation(sources: dict[str, bytes], cache: Path, request: Request, protection: str = "none",
                   on_start=None) -> dict:
    """An Evaluator on the finished run `request` names, at once (Evaluator.run)."""
    return Evaluator(sources, cache, Path(request.run_dir), protection).run(request, on_start)

