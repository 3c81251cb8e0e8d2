"""Reading what a run wrote, and the two ways an evaluation ends without a score (Refused, Broken).

Everything in a run's output directory was written by untrusted code. The harness opens such a file only as a
regular file, never through a link (O_NOFOLLOW), never a FIFO or a device (O_NONBLOCK, then fstat), and reads
at most a bound: a link to ~/.ssh, a FIFO that blocks forever or a sparse 1 TB file is a refusal, not a hang.
The evaluator reads the exported model with it, the harness a run's result.json and log (fixed.py, record.py,
commands.py).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

GRAPH_LIMIT = 64 << 20     # bytes of model.graph.json: the default model's is ~0.2 MB
TENSORS_LIMIT = 16 << 30   # bytes of model.safetensors
RESULT_LIMIT = 1 << 20     # bytes of result.json


class Refused(Exception):
    """The model breaks a rule (reads the future, mutates state, runs non-ATen code)."""


class Broken(Exception):
    """The run left no usable model (the export is missing, unreadable or does not run)."""


class Unsafe(Exception):
    """A file the run left is not a plain regular file of sane size; the message says what it is."""


def open_regular(path: Path, limit: int) -> tuple[int, os.stat_result]:
    """An open descriptor of `path` and its stat, if it is a regular file (not a link) of at most `limit` bytes,
    checked on the descriptor (a link or a FIFO swapped in after a check is refused too). FileNotFoundError if
    there is none; Unsafe for anything else. The caller closes it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as e:  # ELOOP: a symbolic link; others: unreadable
        kind = "a symbolic link" if os.path.islink(path) else f"unreadable ({e.strerror})"
        raise Unsafe(f"{path.name} is {kind}; a run writes its files itself, as regular files") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unsafe(f"{path.name} is not a regular file (mode {stat.filemode(st.st_mode)})")
        if st.st_size > limit:
            raise Unsafe(f"{path.name} has {st.st_size:,} bytes, more than the {limit:,} allowed")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of `path` if it is a regular file (not a link) of at most `limit` bytes. FileNotFoundError if
    there is none; Unsafe for anything else."""
    fd, _ = open_regular(path, limit)
    try:
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 24, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise Unsafe(f"{path.name} grew past {limit:,} bytes while it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def copy_regular(src: Path, dest: Path, limit: int) -> None:
    """Copy `src` to the new file `dest` if it is a regular file (not a link) of at most `limit` bytes
    (open_regular). FileNotFoundError if there is none; Unsafe for anything else."""
    fd, st = open_regular(src, limit)
    try:
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                      st.st_mode & 0o755)
        try:
            left = st.st_size
            while left > 0:
                sent = os.sendfile(out, fd, None, min(left, 1 << 30))
                if sent == 0:
                    break
                left -= sent
        finally:
            os.close(out)
        os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(fd)
