"""What train.py carries beyond its base (heldout.carried_bytes, issue 50), measured on this project's own history
and on large honest files, beside the measure it replaced (zlib with the base's last 32 KB as dictionary, which
charged a large file's unchanged text as new).

    python benchmarks/carried.py            # a table; no torch, a second or two
"""

from __future__ import annotations

import random
import subprocess
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoresearch import heldout  # noqa: E402


def zlib_dictionary(source: bytes, base: bytes) -> int:
    """The measure before issue 50: train.py compressed with the base's last 32 KB as zlib's dictionary."""
    packer = zlib.compressobj(9, zdict=base[-32768:]) if base else zlib.compressobj(9)
    return len(packer.compress(source) + packer.flush())


def history() -> list[tuple[str, bytes]]:
    """(commit, train.py) for every commit that changed the committed train.py, oldest first."""
    commits = subprocess.run(["git", "-C", str(ROOT), "log", "--reverse", "--format=%h", "--", "train.py"],
                             capture_output=True, text=True, check=True).stdout.split()
    return [(c, subprocess.run(["git", "-C", str(ROOT), "show", f"{c}:train.py"], capture_output=True,
                               check=True).stdout) for c in commits]


def honest_large(size: int, seed: int = 0) -> bytes:
    """A train.py of `size` bytes without long repeats: distinct functions with distinct names and constants (a
    large honest file compresses little against itself)."""
    rng, lines, n = random.Random(seed), [], 0
    while sum(map(len, lines)) < size:
        n += 1
        name = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8))
        lines.append(f"def {name}_{n}(x, y={rng.random():.6f}):\n    return x * {rng.randint(2, 999)} + y ** "
                     f"{rng.randint(2, 9)} - {rng.random():.5f}\n\n")
    return "".join(lines).encode()


def main() -> None:
    rows = []
    revs = history()
    first = revs[0][1]
    for (commit, text), (_, prev) in zip(revs[1:], revs):
        rows.append((f"train.py@{commit} against its previous revision", len(text),
                     zlib_dictionary(text, prev), heldout.carried_bytes(text, prev)))
    last = revs[-1]
    rows.append((f"train.py@{last[0]} against the first ({revs[0][0]})", len(last[1]),
                 zlib_dictionary(last[1], first), heldout.carried_bytes(last[1], first)))
    for size in (20_000, 40_000, 80_000):
        big = honest_large(size)
        rows.append((f"an honest {size // 1000} KB train.py, unchanged", len(big), zlib_dictionary(big, big),
                     heldout.carried_bytes(big, big)))
        lines = big.splitlines(keepends=True)
        edited = b"".join(lines[:100] + [b"LR = 0.02  # a changed line\n" * 1] + lines[101:]
                          + [b"def added(x):\n    return x + 1\n"] * 1)
        rows.append(("the same, two lines changed", len(edited), zlib_dictionary(edited, big),
                     heldout.carried_bytes(edited, big)))
    print(f"limit: {heldout.LIMIT_BYTES:,} bytes\n")
    print(f"| {'train.py against its base':<62} | bytes | zlib, base as dictionary | edit script (now) |")
    print(f"|{'-' * 64}|------:|-------------------------:|------------------:|")
    for what, size, before, now in rows:
        print(f"| {what:<62} | {size:,} | {before:,} | {now:,} |")


if __name__ == "__main__":
    main()
