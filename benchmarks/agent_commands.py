"""What a harness command costs a confined agent: `autoresearch status`, `wait --timeout 1` and `ideas`, each
5 times, median wall seconds, inside `autoresearch agent` (through the broker) and outside, in one sitting.
Run in a repository with a tag set up (`autoresearch setup --tag T`):

    python benchmarks/agent_commands.py
"""

import statistics
import subprocess
import sys
import time

COMMANDS = (["autoresearch", "status"], ["autoresearch", "wait", "--timeout", "1"], ["autoresearch", "ideas"])


def measure(label: str) -> None:
    medians = {}
    for cmd in COMMANDS:
        seconds = []
        for _ in range(5):
            t0 = time.perf_counter()
            subprocess.run(cmd, capture_output=True)
            seconds.append(time.perf_counter() - t0)
        medians[" ".join(cmd[1:])] = round(statistics.median(seconds), 3)
    print(label, medians, flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--inside"]:
        measure("inside (brokered):")
    else:
        measure("outside:")
        subprocess.run(["autoresearch", "agent", "--", sys.executable, __file__, "--inside"], stderr=subprocess.DEVNULL)
