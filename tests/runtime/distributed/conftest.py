"""The 4-process msrun job of dist_worker.py shared by test_distributed_msrun.py (the GPT on data 2
x tensor 2, with and without ZeRO-1) and test_train_options_msrun.py (clipping, accumulation and
loss scaling): one launch instead of two (each costs msrun's and 4 workers' MindSpore start-ups
and warm-ups on the shared cores)."""
import json
import os

import pytest

from msrun_helpers import run_msrun, worker_logs

DIST_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dist_worker.py")
FOUR_PROCESS_CASES = ("2x2", "2x2+zero", "options", "cast_weights")


@pytest.fixture(scope="session")
def dist_4_processes(tmp_path_factory):
    """Per rank of 4 processes: case -> that rank's results (dist_worker.py's JSON)."""
    out = tmp_path_factory.mktemp("dist_4_processes")
    proc = run_msrun(DIST_WORKER, [out, *FOUR_PROCESS_CASES], 4, out / "logs", timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + worker_logs(out / "logs", 4)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(4)]
