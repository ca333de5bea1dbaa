"""MoE layers inside pipeline stages under msrun: losses, evaluation loss and parameters (expert
shards against their slices) after 3 Adam steps equal one device accumulating the same
microbatches, on a pipeline-only mesh (2 processes, each stage's experts local) and on pipeline
2 x expert 2 (4 processes: the expert exchange runs over each stage's 2 processes, flat and
hierarchical); each stage's auxiliary losses are collected by its processes."""
import json
import os

import numpy as np
import pytest

from moe_msrun_cases import PIPELINE_CASES, PIPELINE_PREFIX
from msrun_helpers import run_msrun, worker_logs

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe_pipeline_msrun_worker.py")


@pytest.mark.msrun
def test_moe_pipeline_on_2_processes_equals_single_device(tmp_path):
    """Pipeline-only mesh: each stage's experts are local to its process."""
    proc = run_msrun(WORKER, [tmp_path, "1f1b"], 2, tmp_path / "logs", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + worker_logs(tmp_path / "logs", 2)
    check([json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)], ["1f1b"])


@pytest.mark.msrun
def test_moe_pipeline_with_expert_parallel_on_4_processes_equals_single_device(moe_msrun_results):
    """Pipeline 2 x expert 2, flat and hierarchical (cases of the shared MoE job, conftest.py)."""
    check([{case: res[PIPELINE_PREFIX + case] for case in PIPELINE_CASES} for res in moe_msrun_results], PIPELINE_CASES)


def check(results, cases):
    """Each rank's results (case -> moe_pipeline_msrun_worker.py's figures) against one device."""
    for case in cases:
        held = set()
        for rank, res in enumerate(results):
            out = res[case]
            assert out["rank"] == rank
            np.testing.assert_allclose(out["losses"], out["ref_losses"], rtol=1e-5)
            assert out["eval_loss"] == pytest.approx(out["ref_eval_loss"], rel=1e-5)
            # this process's stage has one MoEBlock: one auxiliary loss per microbatch forward
            assert len(out["aux_losses"]) == 2 and all(a > 0 for a in out["aux_losses"])
            assert out["params"].keys() == out["ref_params"].keys()
            for name, value in out["params"].items():
                np.testing.assert_allclose(value, out["ref_params"][name], rtol=1e-4, atol=2e-6, err_msg=name)
            held |= out["params"].keys()
            stage_stats = [s for s in out["stats"] if s is not None]
            if "expert" in case:  # this process holds 2 of its stage's 4 experts; rows went to the other process
                expert = next(n for n in out["params"] if n.endswith("experts.w_gate"))
                assert np.asarray(out["params"][expert]).shape[0] == 2
                links = stage_stats[0]["dispatch_link_bytes"]
                assert len(stage_stats) == 1 and links["intra_group"] + links["inter_group"] > 0
            else:  # experts local: the layers ran on one device, no exchange
                assert stage_stats == []
        assert {"block1.moe.router.weight", "block2.moe.experts.w_gate", "out.weight"} <= held
