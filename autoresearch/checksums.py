"""The prepared data's checksums: a file's sha256, and which of the manifest's files are missing or changed.
Written by data.py when it prepares, checked by fixed.py before and after every run."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(manifest: dict, root: Path, full: bool = True) -> list[str]:
    """Problems with the prepared files: missing, wrong size, or (full) wrong sha256."""
    problems = []
    for rel, info in manifest["files"].items():
        f = root / rel
        if not f.is_file():
            problems.append(f"{rel} is missing")
        elif f.stat().st_size != info["bytes"]:
            problems.append(f"{rel} has {f.stat().st_size} bytes, expected {info['bytes']}")
        elif full and sha256_file(f) != info["sha256"]:
            problems.append(f"{rel} does not match its checksum")
    return problems
