"""What the CLI's smaller commands do, each returning the text it prints: `status` (read-only, safe beside a
running loop), `ideas` (the catalog against train.py and the tag's record, or one idea written into train.py),
`best` and `sample` (the champion) and `clean` (below). cli.py parses and dispatches; the heavy imports (torch)
stay inside the commands that need them, so `autoresearch --help` loads nothing heavy."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from autoresearch import (compiled, decide, descriptions, errors, git, ledger, sandbox, sites, state, tagconfig,
                          tags)
from autoresearch.errors import HarnessError


def status(repo: Path) -> str:
    """`autoresearch status`. Read-only: it never recovers, kills or writes anything, so it is safe next to a running loop."""
    import json

    from autoresearch import git, ledger, record, state, tags

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
    pending = record.read_pending(repo)
    if pending is not None:
        if state.is_held(state.state_dir(repo)):
            lines.append(f"in flight: {pending.trial.description} (run {pending.trial.run_id}, started {pending.trial.started})")
        else:
            lines.append(f"interrupted: {pending.trial.description} (run {pending.trial.run_id}); its harness died, and the "
                         "next `autoresearch run` or `loop` records it and puts the branch back")
    alive = state.is_held(state.state_dir(repo))
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
    from autoresearch import tokens
    bill = tokens.bill(repo, config.tag, [r for r in rows if r.status != "verify"],  # as report and facts count
                       tokens.prices_or_none(warnings=damaged))
    if bill is not None:  # the agent's tokens, where the harness started one on this tag
        lines += tokens.lines(bill, each=False)
    lines += report.flag_lines(rows)
    lines += [f"warning: {problem}" for problem in damaged]
    return "\n".join(lines)


def carried(repo: Path, config) -> dict | None:
    """The work tree's train.py against the tag's limit on what it carries (heldout.headroom); None unreadable."""
    from autoresearch import git, heldout, state, untrusted
    try:
        base = git.git(repo, "show", f"{config.base_commit}:{state.EDITABLE}", strip=False).encode()
        return heldout.headroom(untrusted.work_tree_source(repo), config, base)
    except (OSError, git.GitError, HarnessError):
        return None


def ideas(repo: Path, apply: list[str] | None) -> str:
    """`autoresearch ideas`: the catalog against train.py and this tag's record, or with --apply, one idea
    written into train.py (nothing else changes; `autoresearch run` then runs it)."""
    import prepare

    from autoresearch import errors, ideas, ledger, proposer, state, tags
    from autoresearch.sites import EditError
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
            params[key] = sites.literal(value)
            if params[key] is sites.NOT_A_VALUE:
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


# --- the champion: best and sample --------------------------------------------------------------------------------
# The morning's result: the champion of a tag (`autoresearch best`) and text generated by its exported model
# (`autoresearch sample`).
# 
# The exported model is the one the harness scored: model.graph.json and model.safetensors in the kept run's out/.
# It is loaded the way the evaluator loads it (evaluator/graph.py: the graph is checked and rebuilt before torch
# reads it, and nothing the run wrote is executed), so sampling a model is as safe as scoring it.

def model_dir(repo: Path, row: ledger.Row) -> Path | None:
    """Where a run's exported model is on this machine: its run directory's out/, or for a parallel loop's run
    the worker's run directory (cluster.py records it in evaluation.json; on this machine if the worker was)."""
    import json

    import prepare
    run_dir = state.run_dir(repo, row.run_id)
    candidates = [run_dir / sandbox.OUT_DIR]
    try:
        candidates.append(Path(json.loads((run_dir / state.EVALUATION).read_text())["worker_run_dir"]) /
                          sandbox.OUT_DIR)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    for out in candidates:
        if (out / prepare.GRAPH_FILE).is_file() and (out / prepare.TENSORS_FILE).is_file():
            return out
    return None


def kept_runs(repo: Path, rows: list[ledger.Row], config_id: str) -> list[ledger.Row]:
    """The configuration's kept runs whose exported model is still on disk here, newest first."""
    return [r for r in reversed(rows) if r.status == "keep" and r.key == config_id and model_dir(repo, r)]


def best(repo: Path) -> str:
    import prepare
    config = tags.load_tag(repo)
    rows = ledger.read(state.results(repo), config.tag)
    champ = decide.champion(rows)
    if champ is None:
        raise errors.HarnessError(f"tag {config.tag} has no kept run yet: the baseline comes first "
                               "(`autoresearch status` shows what is running).")
    key = champ.key
    values = decide.samples(rows).get(key, [champ.val_bpb])
    noise = decide.pooled_noise(decide.samples(rows))
    spread = f" +- {decide.sem(values, noise):.6f} (sem)" if noise else ""
    tests = [r.test_bpb for r in rows if r.status == "keep" and r.key == key and r.test_bpb]
    base = config.base_commit
    lines = [f"champion of tag {config.tag}: val_bpb {fmean(values):.6f}{spread} over {len(values)} run(s)",
             f"  commit {champ.commit}: {descriptions.base_description(champ.description)}",
             "  test_bpb " + (f"{fmean(tests):.6f} (held-out split, scored by the harness)" if tests else
                              "not scored (the baseline's first run scores it; see docs/integrity.md)")]
    models = kept_runs(repo, rows, key)
    if models:
        out = model_dir(repo, models[0])
        lines += [f"  exported model: {out / prepare.GRAPH_FILE} + {prepare.TENSORS_FILE}",
                  "  sample from it: autoresearch sample --prompt 'Once upon a time'",
                  "  load it in Python (checked the way the harness scores it):",
                  "    import prepare; from autoresearch.evaluator.graph import load_program",
                  f"    model, (batch, seq_len) = load_program(prepare, Path({str(out)!r}), 'cpu')",
                  "    logits = model(tokens)  # tokens: int64 (batch, seq_len)"]
    else:
        lines.append("  exported model: not on this machine (removed by `autoresearch clean`, rows from another "
                     "clone, or kept by a Ray worker on another machine)")
    try:
        diff = git.git(repo, "diff", "--stat", base, champ.commit, "--", state.EDITABLE)
    except git.GitError:
        return "\n".join(lines + [f"  train.py: commit {champ.commit} is not in this clone (recorded elsewhere)"])
    if champ.commit.startswith(base[:7]) or not diff:
        lines.append(f"  train.py: the tag's base ({base[:7]}), no change yet")
    else:
        lines += [f"  train.py against the tag's base ({base[:7]}): git diff {base[:7]} {champ.commit} -- train.py", ""]
        lines.append(git.git(repo, "diff", base, champ.commit, "--", state.EDITABLE))
    return "\n".join(lines)


def sample(repo: Path, prompt: str = "", tokens: int = 200, temperature: float = 0.8, seed: int = 0,
           run_id: str | None = None) -> str:
    """Text the champion's exported model (or run_id's) writes after `prompt`: one token at a time, each from
    the logits at the last position of the model's fixed-shape input (the context left-aligned, the rest of the
    row padding: the model is causal, the harness checks it)."""
    import json

    import prepare
    import torch

    from autoresearch.evaluator import graph, safe_read
    if tokens < 1 or not temperature >= 0:
        raise errors.HarnessError("--tokens must be at least 1 and --temperature at least 0 (0: the likeliest token).")
    config = tags.load_tag(repo)
    rows = ledger.read(state.results(repo), config.tag)
    if run_id is None:
        champ = decide.champion(rows)
        models = kept_runs(repo, rows, champ.key) if champ else []
        if not models:
            raise errors.HarnessError(f"tag {config.tag} has no kept model on disk yet (`autoresearch best` says "
                                   "why); give one with --run RUN_ID.")
        run_id = models[0].run_id
    found = [model_dir(repo, r) for r in rows if r.run_id == run_id]
    if not found:  # an id of this tag's ledger, never a path (an agent's `sample --run ../..` through the broker)
        raise errors.HarnessError(f"no run {run_id!r} in this tag's results.tsv (`autoresearch status` lists them).")
    out = found[0] or state.run_dir(repo, run_id) / sandbox.OUT_DIR
    if not (out / prepare.GRAPH_FILE).is_file():
        raise errors.HarnessError(f"run {run_id} has no exported model in {out} (only kept runs keep theirs).")
    try:
        result = json.loads(safe_read.read_regular(out / prepare.RESULT_FILE, safe_read.RESULT_LIMIT))
    except (OSError, ValueError, safe_read.Unsafe) as e:
        raise errors.HarnessError(f"run {run_id} has no readable {prepare.RESULT_FILE} ({e}).") from None
    device = result["device"] if result["device"] == "cpu" or torch.cuda.is_available() else "cpu"
    try:
        module, shape = graph.load_program(prepare, out, device)
    except (safe_read.Refused, safe_read.Broken) as e:
        raise errors.HarnessError(f"run {run_id}'s model cannot be loaded: {e}") from None
    batch, seq_len = shape
    tok = prepare.Tokenizer.from_directory()
    ids, vocab = tok.encode(prompt, prepend_bos=True), tok.get_vocab_size()
    generator = torch.Generator().manual_seed(seed)
    x = torch.zeros(shape, dtype=torch.long)
    new = []
    with torch.no_grad(), prepare.autocast_for(torch.device(device).type, result["dtype"]):
        for _ in range(tokens):
            context = (ids + new)[-seq_len:]
            x.zero_()
            x[0, :len(context)] = torch.tensor(context)
            logits = module(x.to(device))[0, len(context) - 1, :vocab].float().cpu()  # no padding ids
            if temperature == 0:
                nxt = int(logits.argmax())
            else:
                nxt = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator))
            new.append(nxt)
    return prompt + tok.decode(new)


# --- autoresearch clean -------------------------------------------------------------------------------------------
# `autoresearch clean`: what a night left on the disk that can go, how much, and (with --yes) deleting it.
# 
# Never deleted: the record (results.tsv, the tag files), every run's log and evaluation, and each tag's champion
# model (the newest kept run of its champion configuration). What can go is rebuilt when needed or was superseded:
# - exported models of kept runs that are no longer their tag's champion;
# - compile-cache bases (<cache>-compile) that are no tag's champion here (a base is named by compiled.key: the
#   champion's configuration, the tag's threads per run and machine), each deleted under its own lock (the next
#   run of a tag whose champion's base is gone fills it again: one compile phase; the cache is shared by every
#   clone that uses the same data cache, so another clone's champion may have to refill its base), and the bases
#   of the old layout (named by the configuration alone), which no run uses any more.
# The Ray working copies (<cache>-workers) are left alone: a parallel tag's kept models live there.

@dataclass
class Item:
    path: Path
    size: int
    why: str


def _size(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def plan(repo: Path) -> list[Item]:
    import prepare

    rows = ledger.read(state.results(repo), None, old_ok=True) if state.results(repo).exists() else []
    names = list(dict.fromkeys(r.tag for r in rows))
    keep_models, keep_bases = set(), set()
    for tag in names:
        mine = [r for r in rows if r.tag == tag]
        champ = decide.champion(mine)
        if champ is not None:
            key = champ.key
            try:  # the base its runs start from depends on the tag's threads per run and machine too
                keep_bases.add(compiled.key(key, tagconfig.read(state.tag_file(repo, tag))))
            except HarnessError:
                pass  # no tag file (a results.tsv copied in): its champion's base, if any, is refilled when needed
            keep_models.update(r.run_id for r in kept_runs(repo, mine, key)[:1])
    items = []
    for r in rows:
        out = state.run_dir(repo, r.run_id) / sandbox.OUT_DIR  # this clone's runs only (not a worker's)
        if r.status == "keep" and r.run_id not in keep_models:
            for name in (prepare.GRAPH_FILE, prepare.TENSORS_FILE):
                if (out / name).is_file():
                    items.append(Item(out / name, _size(out / name), f"model of a kept run of tag {r.tag} that "
                                                                     "is no longer its champion"))
    cache = prepare.cache_dir()
    bases = compiled.root(cache)
    if bases.is_dir():
        for base in sorted(p for p in bases.iterdir() if p.is_dir()):
            if "-" not in base.name:  # compiled.key always holds a "-", a configuration (git blob) never
                items.append(Item(base, _size(base), "compile-cache base of the old layout (keyed by the "
                                                     "configuration alone): no run uses it"))
            elif base.name not in keep_bases:
                items.append(Item(base, _size(base), "compile-cache base of no tag's champion here (refilled by "
                                                     "one compile phase if needed)"))
    return items


def delete(items: list[Item]) -> None:
    import fcntl
    for item in items:
        if item.path.is_dir():  # a compile base: under the lock its phase and its runs' copies take
            with open(item.path.parent / f"{item.path.name}.lock", "a+") as held:
                fcntl.flock(held, fcntl.LOCK_EX)
                (item.path.parent / f"{item.path.name}.done").unlink(missing_ok=True)
                shutil.rmtree(item.path, ignore_errors=True)
        else:
            item.path.unlink(missing_ok=True)


def text(items: list[Item], deleted: bool) -> str:
    if not items:
        return "nothing to clean: every file left is a record, a champion's model or in use"
    total = sum(i.size for i in items)
    lines = [f"{'deleted' if deleted else 'would delete'} {len(items)} item(s), {total / 1e6:.1f} MB:"]
    lines += [f"  {i.size / 1e6:8.1f} MB  {i.path}  ({i.why})" for i in items]
    if not deleted:
        lines.append("nothing was deleted; `autoresearch clean --yes` deletes these (records, logs and each tag's "
                     "champion model are always kept)")
    return "\n".join(lines)
