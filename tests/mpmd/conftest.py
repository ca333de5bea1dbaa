"""The 4-process msrun job shared by test_mpmd_msrun.py (the multimodal model's groups training)
and test_rlhf_msrun.py (the PPO step's groups): one launch instead of two (each costs msrun's and
4 workers' MindSpore start-ups and warm-ups on the shared cores); mpmd_worker.py runs both."""
import json
import os

import pytest

from msrun_helpers import run_msrun, worker_logs

MPMD_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpmd_worker.py")


@pytest.fixture(scope="session")
def mpmd_4_processes(tmp_path_factory):
    """{"train": each rank's mpmd_worker.py JSON, "rlhf": each rank's rlhf_worker.py JSON}."""
    out = tmp_path_factory.mktemp("mpmd_4_processes")
    proc = run_msrun(MPMD_WORKER, [out, "train", "rlhf"], 4, out / "logs", timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + worker_logs(out / "logs", 4)
    return {"train": [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)],
            "rlhf": [json.loads((out / "rlhf" / f"rank{r}.json").read_text()) for r in range(4)]}
