"""An honest run's val_bpb under the evaluator of 56507ee (before issue 31) and this checkout's, on the same
export, and the evaluation's wall time side by side (no audit, no test split: a run above the champion's mean),
alternating, 3 each. Needs the prepared data (`python prepare.py`); trains the default train.py for 20 s once.

    python benchmarks/evaluator_ab.py
"""
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoresearch import untrusted  # noqa: E402 - the reviewed train.py, never the work tree's (docs/integrity.md)
from autoresearch.evaluator import harness as new  # noqa: E402
from autoresearch.evaluator.scoring import Request  # noqa: E402
from autoresearch.state import FIXED  # noqa: E402


def export(work: Path) -> tuple[Path, dict]:
    """The reviewed train.py trained 20 s in `work`: its out/ and result."""
    out = work / "out"
    env = dict(os.environ, AUTORESEARCH_TIME_BUDGET="20", AUTORESEARCH_RUN_DIR=str(out), AUTORESEARCH_SEED="42")
    for name in FIXED:
        (work / name).write_bytes((ROOT / name).read_bytes())
    untrusted.write(ROOT, work)
    subprocess.run([sys.executable, "train.py"], cwd=work, env=env, check=True, capture_output=True)
    return out, json.loads((out / "result.json").read_text())


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="evaluator-ab-"))
    old_file = work / "old_evaluate.py"
    old_file.write_text(subprocess.run(["git", "show", "56507ee:autoresearch/evaluate.py"], cwd=ROOT,
                                       capture_output=True, text=True, check=True).stdout)
    spec = importlib.util.spec_from_file_location("old_evaluate", str(old_file))
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    cache = Path(os.environ.get("AUTORESEARCH_CACHE") or "~/.cache/autoresearch").expanduser()
    out, result = export(work)
    src = (ROOT / "prepare.py").read_bytes()
    sources = {n: (ROOT / n).read_bytes() for n in ("prepare.py", "runtime.py")}
    dt, check = result["dtype"], result["check_bpb"]
    a = old.run_evaluation(src, out, dt, "cpu", check, float("inf"), cache, timeout=900)
    b = new.run_evaluation(sources, cache, Request(str(out), dt, "cpu", check))
    walls = {"old": [], "new": []}
    for _ in range(3):  # alternating: both share the same minutes of the machine
        t = time.time()
        old.run_evaluation(src, out, dt, "cpu", check, 0.0, cache, timeout=900)
        walls["old"].append(time.time() - t)
        t = time.time()
        new.run_evaluation(sources, cache, Request(str(out), dt, "cpu", check, 0.0))
        walls["new"].append(time.time() - t)
    print(json.dumps({"dtype": dt,
                      "old": {k: a.get(k) for k in ("val_bpb", "test_bpb", "check_bpb", "causal_probes", "seconds")},
                      "new": {k: b.get(k) for k in ("val_bpb", "test_bpb", "check_bpb", "causal_probes", "audited",
                                                    "causal_seconds", "seconds")},
                      "val_diff": abs(a["val_bpb"] - b["val_bpb"]), "test_diff": abs(a["test_bpb"] - b["test_bpb"]),
                      "wall_no_audit": {k: [round(x, 2) for x in v] for k, v in walls.items()},
                      "median": {k: round(statistics.median(v), 2) for k, v in walls.items()}}, indent=1))


if __name__ == "__main__":
    main()
