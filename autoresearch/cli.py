"""The `autoresearch` command: a thin layer over the harness modules."""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="autoresearch", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="prepare data and tokenizer (same as `python prepare.py`)", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "prepare":
        import prepare
        return prepare.main(rest)
    return 2


if __name__ == "__main__":
    sys.exit(main())
