"""examples/moe_training.py runs in simulation (8 virtual devices, with an expert re-placement
mid-training) and passes its own check against single-device training."""
import os
import subprocess
import sys

from paths import REPO_ROOT


def test_moe_example_matches_single_device():
    result = subprocess.run([sys.executable, os.path.join(str(REPO_ROOT), "examples", "moe_training.py"), "--steps", "3"],
                            capture_output=True, text=True, timeout=900, cwd=str(REPO_ROOT))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "OK: 3 steps match single-device training" in result.stdout
    assert "-> replicas" in result.stdout
