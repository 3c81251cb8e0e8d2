"""The fast subset of benchmarks/faults.py: the harness SIGKILLed at four named moments of an experiment, each
followed by a restart; no row lost, written twice or torn, the branch on the last kept commit, no orphan."""

import subprocess
import sys

import pytest
from conftest import ROOT


pytestmark = pytest.mark.slow  # every test here trains through the real harness

def test_sigkill_at_four_moments_loses_nothing(small_cache, tmp_path):
    import os
    # no wait for a quiet machine, as the env fixture: the suite runs two tests at a time (.ci/run)
    env = dict(os.environ, AUTORESEARCH_CACHE=str(small_cache), AUTORESEARCH_LOAD_LIMIT="1000")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "faults.py"), "--kills", "4", "--budget", "2",
                           "--phases-only", "--eager", "--keep", str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "4 SIGKILLs in 4 rounds" in proc.stdout and "violations: 0" in proc.stdout
