"""The msrun jobs of pipeline_msrun_worker.py, one per job size, shared by the pipeline tests: 4
processes (zb_h1 on pipeline 4, 1f1b on tensor 2 x pipeline 2 with clipping) for
test_pipeline_msrun.py, 2 processes (the GPT pipelined through its construct; rebalancing) for
test_pipeline_msrun.py and test_pipeline_rebalance.py. Each launch costs msrun's and every
process's MindSpore start-up on the shared cores; the runs of a job go one after another."""
import json
import os

import pytest

from msrun_helpers import run_msrun, worker_logs
from paths import REPO_ROOT

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pipeline_msrun_worker.py")
SECONDS_PER_RUN = 240  # the hang timeout of the job, per run


def _job(folder, workers: int, runs: dict) -> dict:
    """Run each of `runs` (name -> the worker's options, see pipeline_msrun_worker.py) in one msrun
    job of `workers` processes. Returns name -> (the folder of its rank<r>.npz, its options)."""
    done, args = {}, []
    for name, options in runs.items():
        out = folder / name
        out.mkdir()
        done[name] = (out, options)
        args.append(json.dumps(dict(options, out=str(out))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    result = run_msrun(WORKER, args, workers, folder / "log", timeout=SECONDS_PER_RUN * len(runs), env=env)
    assert result.returncode == 0, worker_logs(folder / "log", workers)
    return done


@pytest.fixture(scope="session")
def pipeline_4_processes(tmp_path_factory):
    """zb_h1 on 4 pipeline stages; 1f1b on tensor 2 x pipeline 2, clipped at 0.3 (the first 3
    steps' gradients, norms 0.48 to 0.31, not the last 2)."""
    return _job(tmp_path_factory.mktemp("pipeline_4_processes"), 4, {
        "zb_h1-pipeline": {"kind": "zb_h1", "microbatches": 4, "mesh": "pipeline"},
        "1f1b-tensor": {"kind": "1f1b", "microbatches": 4, "mesh": "tensor", "clip": 0.3},
    })


@pytest.fixture(scope="session")
def pipeline_2_processes(tmp_path_factory):
    """1f1b over 2 processes: the examples' GPT; the dense chain rebalanced from the split (1, 6)
    (last: it fixes the planner's layer costs for the rest of the job, which the worker undoes)."""
    return _job(tmp_path_factory.mktemp("pipeline_2_processes"), 2, {
        "gpt": {"kind": "1f1b", "microbatches": 2, "model": "gpt"},
        "rebalance": {"kind": "1f1b", "microbatches": 2, "rebalance": True},
    })
