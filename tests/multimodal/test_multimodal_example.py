"""examples/multimodal_pipeline.py runs (simulation) and passes its own per-request checks."""
import os
import subprocess
import sys

from paths import REPO_ROOT


def test_multimodal_example_runs_and_checks_itself():
    script = os.path.join(str(REPO_ROOT), "examples", "multimodal_pipeline.py")
    result = subprocess.run([sys.executable, script, "--batches", "4", "--batch-size", "2", "--duplicates", "0.5"],
                            capture_output=True, text=True, timeout=600, cwd=str(REPO_ROOT))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "OK: async and cached outputs match the synchronous run per request; no false reuse" in result.stdout
    assert "false reuse 0" in result.stdout
