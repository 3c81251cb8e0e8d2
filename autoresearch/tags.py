"""A tag: one experiment branch and the file that pins what makes its runs comparable and honest.

`autoresearch setup` (or the first `loop`) writes .autoresearch/tags/<tag>.json once: the fixed half's
fingerprint, the budget and its clock, the hardware and its measured peak FLOP/s, and the rules (protection,
decision rule, hard timeout, allowance outside the budget, largest train.py and what it may carry beyond the
base, compressed), and the id of its secret draw of scored rows (heldout.py). A run asking for weaker settings
is refused (Tag.pin_problems); a run from a machine or fixed half that differs is refused (preflight).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from autoresearch import (cgroups, confine, decide, fixed, git, heldout, ledger, machine, sandbox, scratch, state,
                          tagconfig)
from autoresearch.errors import HarnessError
from autoresearch.tagconfig import DEFAULT_RULE, Tag

# Seconds a run may take beyond its budget until its process ends (startup, the last step's overshoot, export,
# the check), recorded in the tag at setup. Fixed, not a share of the budget: what happens outside the budget does
# not grow with it, and a training that owns its clock could spend an unused share training (docs/integrity.md).
# The default model needs a few seconds of it on 2 CPU cores; a GPU adds CUDA and kernel start-up (BENCHMARKS.md).
ALLOWANCE_FIXED = {"cpu": 15.0, "gpu": 30.0}


def repo_root(start: Path | None = None) -> Path:
    try:
        root = git.toplevel(start or Path.cwd())
    except git.GitError as e:
        raise HarnessError(str(e)) from None
    for name in ("train.py", "prepare.py"):
        if not (root / name).exists():
            raise HarnessError(f"{root} has no {name}: run autoresearch from the autoresearch repository.")
    return root


def setup(repo: Path, tag: str, threads: int | None = None, sandbox_mode: str = "auto", rule: str | None = None,
          timeout: float | None = None) -> dict:
    """A new experiment branch and its tag file. The tag pins what makes its runs comparable and honest: the
    fixed half's fingerprint, the budget and its clock, the hardware and its measured peak FLOP/s, and the rules:
    the protection (sandbox), the decision rule, the hard timeout, the allowance outside the budget and the
    largest train.py. A run that asks for weaker settings than its tag is refused (pin_problems)."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+", tag):
        raise HarnessError(f"Tag {tag!r}: use letters, digits, '.', '_' or '-' (for example `mar5`).")
    name = state.BRANCH_PREFIX + tag
    if git.branch_exists(repo, name):
        raise HarnessError(f"Branch {name} already exists. Pick a new tag, or continue that one with "
                           f"`git checkout {name}`.")
    dirty = [p for p in git.changed_files(repo)]
    if dirty:
        raise HarnessError("Uncommitted changes: " + ", ".join(dirty[:5]) + ". Commit or stash them first, so the "
                           "baseline is exactly the committed train.py.")
    rule = DEFAULT_RULE if rule is None else rule
    if rule not in decide.RULES:
        raise HarnessError(f"--decision {rule!r}: use {DEFAULT_RULE} (the default), "
                           + " or ".join(r for r in decide.RULES if r != DEFAULT_RULE) + ".")
    try:
        protection = sandbox.protection(sandbox_mode)
    except sandbox.SandboxError as e:
        raise HarnessError(str(e)) from None
    fingerprint = fixed.fingerprint(repo)
    digests = fixed.committed_digests(repo)
    import prepare
    budget, clock = fixed.budget(), fixed.clock()
    profile = prepare.require_manifest()["profile"]
    hardware = machine.hardware()
    if clock == "cpu" and hardware.get("device") != "cpu":
        # CPU seconds do not count a GPU's work: a training that waits on the GPU sleeping would never run out
        raise HarnessError(f"AUTORESEARCH_BUDGET_CLOCK=cpu measures CPU seconds, and this machine trains on "
                           f"{hardware.get('device')}: its work would not be counted. Unset it (the wall clock).")
    config = Tag(tag=tag, branch=name, fingerprint=fingerprint, budget_s=budget, clock=clock,
                 base_commit=git.head(repo), fixed_sha256=digests, hardware=hardware,
                 created=time.strftime("%Y-%m-%dT%H:%M:%S"), protection=protection, decision=rule,
                 allowance_s=outside_allowance(profile), timeout_s=timeout or tagconfig.default_timeout(budget, clock),
                 draw_id=heldout.new_draw(), compile_cache=compile_cache_mode(),
                 accounting=cgroups.available(), scratch="tmpfs" if scratch.can_mount() else "disk",
                 out_limit_bytes=scratch.out_limit(),
                 threads=threads)  # parallel workers: each run gets this many threads (threads_per_run)
    config = replace(config, peak_flops=machine_peaks(fixed.clean_sources(repo, config), config.threads_per_run(),
                                                      config.hardware))
    confine.record_cache(prepare.cache_dir())  # a cache prepared before caches were recorded: its secrets beside it
    git.git(repo, "checkout", "-q", "-b", name)
    state.atomic_json(state.tag_file(repo, tag), config.to_json())
    ledger.create(state.results(repo))
    return config


def load_tag(repo: Path) -> Tag:
    name = git.branch(repo)
    if not name.startswith(state.BRANCH_PREFIX):
        raise HarnessError(f"On branch {name!r}, not an experiment branch. Start one with "
                           f"`autoresearch setup --tag TAG`, or `git checkout autoresearch/TAG` to continue one.")
    tag = name[len(state.BRANCH_PREFIX):]
    path = state.tag_file(repo, tag)
    if not path.exists():
        raise HarnessError(f"No record of tag {tag!r} in {path}. Run `autoresearch setup --tag NEWTAG` "
                           "from the commit you want as baseline.")
    ledger.check_header(state.results(repo))
    return tagconfig.read(path)


def compile_cache_mode() -> str:
    """champion (the default: every run starts from the champion's compile cache, compiled.py) or off (every run
    compiles cold; AUTORESEARCH_COMPILE_CACHE=off at setup, for tests of eager code)."""
    mode = os.environ.get("AUTORESEARCH_COMPILE_CACHE", "").strip() or "champion"
    if mode not in ("champion", "off"):
        raise HarnessError(f"AUTORESEARCH_COMPILE_CACHE={mode!r}: use champion (the default) or off.")
    return mode


def machine_peaks(sources: dict[str, bytes], threads: int, hardware: dict) -> dict:
    """measure_peaks, remembered per machine, thread count and torch in a file beside the data cache that only the
    harness writes (a sandboxed training cannot see it): setting up a tag costs ~4 s of probing once per
    machine, not once per tag."""
    import prepare
    cache = prepare.cache_dir()
    path = cache.parent / f"{cache.name}-machine.json"
    key = json.dumps([hardware, threads], sort_keys=True)
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict) or not isinstance(known.get(key), dict):
        known = known if isinstance(known, dict) else {}
        known[key] = measure_peaks(sources, threads)
        state.atomic_json(path, known)
    return known[key]


def measure_peaks(sources: dict[str, bytes], threads: int) -> dict:
    """The machine's peak FLOP/s per dtype, measured by the harness in a fresh process with the clean fixed files
    and the runs' thread count, once per tag: every run reads it from its view, none can change it."""
    with tempfile.TemporaryDirectory(prefix="autoresearch-peak-") as d:
        fixed.write_sources(sources, Path(d))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTORESEARCH_", "PYTHON"))}
        env["OMP_NUM_THREADS"] = str(threads)
        proc = subprocess.run([sys.executable, "-I", "-c", "import json, sys; sys.path.insert(0, sys.argv[1]); "
                               "import runtime; print(json.dumps(runtime.measure_peaks(int(sys.argv[2]))))",
                               d, str(threads)], env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise HarnessError(f"measuring this machine's peak FLOP/s failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def outside_allowance(profile: str) -> float:
    """Seconds a run may take beyond its budget until its process ends: startup (imports, data, model), the last
    step's overshoot, the export and check in prepare.finish (ALLOWANCE_FIXED); AUTORESEARCH_OUTSIDE_ALLOWANCE at
    setup overrides it. Recorded in the tag. See docs/integrity.md."""
    raw = os.environ.get("AUTORESEARCH_OUTSIDE_ALLOWANCE")
    if raw:
        value = tagconfig.float_or_none(raw)
        if value is None or not value >= 0:
            raise HarnessError(f"AUTORESEARCH_OUTSIDE_ALLOWANCE={raw!r} is not a number of seconds.")
        return value
    return ALLOWANCE_FIXED[profile]


def config_of(repo: Path, commit: str) -> str:
    """A configuration's name: the git blob of its train.py, 12 hex digits."""
    return git.git(repo, "rev-parse", f"{commit}:{state.EDITABLE}")[:12]


def last_kept_commit(repo: Path, config: Tag, rows: list[ledger.Row]) -> str:
    kept = [r for r in rows if r.status == "keep"]
    return git.git(repo, "rev-parse", kept[-1].commit) if kept else config.base_commit


def branch_target(repo: Path, config: Tag, rows: list[ledger.Row]) -> str:
    """Where the branch belongs between runs: on the candidate while its confirmation series is open, else on
    the champion (the last kept commit). Of several open series (a parallel loop's leftovers), the one the next
    run finishes first (study.py: the oldest)."""
    found = decide.unfinished(rows)
    series = found[0] if found else None
    if series is not None and series.kind == "candidate":
        return git.git(repo, "rev-parse", series.commit)
    return last_kept_commit(repo, config, rows)


def preflight(repo: Path, config: Tag, worker: bool = False) -> str | None:
    """Why a run from `repo` would not be comparable with the tag's other runs, or None: the fixed half, the
    budget, the clock and the hardware must all be the tag's. A worker may have more cores than its share."""
    try:
        fingerprint = fixed.fingerprint(repo)
    except HarnessError as e:  # a data file no longer matches its sha256
        return str(e).rstrip(".")
    if fingerprint != config.fingerprint:
        return ("the fixed half (prepare.py, the prepared data or the tokenizer) differs from when this tag was "
                "set up; restore it (`git checkout -- prepare.py`, `python prepare.py --force` for the data) or "
                "start a new tag")
    budget = fixed.budget()
    if budget != config.budget_s:
        return (f"the time budget is {budget} s but this tag was set up with {config.budget_s} s; "
                f"set AUTORESEARCH_TIME_BUDGET accordingly (unset for 300 s)")
    clock = config.clock
    if fixed.clock() != clock:
        return (f"AUTORESEARCH_BUDGET_CLOCK is {fixed.clock()} but this tag runs on the {clock} clock, and "
                f"results under different clocks are never compared; set it to {clock} (wall: unset it), or "
                f"start a new tag")
    here = machine.hardware()
    recorded = config.hardware or here
    changed_hw = machine.differences(recorded, here, ignore=("cores",) if worker else ())
    if worker and here["cores"] < config.threads_per_run():
        changed_hw.append(f"{here['cores']} cores for {config.threads_per_run()} threads per run")
    if changed_hw:
        return (f"this tag was set up on {machine.describe(recorded)}, and this machine is "
                f"{machine.describe(here)} ({'; '.join(changed_hw)}): its results would not be comparable. Start a "
                "new tag here (`autoresearch setup --tag NEWTAG`, or `autoresearch loop --tag NEWTAG`); the old "
                "tag's rows stay in results.tsv")
    return None


def existing(repo: Path, tag: str | None) -> dict | None:
    """The tag the loop would continue (see ensure), or None when it would create one."""
    current = git.branch(repo)
    if current.startswith(state.BRANCH_PREFIX) and (tag is None or current == state.BRANCH_PREFIX + tag):
        return load_tag(repo)
    if tag is None or not git.branch_exists(repo, state.BRANCH_PREFIX + tag):
        return None
    path = state.tag_file(repo, tag)
    return tagconfig.read(path) if path.exists() else None


def ensure(repo: Path, tag: str | None, log=print, threads: int | None = None, sandbox_mode: str | None = None,
           rule: str | None = None) -> dict:
    """Stay on the current experiment branch; else continue or create the given tag (default: today's date).
    `threads`: the threads per run of a new tag (parallel workers); sandbox_mode and rule: a new tag's pins."""
    current = git.branch(repo)
    if current.startswith(state.BRANCH_PREFIX) and (tag is None or current == state.BRANCH_PREFIX + tag):
        return load_tag(repo)
    tag = tag or time.strftime("%b%d").lower()
    if git.branch_exists(repo, state.BRANCH_PREFIX + tag):
        if state.tag_file(repo, tag).exists():
            git.git(repo, "checkout", "-q", state.BRANCH_PREFIX + tag)
            log(f"continuing tag {tag}")
            return load_tag(repo)
        n = 2
        while git.branch_exists(repo, f"{state.BRANCH_PREFIX}{tag}-{n}"):
            n += 1
        tag = f"{tag}-{n}"
    config = setup(repo, tag, threads, sandbox_mode or "auto", rule)
    log(f"new tag {tag}: branch {config.branch}")
    return config
