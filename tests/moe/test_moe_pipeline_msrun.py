"""MoE layers inside pipeline stages under msrun (2 processes, a pipeline-only mesh, each
stage's experts local): losses, evaluation loss and parameters after 5 Adam steps equal one
device accumulating the same microbatches, with the full (1f1b) and the split (zb_h1) backward;
each stage's auxiliary losses were collected by its own process."""
import json
import os

import numpy as np
import pytest

from msrun_helpers import run_msrun, worker_logs

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe_pipeline_msrun_worker.py")


@pytest.mark.msrun
def test_moe_pipeline_on_2_processes_equals_single_device(tmp_path):
    kinds = ["1f1b", "zb_h1"]
    proc = run_msrun(WORKER, [tmp_path, *kinds], 2, tmp_path / "logs", timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + worker_logs(tmp_path / "logs", 2)
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    for kind in kinds:
        held = set()
        for rank, res in enumerate(results):
            out = res[kind]
            assert out["rank"] == rank
            np.testing.assert_allclose(out["losses"], out["ref_losses"], rtol=1e-5)
            assert out["eval_loss"] == pytest.approx(out["ref_eval_loss"], rel=1e-5)
            # this process's stage has one MoEBlock: one auxiliary loss per microbatch forward
            assert len(out["aux_losses"]) == 2 and all(a > 0 for a in out["aux_losses"])
            assert out["params"].keys() == out["ref_params"].keys()
            for name, value in out["params"].items():
                np.testing.assert_allclose(value, out["ref_params"][name], rtol=1e-4, atol=2e-6, err_msg=name)
            held |= out["params"].keys()
        assert {"block1.moe.router.weight", "block2.moe.experts.w_gate", "out.weight"} <= held
