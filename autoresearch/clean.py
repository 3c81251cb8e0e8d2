"""`autoresearch clean`: what a night left on the disk that can go, how much, and (with --yes) deleting it.

Never deleted: the record (results.tsv, the tag files), every run's log and evaluation, and each tag's champion
model (the newest kept run of its champion configuration). What can go is rebuilt when needed or was superseded:
- exported models of kept runs that are no longer their tag's champion;
- compile-cache bases (<cache>-compile) that are no tag's champion here (a base is named by compiled.key: the
  champion's configuration, the tag's threads per run and machine), each deleted under its own lock (the next
  run of a tag whose champion's base is gone fills it again: one compile phase; the cache is shared by every
  clone that uses the same data cache, so another clone's champion may have to refill its base), and the bases
  of the old layout (named by the configuration alone), which no run uses any more.
The Ray working copies (<cache>-workers) are left alone: a parallel tag's kept models live there.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from autoresearch import commands, compiled, decide, ledger, sandbox, state, tagconfig
from autoresearch.errors import HarnessError


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
            keep_models.update(r.run_id for r in commands.kept_runs(repo, mine, key)[:1])
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

