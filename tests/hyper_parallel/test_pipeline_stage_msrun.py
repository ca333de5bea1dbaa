"""One msrun job of 2 processes: a pipeline script in upstream's form (each rank builds its own
stage) trains with 1F1B and GPipe equal to one device, launched as a user would
(`mindspore-hyper run --processes 2`); a refusal on one rank (before or during a step, on the
sending or the receiving side) is raised on both ranks, with the refusing rank's message, instead
of leaving the other waiting. (DTensor activations that do cross between processes, with several
devices per pipeline rank: pipeline_tp_script.py in test_msrun.py's 4-process job.)"""
import os
import subprocess
import sys

import pytest

from msrun_helpers import worker_logs

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.msrun
def test_pipeline_stages_train_like_one_device_under_msrun(tmp_path):
    cli = os.path.join(os.path.dirname(sys.executable), "mindspore-hyper")
    try:
        done = subprocess.run([cli, "run", "--processes", "2", "--log-dir", str(tmp_path / "log"),
                               os.path.join(HERE, "pipeline_script.py")], capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("msrun did not finish within 240 s (hang)")
    logs = worker_logs(tmp_path / "log", 2, tail=20000)
    assert done.returncode == 0, done.stderr[-2000:] + logs
    for rank in range(2):
        assert f"rank {rank}: pipeline 1F1B trains 3 Adam steps like one device" in logs
        assert f"rank {rank}: pipeline GPipe equals one device" in logs
        # a refusal on one rank is raised on every rank (its message forwarded), none waits for a timeout
        assert f"rank {rank}: a bad batch on rank 0 refused on every rank" in logs
        assert f"rank {rank}: pipeline GPipe equals one device after a refused step" in logs
        # a DTensor activation travels to rank 1 (its piece and layout), whose stage refuses it: a mesh of
        # another shape
        assert f"rank {rank}: a DTensor activation rank 1 cannot take refused on every rank" in logs
        assert f"rank {rank}: a step after a failed step refused on every rank" in logs
