"""An honest run's val_bpb under the evaluator of 56507ee (before issue 31) and this checkout's, on the same
export, and the evaluation's wall time side by side (no audit, no test split: a run above the champion's mean),
alternating, 3 each. Needs the prepared data (`python prepare.py`); trains the default train.py for 20 s once.

    python benchmarks/evaluator_ab.py
"""
import json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path
WORK = Path(tempfile.mkdtemp(prefix="evaluator-ab-"))
OLD = WORK / "old_evaluate.py"
OLD.write_text(subprocess.run(["git", "show", "56507ee:autoresearch/evaluate.py"], cwd=Path(__file__).resolve().parent,
                              capture_output=True, text=True, check=True).stdout)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import importlib.util
root = Path(__file__).resolve().parent.parent
cache = Path(os.environ.get("AUTORESEARCH_CACHE") or "~/.cache/autoresearch").expanduser()
out = WORK / "out"
if not (out / "result.json").exists():
    env = dict(os.environ, AUTORESEARCH_TIME_BUDGET="20", AUTORESEARCH_RUN_DIR=str(out), AUTORESEARCH_SEED="42")
    from autoresearch import untrusted  # the reviewed train.py, never the work tree's (docs/integrity.md)
    from autoresearch.state import FIXED
    for name in FIXED:
        (WORK / name).write_bytes((root / name).read_bytes())
    untrusted.write(root, WORK)
    subprocess.run([sys.executable, "train.py"], cwd=WORK, env=env, check=True, capture_output=True)
result = json.loads((out / "result.json").read_text())
spec = importlib.util.spec_from_file_location("old_evaluate", str(OLD))
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
from autoresearch.evaluator import harness as new
from autoresearch.evaluator.request import Request
src = (root / "prepare.py").read_bytes()
sources = {n: (root / n).read_bytes() for n in ("prepare.py", "runtime.py")}
dt = result["dtype"]
a = old.run_evaluation(src, out, dt, "cpu", result["check_bpb"], float("inf"), cache, timeout=900)
b = new.run_evaluation(sources, cache, Request(str(out), dt, "cpu", result["check_bpb"]), 900)
walls = {"old": [], "new": []}
for _ in range(3):
    t = time.time(); old.run_evaluation(src, out, dt, "cpu", result["check_bpb"], 0.0, cache, timeout=900); walls["old"].append(time.time() - t)
    t = time.time(); new.run_evaluation(src, cache, Request(str(out), dt, "cpu", result["check_bpb"], 0.0), 900); walls["new"].append(time.time() - t)
print(json.dumps({"dtype": dt,
                  "old": {k: a.get(k) for k in ("val_bpb", "test_bpb", "check_bpb", "causal_probes", "seconds")},
                  "new": {k: b.get(k) for k in ("val_bpb", "test_bpb", "check_bpb", "causal_probes", "audited", "causal_seconds", "seconds")},
                  "val_diff": abs(a["val_bpb"] - b["val_bpb"]), "test_diff": abs(a["test_bpb"] - b["test_bpb"]),
                  "wall_no_audit": {k: [round(x, 2) for x in v] for k, v in walls.items()},
                  "median": {k: round(statistics.median(v), 2) for k, v in walls.items()}}, indent=1))
