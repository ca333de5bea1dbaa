"""The MoE msrun worker launched once for the expert-parallel, hierarchical and 4-process
MoE-pipeline msrun tests: one msrun job of 4 processes runs every case the three test files check
(each launch costs 4 MindSpore start-ups and warm-ups on the shared cores)."""
import json
import os

import pytest

from moe_msrun_cases import EXPERT_PARALLEL_CASES, HIERARCHICAL_CASES, PIPELINE_CASES, PIPELINE_PREFIX
from msrun_helpers import run_msrun, worker_logs

MOE_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe_msrun_worker.py")


@pytest.fixture(scope="session")
def moe_msrun_results(tmp_path_factory):
    """Per rank of 4 processes: case -> that rank's results (moe_msrun_worker.py's JSON)."""
    out = tmp_path_factory.mktemp("moe_msrun")
    cases = [*EXPERT_PARALLEL_CASES, *HIERARCHICAL_CASES, *(PIPELINE_PREFIX + c for c in PIPELINE_CASES)]
    proc = run_msrun(MOE_WORKER, [out, *cases], 4, out / "logs", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + worker_logs(out / "logs", 4)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(4)]
