"""Run a sweep module (`python -m <module> --json <path>`) in a fresh process and read its results."""
import json
import subprocess
import sys
from pathlib import Path
from typing import List


def sweep_results(directory: Path, module: str, timeout: float) -> List[dict]:
    """The JSON list the sweep wrote; raises AssertionError with its stderr if it did not finish."""
    path = Path(directory) / "outcomes.json"
    run = subprocess.run([sys.executable, "-m", module, "--json", str(path)], capture_output=True, text=True,
                         timeout=timeout)
    if not path.exists():
        raise AssertionError(f"the sweep {module} did not finish (exit {run.returncode}):\n{run.stderr[-3000:]}")
    return json.loads(path.read_text())
