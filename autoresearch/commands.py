"""What the CLI's smaller commands do, each returning the text it prints: `status` (read-only, safe beside a
running loop) and `ideas` (the catalog against train.py and the tag's record, or one idea written into
train.py). cli.py parses and dispatches; the imports stay inside each command, so `autoresearch --help` loads
nothing heavy."""

from __future__ import annotations

from pathlib import Path


def status(repo: Path) -> str:
    """`autoresearch status`. Read-only: it never recovers, kills or writes anything, so it is safe next to a running loop."""
    import json

    from autoresearch import git, ledger, lock, recovery, state, tags

    config = tags.load_tag(repo)
    damaged = []
    rows = ledger.read(state.results(repo), config.tag, damaged=damaged, verification=True)
    counts = {s: sum(r.status == s for r in rows) for s in ledger.STATUSES}
    from autoresearch import facts, machine, report
    hw = f" | {machine.describe(config.hardware)}" if config.hardware else ""
    lines = [f"branch {git.branch(repo)} | budget {config.budget_s:g} s on the {config.clock} clock | "
             f"fingerprint {config.fingerprint[:12]}{hw}", report.champion_text(rows, report.configurations(rows, repo)),
             "runs: " + ", ".join(f"{counts[s]} {s}" for s in ledger.STATUSES
                                  if counts[s] or s not in ("control", "verify"))]
    for r in rows[-8:]:
        lines.append(f"  {r.commit}  {r.val_bpb:.6f}  {r.memory_gb:5.1f}  {r.status:8s} "
                     f"{f'[{r.worker}] ' if r.worker else ''}{r.description}"
                     + (f"  ({r.decision})" if r.decision and r.decision != "interrupted" else ""))
    from autoresearch import verified
    progress = verified.read_state(repo, config.tag)
    if progress or any(r.status == "verify" for r in rows):
        lines.append(verified.text(verified.table(rows, progress.get("notes")))
                     + (f"\n  ({progress['finished']}/{progress['planned']} planned runs done)" if progress else ""))
    pending = recovery.read_pending(repo)
    if pending is not None:
        if lock.is_held(state.state_dir(repo)):
            lines.append(f"in flight: {pending['description']} (run {pending['run_id']}, started {pending['started']})")
        else:
            lines.append(f"interrupted: {pending['description']} (run {pending['run_id']}); its harness died, and the "
                         "next `autoresearch run` or `loop` records it and puts the branch back")
    alive = lock.is_held(state.state_dir(repo))
    waiting = state.waiting_file(repo)
    if alive and waiting.exists():
        try:
            lines.append(json.loads(waiting.read_text())["text"])
        except (OSError, ValueError, KeyError):
            pass
    for job in facts.in_flight(repo):  # a parallel loop's runs (pending.json is shown above)
        if job.get("worker"):
            lines.append(f"{'in flight' if alive else 'interrupted'} on {job['worker']} ({job.get('host')}): "
                         f"{job['description']} (run {job['run_id']}, started {job['started']})"
                         + ("" if alive else "; its driver died, and the next `autoresearch loop` or `run` records it"))
    room = carried(repo, config)
    if room:
        lines.append(f"train.py carries {room['carried_bytes']:,} of the {room['limit_bytes']:,} bytes it may beyond the "
                     f"tag's base ({room['left_bytes']:,} left; docs/integrity.md)")
    lines += report.flag_lines(rows)
    lines += [f"warning: {problem}" for problem in damaged]
    return "\n".join(lines)


def carried(repo: Path, config) -> dict | None:
    """The work tree's train.py against the tag's limit on what it carries (heldout.headroom); None unreadable."""
    from autoresearch import git, heldout, state
    try:
        base = git.git(repo, "show", f"{config.base_commit}:{state.EDITABLE}", strip=False).encode()
        return heldout.headroom((repo / state.EDITABLE).read_bytes(), config, base)
    except (OSError, git.GitError):
        return None


def ideas(repo: Path, apply: list[str] | None) -> str:
    """`autoresearch ideas`: the catalog against train.py and this tag's record, or with --apply, one idea
    written into train.py (nothing else changes; `autoresearch run` then runs it)."""
    import ast

    import prepare

    from autoresearch import errors, ideas, ledger, proposer, state, tags
    from autoresearch.edit import EditError
    manifest = prepare.load_manifest()
    profile = manifest["profile"] if manifest else prepare.default_profile()
    path = repo / state.EDITABLE
    source = path.read_text()
    if apply:
        name, *pairs = apply
        if name not in ideas.IDEAS:
            raise errors.HarnessError(f"no idea {name!r}; `autoresearch ideas` lists them: "
                                      + ", ".join(ideas.IDEAS))
        idea, params = ideas.IDEAS[name], {}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or key not in idea.params:
                raise errors.HarnessError(f"{pair!r}: give KEY=VALUE with KEY one of {', '.join(idea.params)}")
            try:
                params[key] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                params[key] = value
        held = ideas.current(idea, source, profile) or {}
        params = {k: params.get(k, held.get(k)) for k in idea.params}
        if params not in ideas.variants(idea, profile):
            raise errors.HarnessError(f"{name}: {params} is not one of its variants: "
                                      + " | ".join(proposer.params_text(v) for v in ideas.variants(idea, profile)))
        try:
            path.write_text(ideas.apply(source, idea, params, profile))
        except EditError as e:
            raise errors.HarnessError(f"{name}: {e}") from None
        return f"train.py now has {ideas.describe(idea, params)} (describe the run so: autoresearch run -m " \
               f"\"{ideas.describe(idea, params)}\")"
    try:
        rows = ledger.read(state.results(repo), tags.load_tag(repo).tag)
    except errors.HarnessError:  # not on an experiment branch: the catalog alone
        rows = []
    return proposer.knowledge(rows, source, profile, repo=repo)
