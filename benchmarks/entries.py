"""How often one `autoresearch run` enters each harness module from another: the house's measure of how far a run's
path wanders (issue 52: "following the repository path from the run entry point, no module entered more than ~4
times"). Counted, not read: the harness process of a real `autoresearch run` on a fresh clone (a short budget),
under sys.setprofile; an entry is a call into a module of autoresearch/ from a different one (the training and the
evaluator are other processes, not counted).

    python benchmarks/entries.py --budget 10          # prints the modules by entries, and the calls into each

Run it alone: it trains once.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TRACER = r'''
import collections, json, sys
entries, calls = collections.Counter(), collections.defaultdict(collections.Counter)
def module_of(frame):
    name = frame.f_globals.get("__name__", "")
    return name if name.startswith("autoresearch") else None
def profile(frame, event, arg):
    if event != "call":
        return
    callee = module_of(frame)
    if callee is None or frame.f_back is None:
        return
    caller = module_of(frame.f_back)
    if caller is not None and caller != callee:
        entries[callee] += 1
        calls[callee][frame.f_code.co_name] += 1
sys.setprofile(profile)
from autoresearch import cli
try:
    cli.main(sys.argv[2:])
except SystemExit:
    pass
finally:
    sys.setprofile(None)
    json.dump({"entries": entries, "calls": {k: dict(v) for k, v in calls.items()}}, open(sys.argv[1], "w"))
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=10)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    import json
    env = dict(os.environ, AUTORESEARCH_TIME_BUDGET=f"{args.budget:g}")
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
        subprocess.run([sys.executable, "-m", "autoresearch.cli", "setup", "--tag", "entries"], cwd=repo, env=env,
                       check=True, capture_output=True)
        out = Path(tmp) / "entries.json"
        proc = subprocess.run([sys.executable, "-c", TRACER, str(out), "run", "-m", "baseline"], cwd=repo, env=env,
                              capture_output=True, text=True)
        print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:])
        data = json.loads(out.read_text())
    entries = collections.Counter(data["entries"])
    print(f"\n{len(entries)} harness modules entered from another; by entries (and the functions entered most):")
    for module, n in entries.most_common(args.top):
        top = ", ".join(f"{f} {c}" for f, c in collections.Counter(data["calls"][module]).most_common(4))
        print(f"  {n:6d}  {module:32s} {top}")


if __name__ == "__main__":
    main()
