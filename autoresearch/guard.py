"""Everything a training run must leave as it was, checked after every run, restored when it was not.

A snapshot covers every file of the repository (tracked, untracked and ignored: results.tsv, the tag files,
.git's config, hooks and refs, any __pycache__) except git's object store, the run's own directory and the
harness's pending file. Files up to SMALL bytes are kept whole, so a change can be put back; larger ones (old
checkpoints) by size, mtime and inode. A new file is removed, a changed or removed small file is rewritten.
"""

from __future__ import annotations

import os
from pathlib import Path

SMALL = 1 << 20
SKIP_DIRS = {(".git", "objects")}


def snapshot(repo: Path, exclude: list[Path]) -> dict[str, tuple]:
    excluded = {p.resolve() for p in exclude}
    state = {}
    for top, dirs, files in os.walk(repo):
        top_path = Path(top)
        rel_top = top_path.relative_to(repo)
        dirs[:] = [d for d in dirs if (top_path / d).resolve() not in excluded
                   and (rel_top.parts + (d,))[-2:] not in SKIP_DIRS]
        for name in files + [d for d in dirs if (top_path / d).is_symlink()]:
            path = top_path / name
            if path.resolve() in excluded and not path.is_symlink():
                continue
            rel = str(path.relative_to(repo))
            st = path.lstat()
            if path.is_symlink():
                state[rel] = ("link", os.readlink(path))
            elif st.st_size <= SMALL:
                state[rel] = ("bytes", path.read_bytes(), st.st_mode)
            else:
                state[rel] = ("stat", st.st_size, st.st_mtime_ns, st.st_ino)
    return state


def changes(before: dict, after: dict) -> list[str]:
    """Paths added, removed or changed (content, mode, link target, or a large file's size/mtime/inode)."""
    out = []
    for rel in sorted(set(before) | set(after)):
        if rel not in before:
            out.append(f"{rel} (added)")
        elif rel not in after:
            out.append(f"{rel} (removed)")
        elif before[rel] != after[rel]:
            out.append(f"{rel} (changed)")
    return out


def restore(repo: Path, before: dict, after: dict) -> list[str]:
    """Put back what changed; returns the paths that could not be restored (large files)."""
    lost = []
    for rel in sorted(set(before) | set(after)):
        path = repo / rel
        old, new = before.get(rel), after.get(rel)
        if old == new:
            continue
        if old is None:
            if path.is_symlink() or path.is_file():
                path.unlink()
            continue
        if old[0] == "stat":
            lost.append(rel)
            continue
        if path.is_symlink() or path.is_file():
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        if old[0] == "link":
            path.symlink_to(old[1])
        else:
            path.write_bytes(old[1])
            os.chmod(path, old[2] & 0o7777)
    return lost
