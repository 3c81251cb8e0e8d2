"""What a training run must leave as it was, checked after every run, restored when it was not.

The guard protects what a training could use to change the record or the next run, not what the harness and
the user legitimately write meanwhile:
- every file git sees (tracked and untracked), .git's config, hooks, refs and HEAD, and the index by what it
  stages (a `git status` in a second terminal refreshes its bytes, not its meaning);
- among ignored paths, only the record (results.tsv, the tag files) and Python's bytecode caches (__pycache__:
  the harness imports prepare.py from the repository).
Other ignored paths (a .venv, build/, progress.png, run.log, the stop file, other runs' directories) are not read:
under bubblewrap the training cannot reach them at all (sandbox.py mounts nothing of the repository but train.py
and prepare.py, read-only); without it they are outside what this guard checks, as a venv elsewhere on the disk
would be (docs/integrity.md). Which paths are ignored is read before the run; a file that appears during it (a
report's progress.png) is left alone only when a rule that was there before, unchanged, ignores it, so a run
cannot hide what it writes behind a rule of its own.

Regular files up to SMALL bytes are kept whole, so a change can be put back; larger ones by size, mtime and inode;
anything else (a FIFO, a socket) by its type, never opened. A new file is removed, a changed or removed small file
is rewritten.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

from autoresearch import state

SMALL = 1 << 20
RECORD_LIMIT = 256 << 20  # the record is kept whole up to this size (a 1 MB results.tsv is ~3,500 rows)
SKIP_DIRS = {(".git", "objects")}
# Ignored by git, and what the harness trusts later: always compared. The record (the ledger, the tag files, a
# parallel loop's in-flight jobs), and Python's package metadata at the repository's root (`python -m` puts it
# first on sys.path, and `import torch` loads entry points from any *.egg-info or *.dist-info found there).
RECORD = (state.RESULTS, f"{state.STATE_DIR}/tags", f"{state.STATE_DIR}/inflight")
METADATA = (".egg-info", ".dist-info")
BYTECODE = "__pycache__"
INDEX = ".git/index"
# A new file is excused as ignored (a report's progress.png) only if Python would never load it.
LOADABLE = (".py", ".pyc", ".pyo", ".so", ".pyd", ".pth")
# The guard's git commands must not run what the run could have configured: core.fsmonitor runs a command on
# every read of the index; system and global config live outside the repository.
GIT = ["git", "-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false"]
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_OPTIONAL_LOCKS": "0"}
GIT_TIMEOUT = 60  # seconds: a FIFO planted as .git/config would block git forever


def _git(repo: Path, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run([*GIT, *args], cwd=repo, input=input, capture_output=True, timeout=GIT_TIMEOUT,
                              env={**os.environ, **GIT_ENV})
    except subprocess.TimeoutExpired:
        return None


def ignored(repo: Path) -> tuple[set[str], set[str]]:
    """Paths git ignores in repo, as (directories, files), relative; an ignored directory is listed, not walked."""
    proc = _git(repo, "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory")
    if proc is None or proc.returncode != 0:  # not a git work tree (or a hang): nothing is ignored
        return set(), set()
    names = [n for n in proc.stdout.decode(errors="surrogateescape").split("\0") if n]
    return {n.rstrip("/") for n in names if n.endswith("/")}, {n for n in names if not n.endswith("/")}


def _protected(rel: str) -> bool:
    parts = rel.split("/")
    return (any(rel == r or rel.startswith(r + "/") for r in RECORD) or BYTECODE in parts
            or parts[0].endswith(METADATA))


def _leads_to_record(rel: str) -> bool:
    return any(r.startswith(rel + "/") for r in RECORD)


class Guard:
    """A snapshot of repo taken now; changes() compares it with the repository as it is then, restore() puts
    back what changed. `exclude`: the run's own directory and the harness's pending file."""

    def __init__(self, repo: Path, exclude: list[Path]):
        self.repo = repo
        self.excluded = {p.resolve() for p in exclude}
        self.ignored_dirs, self.ignored_files = ignored(repo)
        self.before = self.snapshot()
        self.after = None

    def _skipped(self, rel: str, is_dir: bool) -> bool:
        if _protected(rel) or (is_dir and _leads_to_record(rel)):
            return False
        parts = rel.split("/")
        if any("/".join(parts[:i]) in self.ignored_dirs for i in range(1, len(parts) + 1)):
            return True
        return rel in self.ignored_files

    def snapshot(self) -> dict[str, tuple]:
        repo, state = self.repo, {}
        for top, dirs, files in os.walk(repo):
            top_path = Path(top)
            rel_top = top_path.relative_to(repo)
            keep = []
            for d in dirs:
                rel = str(rel_top / d) if rel_top.parts else d
                if (top_path / d).is_symlink():
                    files.append(d)  # a link to a directory is compared as a link
                elif ((top_path / d).resolve() not in self.excluded and (rel_top.parts + (d,))[-2:] not in SKIP_DIRS
                      and not self._skipped(rel, True)):
                    keep.append(d)
            dirs[:] = keep
            for name in files:
                path = top_path / name
                rel = str(path.relative_to(repo))
                if (path.resolve() in self.excluded and not path.is_symlink()) or self._skipped(rel, False):
                    continue
                state[rel] = _entry(path, rel)
        return state

    def changes(self) -> list[str]:
        """Paths added, removed or changed (content, mode, link target, a large file's size/mtime/inode, the
        index's staged entries) since the snapshot."""
        self.after = self.snapshot()
        new = sorted(rel for rel in set(self.after) - set(self.before)
                     if not _protected(rel) and not rel.endswith(LOADABLE) and not rel.startswith(".git/"))
        for rel in self._ignored_by_old_rules(new):
            del self.after[rel]
        out = []
        for rel in sorted(set(self.before) | set(self.after)):
            old, new = self.before.get(rel), self.after.get(rel)
            if old is None:
                out.append(f"{rel} (added)")
            elif new is None:
                out.append(f"{rel} (removed)")
            elif _meaning(old) != _meaning(new):
                out.append(f"{rel} (changed)")
        return out

    def _ignored_by_old_rules(self, paths: list[str]) -> list[str]:
        """Those of `paths` that git ignores by a rule from a file that was in the snapshot, unchanged."""
        if not paths:
            return []
        if any(_meaning(self.before.get(rel, ())) != _meaning(self.after.get(rel, ())) for rel in self.before
               if rel.startswith(".git/") and not rel.startswith(".git/refs/")):
            return []  # git's own configuration changed: no rule is trusted
        proc = _git(self.repo, "check-ignore", "-v", "-z", "--stdin",
                    input="\0".join(paths).encode(errors="surrogateescape"))
        if proc is None:
            return []
        fields = proc.stdout.decode(errors="surrogateescape").split("\0")
        out = []
        for i in range(0, len(fields) - 3, 4):  # source, line, pattern, path
            source, pattern, path = fields[i], fields[i + 2], fields[i + 3]
            rel = os.path.relpath(source, self.repo) if os.path.isabs(source) else source
            if pattern.startswith("!") or rel not in self.before:
                continue
            if _meaning(self.before[rel]) == _meaning(self.after.get(rel, ())):
                out.append(path)
        return out

    def restore(self) -> list[str]:
        """Put back what changed; the paths that could not be restored (large files, FIFOs, what failed). Never
        raises: a run that left a directory where a file was must not stop the harness from recording it."""
        lost = []
        after = self.after or {}
        changed = [rel for rel in set(self.before) | set(after)
                   if not (rel in self.before and rel in after and _meaning(self.before[rel]) == _meaning(after[rel]))]
        for rel in sorted(changed, key=lambda r: (-r.count("/"), r)):  # deepest first: a new dir's files go first
            path, old = self.repo / rel, self.before.get(rel)
            try:
                if old is not None and old[0] in ("stat", "special"):
                    lost.append(rel)
                    continue
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                elif path.is_symlink() or path.exists():
                    path.unlink()
                if old is None:
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                if old[0] == "link":
                    path.symlink_to(old[1])
                else:
                    path.write_bytes(old[1])
                    os.chmod(path, old[2] & 0o7777)
            except OSError:
                lost.append(rel)
        return lost


def _entry(path: Path, rel: str) -> tuple:
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        return ("link", os.readlink(path))
    if not stat.S_ISREG(st.st_mode):  # a FIFO would block a read forever
        return ("special", stat.S_IFMT(st.st_mode), st.st_ino)
    limit = RECORD_LIMIT if _protected(rel) else SMALL
    if st.st_size > limit:  # ctime too: a run can set mtime back, not ctime
        return ("stat", st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if rel == INDEX:
        return ("bytes", data, st.st_mode, _staged(path.parent.parent))
    return ("bytes", data, st.st_mode)


def _staged(repo: Path) -> str:
    """What the index stages (mode, blob, stage, path per entry): its meaning, without the stat data git
    refreshes whenever anyone runs `git status`."""
    proc = _git(repo, "ls-files", "--stage", "-v", "-z")  # -v: assume-unchanged and skip-worktree bits too
    return "unreadable" if proc is None else proc.stdout.hex()


def _meaning(entry: tuple) -> tuple:
    if entry[0] == "bytes" and len(entry) == 4:  # the index: compared by what it stages
        return ("index", entry[3], entry[2])
    return entry
