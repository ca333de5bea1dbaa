"""Clipping, accumulation and loss scaling under msrun (4 processes, data x tensor with ZeRO-1):
the global norm counts each shard once (equal on every process, equal to the single-device norm),
the accumulated, clipped, scaled step equals the single-device loop with ops.clip_by_global_norm,
MindSpore's own clipping on a process's shards sees a wrong (smaller) norm, and the report has the
norm's scalar all-reduce ("clip grad norm"). The case (train_options_worker.py) runs in the 4-process
job of test_distributed_msrun.py (conftest.py's `dist_4_processes`)."""
import numpy as np
import pytest

from tolerances import training_rtol

REDUCTION = 32  # the DenseNorm model's longest reduction (its hidden width; the batch is 16)


@pytest.mark.msrun
def test_clipping_accumulation_and_loss_scale_on_4_processes(dist_4_processes):
    results = [rank["options"] for rank in dist_4_processes]
    rtol = training_rtol(REDUCTION, 2)
    for res in results:
        assert res["norms"] == results[0]["norms"]  # every process agrees on the norm
        np.testing.assert_allclose(res["norms"], res["ref_norms"], rtol=rtol)
        np.testing.assert_allclose(res["losses"], res["ref_losses"], rtol=rtol)
        assert min(res["ref_norms"]) > 0.05 and not res["skipped"]  # both steps clipped
        for name, (err, norm) in res["param_error"].items():
            assert err <= rtol * norm, (name, err, norm)
        assert res["package_norm_of_same"] == pytest.approx(res["norms"][-1], rel=rtol)
        assert res["mindspore_local_norm"] < 0.9 * res["package_norm_of_same"]  # shards only: wrong
        # ZeRO-1 over data: one reduce-scatter bucket and one all-gather per step, not one per micro-batch
        assert res["comm_backward"]["ReduceScatter"]["data"]["count"] == 1, res["comm_backward"]
        # the global norm's float64 sum over the 4 processes, once by train_step(max_grad_norm) and once by
        # clip_grad_norm after it: 8 bytes in each, the ring's 2(n-1)/n x 8 = 12 bytes sent (n = 4)
        assert res["comm_backward"]["AllReduce"]["data+tensor"] == {"count": 2, "bytes": 24, "input_bytes": 16}
        assert res["comm_causes"]["backward"]["AllReduce"]["data+tensor"] == {"clip grad norm": 2}
