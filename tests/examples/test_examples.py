"""The examples run on CPU and pass their own checks against single-device/resident runs."""
import os
import subprocess
import sys

import pytest

from paths import REPO_ROOT

ROOT = str(REPO_ROOT)


@pytest.mark.parametrize("script,expect", [
    ("quickstart.py", "OK: the simulated 8-device run matches the single-device model"),
    ("train_transformer_sim.py", "OK: 5 steps match single-device training"),
    ("offload_training.py", "OK: offloaded training matches resident training"),
    ("offload_training.py --simulate", "OK: offloaded training matches resident training"),
])
def test_example_runs_and_checks_itself(script, expect):
    result = subprocess.run([sys.executable, *os.path.join(ROOT, "examples", script).split()], capture_output=True,
                            text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert expect in result.stdout
