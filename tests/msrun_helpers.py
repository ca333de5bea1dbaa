"""Launching msrun from tests: a free port, the venv's msrun first on PATH, a hard timeout."""
import os
import socket
import subprocess
import sys

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_msrun(script, args, workers: int, log_dir, timeout: float, env=None) -> subprocess.CompletedProcess:
    """Run `script args` on `workers` local processes; a hang fails the test after `timeout` s."""
    full_env = dict(os.environ if env is None else env)
    bindir = os.path.dirname(sys.executable)
    full_env["PATH"] = bindir + os.pathsep + full_env.get("PATH", "")
    cmd = [os.path.join(bindir, "msrun"), f"--worker_num={workers}", f"--local_worker_num={workers}",
           f"--master_port={free_port()}", f"--log_dir={log_dir}", "--join=True", str(script), *map(str, args)]
    try:
        return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"msrun did not finish within {timeout} s (hang)")


def worker_logs(log_dir, workers: int, tail: int = 3000) -> str:
    """The workers' logs without MindSpore's [WARNING] lines, for failure messages."""
    text = ""
    for rank in range(workers):
        path = os.path.join(str(log_dir), f"worker_{rank}.log")
        if os.path.exists(path):
            with open(path) as f:
                text += f"--- worker {rank}\n" + "\n".join(l for l in f.read().splitlines() if not l.startswith("["))[-tail:]
    return text
