"""What a train.py can know of the held-out rows, bounded by arithmetic (docs/integrity.md, the memoriser).

Two parts, each set at setup and recorded in the tag:
- **What train.py carries.** Anything a model knows of the held-out text that it did not learn from the training
  split came in through train.py's text. carried_bytes() is train.py's edit script against the tag's base
  train.py (the base's line ranges it replaces and the lines that replace them), compressed: a real code for
  train.py given the base, whatever the base's size, so no train.py can carry more than 8 x that many bits the
  base did not hold, whatever its encoding. A run over the tag's limit
  (LIMIT_BYTES) is refused. The whole history of this project's train.py, 13 revisions, costs 1,840 bytes
  against its first; an honest night a few hundred.
- **Which rows are scored.** A secret per tag (its draw) picks the scored rows from the whole held-out pool
  (prepare.evaluation_rows). The secret lives beside the data cache, outside every repository, never mounted in
  a training's sandbox or the evaluator's, and hidden from every confined agent (confine.wrap_agent). A train.py
  that carries held-out text covers at most 8 x LIMIT_BYTES bits of a pool it cannot aim within: its expected
  gain is at most 8 x LIMIT_BYTES / (the pool's bytes) bits per byte.
"""

from __future__ import annotations

import os
import secrets
import uuid
import zlib
from pathlib import Path

from autoresearch.errors import HarnessError

LIMIT_BYTES = 3072   # what train.py may carry beyond its tag's base: its edit script against the base, compressed
WINDOW = 32768       # zlib's dictionary for the inserted lines: the base's last 32 KB (any base: it only helps)


def edit_script(source: bytes, base: bytes) -> bytes:
    """What turns `base` into `source`, line by line: for each changed stretch its range in the base and the
    lines that replace it. Whoever holds the base rebuilds `source` from it exactly (apply_script), so its
    compressed size is a real code for train.py given the base, whatever the base's size."""
    import difflib
    old, new = base.splitlines(keepends=True), source.splitlines(keepends=True)
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if op != "equal":
            out.append(b"@%d,%d,%d\n" % (i1, i2, sum(len(line) for line in new[j1:j2])))
            out.extend(new[j1:j2])
    return b"".join(out)


def apply_script(script: bytes, base: bytes) -> bytes:
    """The inverse of edit_script: the source it was made from, rebuilt from the base."""
    old, out, at, pos = base.splitlines(keepends=True), [], 0, 0
    while pos < len(script):
        end = script.index(b"\n", pos)
        i1, i2, size = map(int, script[pos + 1:end].split(b","))
        out += old[at:i1]
        out.append(script[end + 1:end + 1 + size])
        at, pos = i2, end + 1 + size
    return b"".join(out + old[at:])


def carried_bytes(source: bytes, base: bytes) -> int:
    """What train.py carries beyond its base, in bytes: its edit script against the base (every line of the base
    it keeps costs nothing, however long the base), compressed with zlib level 9 and the base's end as preset
    dictionary (an inserted line like one of the base's costs little). A real code: apply_script rebuilds the
    source from it and the base, so no source can carry more than 8 x this many bits beyond the base."""
    packer = zlib.compressobj(9, zdict=base[-WINDOW:]) if base else zlib.compressobj(9)
    return len(packer.compress(edit_script(source, base)) + packer.flush())


def secrets_dir(cache: Path | None = None) -> Path:
    """Beside the data cache (<cache>-secrets): no sandbox mounts it, and an agent's hides it (confine.wrap_agent
    creates it first: a directory made after an agent's sandbox started would be visible in it)."""
    import runtime  # not prepare: prepare's entry point imports the harness (autoresearch.data)
    cache = (cache or runtime.cache_dir()).resolve()
    return cache.parent / f"{cache.name}-secrets"


def new_draw() -> str:
    """A new tag's draw: its id (recorded in the tag) and the secret (written here, readable by the user alone)."""
    draw_id = uuid.uuid4().hex
    where = secrets_dir()
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(where / draw_id, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(str(secrets.randbits(63)))
    return draw_id


def draw(config) -> int | None:
    """The tag's (a tagconfig.Tag, which imports this module for its default limit) secret draw (None: a tag from before draws, scored on the splits' first rows). A parallel
    loop's driver hands it to its workers in their copy of the tag (config.draw); nothing writes it into
    the repository."""
    if config.draw is not None:
        return config.draw
    if config.draw_id is None:
        return None
    path = secrets_dir() / config.draw_id
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        raise HarnessError(f"This tag's secret draw ({path}) is missing or damaged: its runs cannot be scored on "
                           "the rows of its earlier runs. Restore the file, or set up a new tag "
                           "(`autoresearch setup --tag NEW`).") from None


def headroom(raw: bytes, config, base: bytes) -> dict:
    """What train.py carries beyond its base against the tag's limit: for `status` (and its --json)."""
    carried = carried_bytes(raw, base)
    return {"carried_bytes": carried, "limit_bytes": config.max_carried_bytes,
            "left_bytes": config.max_carried_bytes - carried}


def problem(raw: bytes, config, base: bytes) -> str | None:
    """Why train.py's bytes may not run under this tag, or None: over its size limit, or carrying more than its
    limit beyond its base. Checked before a run and again on the bytes the training is given (execute.py)."""
    if len(raw) > config.max_train_bytes:
        return (f"train.py has {len(raw):,} bytes, more than this tag's limit of {config.max_train_bytes:,} "
                "(set at setup): a file that size carries data, not code. Remove what it embeds")
    carried = carried_bytes(raw, base)
    if carried > config.max_carried_bytes:
        return (f"train.py carries {carried:,} bytes beyond the tag's base (its edit script against the "
                f"base, compressed), more than this tag's limit of {config.max_carried_bytes:,}: that is data, not "
                "a change of code (this project's whole history of train.py is 2 KB). Remove what it embeds")
    return None
