"""The few git operations the harness needs, as plain subprocess calls."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path


class GitError(RuntimeError):
    pass


def git(repo: Path, *args: str, check: bool = True, strip: bool = True) -> str:
    # errors="replace": a train.py in the history that is not UTF-8 (refused by `run` today, perhaps kept by an
    # older version) is read with replacement characters, never a UnicodeDecodeError that stops every command
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, errors="replace")
    if check and proc.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip() if strip else proc.stdout


def blob_of(text: str) -> str:
    """A file's git blob hash before it is committed, 12 hex digits: for train.py, its configuration's name
    (ledger.Row.config, tags.config_of)."""
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()[:12]


def parent_blobs(repo: Path, commits, path: str) -> dict[str, str]:
    """The blob (12 hex digits) of `path` in the commit each of `commits` was made from, in one git call: its first
    parent; for a commit with a second parent (commit_with's `merged`: a candidate re-committed on a branch that
    moved), that candidate's parent. A commit without a parent, or without `path` there, is left out."""
    commits = list(dict.fromkeys(c for c in commits if c))
    if not commits:
        return {}
    # per commit: its own path, its second parent's (equal only for commit_with's `merged`, not for a merge of
    # two histories), the second parent's parent's, the first parent's
    asked = "".join(f"{c}:{path}\n{c}^2:{path}\n{c}^2^:{path}\n{c}^:{path}\n" for c in commits)
    proc = subprocess.run(["git", "cat-file", "--batch-check=%(objectname) %(objecttype)"], cwd=repo, text=True,
                          capture_output=True, input=asked)
    lines = [line.partition(" ") for line in proc.stdout.splitlines()]
    blobs = [name[:12] if kind == "blob" else "" for name, _, kind in lines]
    found = {}
    for i, commit in enumerate(commits):
        own, second, made_in, first = blobs[4 * i:4 * i + 4]
        parent = made_in if own and own == second and made_in else first
        if parent:
            found[commit] = parent
    return found


def toplevel(path: Path) -> Path:
    proc = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=path, capture_output=True, text=True)
    if proc.returncode != 0:
        raise GitError(f"{path} is not inside a git repository. Run autoresearch from a clone of the project "
                       "(`git clone ...`), or `git init && git add -A && git commit -m init` first.")
    return Path(proc.stdout.strip())


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD")


def branch(repo: Path) -> str:
    return git(repo, "rev-parse", "--abbrev-ref", "HEAD")


def branch_exists(repo: Path, name: str) -> bool:
    return bool(git(repo, "branch", "--list", name))


def changed_files(repo: Path) -> list[str]:
    """Paths that differ from HEAD: modified, staged, deleted or untracked (ignored files excluded)."""
    out = git(repo, "status", "--porcelain", "--untracked-files=all", strip=False)
    paths = []
    for line in out.splitlines():
        if len(line) < 4:
            continue
        path = line[3:]
        if " -> " in path:
            path = path.split(" -> ", 1)[1]
        paths.append(path.strip('"'))
    return paths


def commit_file(repo: Path, path: str, message: str) -> str:
    git(repo, "add", "--", path)
    git(repo, "-c", "user.name=autoresearch", "-c", "user.email=autoresearch@localhost",
        "commit", "--no-verify", "-q", "-m", message, "--", path)
    return head(repo)


def reset_to(repo: Path, commit: str, path: str) -> None:
    """Move the branch to commit and put `path` back as it is there; nothing else in the work tree is touched
    (the harness's commits change `path` alone, so the index then matches commit). The file is written in place,
    the same inode: a confined agent's sandbox binds it (confine.py), and `git checkout` replaced it, after which
    the agent's every write failed with "Read-only file system" (the kernel dissolves a bind whose file is
    unlinked). A link there is replaced, never written through."""
    git(repo, "reset", "--soft", "-q", commit)
    data = subprocess.run(["git", "cat-file", "--filters", f"{commit}:{path}"], cwd=repo, capture_output=True,
                          check=True).stdout  # as checkout writes it: line endings and filters applied
    target = repo / path
    try:
        fd = os.open(target, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    except OSError:  # gone, or a link
        target.unlink(missing_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    git(repo, "reset", "-q", commit, "--", path)  # its index entry as at commit


def restore(repo: Path, paths: list[str]) -> None:
    """Put tracked paths back as in HEAD and delete untracked ones."""
    tracked = set(git(repo, "ls-files").splitlines())
    for p in paths:
        if p in tracked:
            git(repo, "checkout", "HEAD", "--", p)
        else:
            f = repo / p
            if f.is_file() or f.is_symlink():
                f.unlink()


def blob_id(repo: Path, path: str, content: bytes) -> str:
    """The id git gives `content` as `path` (its filters applied, as `git add` would), stored nowhere."""
    return subprocess.run(["git", "hash-object", "--stdin", "--path", path], cwd=repo, input=content,
                          capture_output=True, check=True).stdout.decode().strip()


def commit_with(repo: Path, parent: str, path: str, content: str, message: str, merged: str = "") -> str:
    """A commit object: `parent` with `path` replaced by `content`, made without touching the work tree, the
    index or any branch (the driver of parallel workers records candidates this way; a keep moves the branch).
    `merged`: a second parent, the commit this content was made in (a candidate kept after another keep)."""
    blob = subprocess.run(["git", "hash-object", "-w", "--stdin", "--path", path], cwd=repo, input=content,
                          capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, GIT_INDEX_FILE=os.path.join(tmp, "index"))
        for args in (["read-tree", parent], ["update-index", "--add", "--cacheinfo", f"100644,{blob},{path}"]):
            proc = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True)
            if proc.returncode:
                raise GitError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
        tree = subprocess.run(["git", "write-tree"], cwd=repo, env=env, capture_output=True, text=True,
                              check=True).stdout.strip()
    return git(repo, "-c", "user.name=autoresearch", "-c", "user.email=autoresearch@localhost",
               "commit-tree", tree, "-p", parent, *(["-p", merged] if merged else []), "-m", message)
