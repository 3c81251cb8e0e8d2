"""Where a command's program lives, for an agent's empty root (confine.wrap_agent), which shows the system's
directories and nothing of home: the directory an agent is installed in outside them (Claude Code under
~/.local, a pipx venv, node under nvm) and the interpreter its first line names, read-only.

An install's directory: a script's nearest package (package.json) or venv (pyvenv.cfg), a program's prefix (the
directory above its bin/), else the file's directory. Never home itself or a directory right in it (~/.local
holds keyrings and every program's data) but a conda or a version manager's root: there, the next narrower."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from autoresearch.sandbox import in_system

MARKERS = ("package.json", "pyvenv.cfg")
DEPTH = 3  # a script's interpreter's interpreter, at most


def needed(command: str) -> tuple[list[Path], list[tuple[Path, Path]]]:
    """What running `command` (a name on PATH, or a path) needs outside the system's directories: the
    directories to show read-only, and the paths it is named by, each with the file it leads to (a link on PATH,
    ~/.local/bin/claude, made again inside)."""
    dirs: list[Path] = []
    entries: list[tuple[Path, Path]] = []
    _add(command, dirs, entries, DEPTH)
    return dirs, entries


def _add(command: str, dirs: list, entries: list, depth: int) -> None:
    found = shutil.which(command)
    if depth == 0 or found is None:
        return
    named = Path(os.path.abspath(found))
    real = named.resolve()
    if not in_system(real):
        dirs.append(install_dir(real))
    if not in_system(named):
        entries.append((named, real))
    interpreter = shebang(real)
    if interpreter:
        _add(interpreter, dirs, entries, depth - 1)


def install_dir(real: Path) -> Path:
    """The directory `real` (a resolved file) is installed in, or the file alone: the first that may be shown of
    its script's package or venv, its prefix (above bin/ or a version manager's shims/), its directory."""
    home = Path.home().resolve()
    candidates = []
    if shebang(real) is not None:  # a script: its package or venv
        candidates += [p for p in real.parents
                       if not home.is_relative_to(p) and any((p / m).is_file() for m in MARKERS)][:1]
    if real.parent.name in ("bin", "shims"):  # python's lib/, node's lib/node_modules, pyenv's versions
        candidates.append(real.parent.parent)
    return next((d for d in candidates + [real.parent] if may_show(d, home)), real)


def may_show(directory: Path, home: Path) -> bool:
    """Not home nor a directory right in it (~/.local holds keyrings, ~/.cargo a registry token), but a
    conda's or a version manager's root (pyenv's, rbenv's: libexec/ and versions/)."""
    if directory == home or home.is_relative_to(directory):
        return False
    if directory.parent != home:
        return True
    return (directory / "conda-meta").is_dir() or all((directory / d).is_dir() for d in ("libexec", "versions"))


def shebang(path: Path) -> str | None:
    """The program a script's first line runs (`#!/usr/bin/env node`: node), or None (a binary, unreadable)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    return words[0] if words else None
