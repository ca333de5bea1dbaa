"""Run the installed `mindspore-hyper` console script in a subprocess (shared by the CLI tests)."""
import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(sys.executable), "mindspore-hyper")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def cli(*args, cwd=ROOT, timeout=300):
    """(exit code, stdout, stderr) of `mindspore-hyper ARGS`."""
    result = subprocess.run([SCRIPT, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)
    return result.returncode, result.stdout, result.stderr


def cli_json(*args, cwd=ROOT):
    """The parsed JSON of a successful `mindspore-hyper ARGS --json`."""
    code, out, err = cli(*args, "--json", cwd=cwd)
    assert code == 0, err
    return json.loads(out)
