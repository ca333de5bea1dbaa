"""What the package docstring promises: the context, layouts, strategies, the communication
library, the planner (estimate) and the launch helpers import without MindSpore (~3 s), so the
CLI's estimate and a script's `exit_if_msrun_scheduler()` start fast. Each import runs in a fresh
interpreter (this one has MindSpore loaded already)."""
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["mindspore_hyper", "mindspore_hyper.comm", "mindspore_hyper.estimate",
                                    "mindspore_hyper.launch", "mindspore_hyper.cli"])
def test_imports_without_mindspore(module):
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'mindspore'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]", f"{module} imports MindSpore modules: {result.stdout[:500]}"
