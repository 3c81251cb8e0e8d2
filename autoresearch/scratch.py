"""What a training may write, bounded by the kernel and emptied after it: `out/` and the compile cache's private
copy, each on a tmpfs of its own with a size.

Why: `out/` was an ordinary directory on the disk, never emptied; a discarded run left 4.1 GB there, and with
the disk's free space one run ends every later one (ENOSPC, issue 50). A threshold the harness checks while the
training writes is a race; a filesystem with a size is not.

How (the mechanism, and what holds where the kernel offers less):
- root on Linux: a tmpfs mounted on each (`size=` the tag's out_limit_bytes for out/; the base's bytes plus
  COMPILE_ROOM for the copy), nosuid and nodev. Its pages are charged to the memory cgroup of whoever writes them
  (the training's: cgroups.py). After the training, settle() copies the contract files out (regular files of
  bounded size, opened without following a link) into a plain directory that takes out/'s place; the tmpfs is
  unmounted, and everything else the training left goes with it;
- elsewhere (no right to mount): the same directories on the disk, every file a training writes capped at the
  same size by RLIMIT_FSIZE (limit_files()), and out/ emptied of everything but the contract files after the
  run. What a training writes in many files inside its budget is not bounded there: docs/integrity.md.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import resource
import stat
from pathlib import Path

from autoresearch.evaluator import safe_read

OUT_LIMIT = 4 << 30      # bytes out/ may hold: the default model's export is ~40 MB; a 1B-parameter model's in
                         # bf16 is 2 GB. The tag records its own (Tag.out_limit_bytes)
COMPILE_ROOM = 1 << 30   # bytes a run may add to its private copy of the compile cache (graphs it compiles anew)
MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2
LIMIT_ENV = "AUTORESEARCH_OUT_LIMIT"  # at setup: bytes (or 512M, 8G) a tag's out/ may hold, instead of OUT_LIMIT


def out_limit() -> int:
    """What a tag set up now records as out/'s size (its runs' exports must fit)."""
    from autoresearch import cgroups
    return cgroups.size_from_env(LIMIT_ENV, "give the bytes out/ may hold (e.g. 8G, 512M)") or OUT_LIMIT

def _libc():
    return ctypes.CDLL(None, use_errno=True)


def can_mount() -> bool:
    return os.geteuid() == 0 and os.uname().sysname == "Linux"


SOURCE = "autoresearch-"  # a tmpfs's source (the first column of /proc/mounts): this prefix and its maker's pid


def mount(path: Path, size: int) -> None:
    """A tmpfs of `size` bytes on the empty directory `path` (root only), named by this process (sweep() unmounts
    those of a process that is gone: a parallel worker killed mid-run). OSError if the kernel refuses."""
    sweep()
    opts = f"size={max(size, 1 << 20)},mode=0755".encode()
    source = f"{SOURCE}{os.getpid()}".encode()
    if _libc().mount(source, str(path).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount tmpfs on {path}: {os.strerror(err)}")


def sweep() -> list[str]:
    """Unmount the tmpfs of runs whose harness died before settling them (it was killed: a parallel loop's worker
    ended mid-run, a SIGKILL): each named by its maker's pid, gone now. What was unmounted."""
    import psutil
    done = []
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return done
    for line in lines:
        fields = line.split()
        if len(fields) > 2 and fields[2] == "tmpfs" and fields[0].startswith(SOURCE):
            pid = fields[0][len(SOURCE):]
            point = fields[1].encode().decode("unicode_escape")  # /proc/mounts escapes spaces as \040
            if pid.isdigit() and not psutil.pid_exists(int(pid)) and \
                    _libc().umount2(point.encode(), MNT_DETACH) == 0:
                done.append(point)
    return done


def unmount(path: Path) -> None:
    """Detach a tmpfs (lazily: a sandbox that still holds it keeps its view until it ends) and remove its mount
    point. Nothing if `path` is not a mount point."""
    if os.path.ismount(path) and _libc().umount2(str(path).encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {path}: {os.strerror(err)}")


def bounded_dir(path: Path, size: int) -> bool:
    """`path` made new and, where this process may mount, a tmpfs of `size` bytes. Whether it is bounded."""
    path.mkdir()
    if not can_mount():
        return False
    mount(path, size)
    return True


def limit_files(size: int):
    """A preexec_fn for the training: no file it writes grows past `size` bytes (RLIMIT_FSIZE; SIGXFSZ ends it)."""
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return apply


def kept_dir(out: Path) -> Path:
    """Where out/'s accepted files go, made by the harness before the training starts (prepare_kept): the
    evaluator, started early under bubblewrap, has it bound at out/'s path, so it never sees the tmpfs itself."""
    return out.parent / (out.name + ".kept")


def prepare_kept(out: Path) -> Path:
    kept = kept_dir(out)
    release(kept)
    kept.mkdir()
    return kept


def settle(out: Path, keep: tuple[str, ...], limits: dict[str, int], total: int = OUT_LIMIT) -> list[str]:
    """After the training: out/ holds the files named in `keep` that are regular files within their limits and
    `total` bytes together (copied into kept_dir(out), never through a link), and nothing else; the tmpfs (if any)
    unmounted. What was dropped: each name as ascii() writes it (a name is the training's text)."""
    kept = kept_dir(out)
    if os.geteuid() != 0 and stat.S_ISDIR(os.lstat(out).st_mode):  # the training may have taken its permissions
        os.chmod(out, 0o700)                                           # off out/ itself (a harness not root)
    if not os.path.lexists(kept) or not stat.S_ISDIR(os.lstat(kept).st_mode):
        release(kept)
        kept.mkdir()
    dropped, left = [], total
    for name in sorted(os.listdir(out)):
        if name in keep:
            try:
                safe_read.copy_regular(out / name, kept / name, min(limits.get(name, total), left))
                left -= os.lstat(kept / name).st_size
            except (OSError, safe_read.Unsafe) as e:
                dropped.append(f"{ascii(name)} ({ascii(str(e))})")
        else:
            dropped.append(ascii(name))
    if os.path.ismount(out):
        unmount(out)
        out.rmdir()
    else:
        try:
            empty(out)
            out.rmdir()
        except OSError as e:  # what the training left resists removal: set aside in the run's directory, never read
            aside = out.with_name(f"{out.name}.left-{os.getpid()}-{len(os.listdir(out.parent))}")
            out.rename(aside)
            dropped.append(f"(out/ could not be emptied, set aside as {aside.name}: {ascii(str(e))})")
    kept.rename(out)
    return dropped


def empty(path: Path) -> None:
    """Remove everything in `path` without following a link out of it (remove_tree)."""
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            remove_tree(entry.path)
        else:
            os.unlink(entry.path)


def remove_tree(top: str | Path) -> bool:
    """Remove a directory tree a training (ended, its processes gone) may have left, without recursion (it may be
    thousands of directories deep: Python's recursive walks raised RecursionError) and without following a link
    out of it; a directory left without permissions (mode 000: a user who is not root cannot list it) gets its
    owner's first. Never raises; whether it is gone."""
    stack, stuck = [str(top)], set()
    while stack:
        d = stack[-1]
        try:
            if not stat.S_ISDIR(os.lstat(d).st_mode):
                os.unlink(d)
                stack.pop()
                continue
            if os.geteuid() != 0:
                os.chmod(d, 0o700)  # an lstat'ed directory of a training whose processes are gone
            entries = list(os.scandir(d))
        except OSError:
            stack.pop()
            continue
        subdirs = []
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    subdirs.append(e.path)
                else:
                    os.unlink(e.path)
            except OSError:
                pass
        subdirs = [_shallow(s, str(top)) for s in subdirs if s not in stuck]
        if subdirs:
            stuck.update(subdirs)  # each is tried once: what it leaves does not bring it back onto the stack
            stack.extend(subdirs)
            continue
        try:
            os.rmdir(d)
        except OSError:
            pass
        stack.pop()
    return not os.path.lexists(top)


_MOVED = itertools.count()


def _shallow(path: str, top: str) -> str:
    """A directory deep enough that its children's paths near PATH_MAX, moved up to `top` (renamed: no copy), so
    that every path remove_tree uses stays short however deep the tree."""
    if len(path) < 2048:
        return path
    moved = os.path.join(top, f".deep-{os.getpid()}-{next(_MOVED)}")
    try:
        os.rename(path, moved)
        return moved
    except OSError:
        return path


class Unaccepted(Exception):
    """A tree holds something the harness does not accept from code it ran: the message says what and where."""


def accepted_size(top: Path, limit: int) -> int:
    """Its bytes; raise Unaccepted unless the tree `top` (what code the harness ran wrote) holds directories and
    regular files only, at most `limit` bytes in all: no symbolic link, no device, FIFO or socket. Modes beyond
    0755 (setuid, setgid, sticky, writable by others) are cleared: a compile phase made /bin/sh setuid root in its
    base. A tree it cannot read whole (a directory it may not list, paths too long to name) is not accepted
    either. Call it once the code that wrote it has ended."""
    total = 0
    # os.walk lists links to directories in dirs and never follows them; a directory it cannot list (mode 000, as
    # a user other than root) would hide what is in it from the count and the copy: an error, not a skip
    try:
        for here, dirs, files in os.walk(top, onerror=_raise):
            for name in dirs + files:
                path = os.path.join(here, name)
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
                elif not stat.S_ISDIR(st.st_mode):
                    raise Unaccepted(f"{os.path.relpath(path, top)} is not a regular file or a directory "
                                     f"({stat.filemode(st.st_mode)})")
                if stat.S_IMODE(st.st_mode) & ~0o755:
                    os.chmod(path, stat.S_IMODE(st.st_mode) & 0o755)
    except RecursionError:  # a tree thousands of directories deep (Python's walk recurses before 3.12)
        raise Unaccepted("it is nested too deep") from None
    except OSError as e:  # a directory it cannot list, a path too long to name: not accepted, never a crash
        raise Unaccepted(f"it cannot be read whole ({_why(e, top)})") from None
    if total > limit:
        raise Unaccepted(f"it holds {total:,} bytes, more than the {limit:,} it may")
    return total


def _raise(error: OSError) -> None:
    raise error


def _why(error: OSError, top: Path) -> str:
    where = os.path.relpath(error.filename, top)[:200] if isinstance(error.filename, str) else ""
    return f"{error.strerror or error}{': ' + where if where else ''}"


def copy_accepted(top: Path, dest: Path, limit: int) -> None:
    """A copy of the accepted tree `top` (accepted_size, checked by the caller) at `dest` (new, or an empty
    mount point): directories made here, regular files opened without following a link (O_NOFOLLOW) and checked
    by the open descriptor, so a link or a FIFO swapped in after the check is refused too. Unaccepted (dest
    removed) for anything else."""
    try:
        dest.mkdir(exist_ok=True)
        if not stat.S_ISDIR(os.lstat(dest).st_mode):
            raise Unaccepted(f"{dest} is not a directory")
        for here, dirs, files in os.walk(top, onerror=_raise):
            rel = Path(here).relative_to(top)
            for name in dirs:
                (dest / rel / name).mkdir()
            for name in files:
                try:
                    safe_read.copy_regular(Path(here) / name, dest / rel / name, limit)
                except safe_read.Unsafe as e:
                    raise Unaccepted(str(e)) from None
    except OSError as e:  # changed or unreadable since the check: not accepted, never a crash
        release(dest)
        raise Unaccepted(f"it cannot be copied whole ({_why(e, top)})") from None
    except BaseException:
        release(dest)
        raise


def release(path: Path) -> None:
    """A run's bounded directory gone: unmounted if it is a mount point, removed."""
    if os.path.ismount(path):
        unmount(path)
    remove_tree(path)
