"""What a train.py can know of the held-out rows, bounded by arithmetic (docs/integrity.md, the memoriser).

Two parts, each set at setup and recorded in the tag:
- **What train.py carries.** Anything a model knows of the held-out text that it did not learn from the training
  split came in through train.py's text. carried_bytes() is train.py's size compressed with the tag's base
  train.py as zlib's preset dictionary: a real code for train.py given the base, so no train.py can carry more
  than 8 x that many bits the base did not hold, whatever its encoding. A run over the tag's limit
  (LIMIT_BYTES) is refused. The whole history of this project's train.py, 12 revisions, costs 2,019 bytes
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

LIMIT_BYTES = 3072   # what train.py may carry beyond its tag's base, compressed (zlib, the base as dictionary)
WINDOW = 32768       # zlib's dictionary: the base's last 32 KB


def carried_bytes(source: bytes, base: bytes) -> int:
    """train.py's size in bytes, compressed (zlib level 9) with `base` as the preset dictionary."""
    packer = zlib.compressobj(9, zdict=base[-WINDOW:]) if base else zlib.compressobj(9)
    return len(packer.compress(source) + packer.flush())


def secrets_dir(cache: Path | None = None) -> Path:
    """Beside the data cache (<cache>-secrets): no sandbox mounts it, and an agent's hides it (confine.wrap_agent
    creates it first: a directory made after an agent's sandbox started would be visible in it)."""
    import prepare
    cache = (cache or prepare.cache_dir()).resolve()
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


def problem(raw: bytes, config, base: bytes) -> str | None:
    """Why train.py's bytes may not run under this tag, or None: over its size limit, or carrying more than its
    limit beyond its base. Checked before a run and again on the bytes the training is given (execute.py)."""
    if len(raw) > config.max_train_bytes:
        return (f"train.py has {len(raw):,} bytes, more than this tag's limit of {config.max_train_bytes:,} "
                "(set at setup): a file that size carries data, not code. Remove what it embeds")
    carried = carried_bytes(raw, base)
    if carried > config.max_carried_bytes:
        return (f"train.py carries {carried:,} bytes beyond the tag's base (compressed with the base as "
                f"dictionary), more than this tag's limit of {config.max_carried_bytes:,}: that is data, not "
                "a change of code (this project's whole history of train.py is 2 KB). Remove what it embeds")
    return None
