"""docs/dashboard.png: the dashboard during a real loop, in headless Chromium (the test's browser setup).

    python docs/screenshot.py --budget 20 --runs 8 [--workers 2]

A scratch repository with this checkout's train.py and prepare.py loops on the prepared data; once it has
recorded --runs rows and a run is in flight, the dashboard is opened and photographed, then the loop is stopped
with Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_dashboard import browser, start_dashboard, wait_until  # noqa: E402

from autoresearch import facts, ledger  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=20)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--workers", type=int, default=0, help="parallel workers (0: the plain loop)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "dashboard.png"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="autoresearch-shot-") as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        for name in ("prepare.py", ".gitignore", "program.md"):
            shutil.copy(ROOT / name, repo / name)
        from autoresearch import reference  # the reviewed train.py, never the work tree's (docs/integrity.md)
        reference.write(ROOT, repo)
        for git_args in (["init", "-q", "-b", "main"], ["add", "-A"],
                         ["-c", "user.name=shot", "-c", "user.email=shot@localhost", "commit", "-qm", "shot"]):
            subprocess.run(["git", *git_args], cwd=repo, check=True)
        env = dict(os.environ, AUTORESEARCH_TIME_BUDGET=str(args.budget), PYTHONPATH=str(ROOT))
        command = [sys.executable, "-m", "autoresearch.cli", "loop", "--tag", "night"]
        if args.workers:
            command += ["--workers", str(args.workers), "--threads", "1"]
        loop = subprocess.Popen(command, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        server, url = start_dashboard(repo, env)
        driver = browser()
        try:
            def ready():
                path = repo / "results.tsv"
                rows = ledger.read(path, "night") if path.exists() else []
                return len(rows) >= args.runs and facts.in_flight(repo)
            wait_until(ready, timeout=args.runs * (args.budget + 40) + 120, what=f"{args.runs} runs")
            time.sleep(args.budget / 2)  # the run in flight halfway
            driver.get(url)
            wait_until(lambda: driver.find_elements("css selector", "#plot .main-svg"), what="the plot")
            time.sleep(3)
            driver.save_screenshot(args.out)
        finally:
            driver.quit()
            server.kill()
            os.killpg(loop.pid, signal.SIGINT)
            loop.wait()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
