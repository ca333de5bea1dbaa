"""Helpers of the comm tests: a shared-memory group of two ranks on two threads of this process,
a segment's path, and a runner for snippets in a subprocess (there a crash or a hang is a test
failure, not a dead pytest)."""
import subprocess
import sys
import textwrap
import threading
import uuid

import pytest

from mindspore_hyper.comm import ShmCommunicator
from mindspore_hyper.comm.job_token import job_token
from mindspore_hyper.comm.shm import segment_name


def segment_path(name: str) -> str:
    """The /dev/shm path of this job's group `name` (as ShmCommunicator names it)."""
    return "/dev/shm/" + segment_name(name, job_token())


def run_isolated(code: str, timeout: float = 60.0) -> str:
    """Run `code` in a fresh interpreter; its stdout. Fails the test on a crash, an error or a hang."""
    try:
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the snippet hung (no exit within {timeout} s); output so far:\n{exc.stdout}\n{exc.stderr}")
    if proc.returncode != 0:
        how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        pytest.fail(f"the snippet failed ({how}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout


def on_both_ranks(groups, fn):
    """fn(group) on rank 1 (a thread) and rank 0 (this thread) at once; per rank its result or exception."""
    out = [None, None]

    def call(r):
        try:
            out[r] = fn(groups[r])
        except Exception as exc:  # returned to the test, which checks type and message
            out[r] = exc

    t = threading.Thread(target=call, args=(1,))
    t.start()
    call(0)
    t.join(timeout=60)
    assert not t.is_alive(), "rank 1 hung"
    return out


def shm_group_pair(timeout: float = 10.0, **kwargs):
    """Two ranks of one new shared-memory group, made on two threads (the constructor waits for both)."""
    name = "p" + uuid.uuid4().hex[:12]
    made = on_both_ranks([0, 1], lambda r: ShmCommunicator(name, r, 2, timeout=timeout, **kwargs))
    for g in made:
        if isinstance(g, Exception):
            raise g
    return made
