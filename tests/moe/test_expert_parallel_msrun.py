"""Expert parallelism under msrun (one process per device, the shared-memory transport's uneven
all-to-all): 3 Adam steps of data x expert (re-placed with EPLB replicas after 2 steps) and
expert x tensor parallel MoE equal the single device, with per-expert counts or the 1-bit routing mask as dispatch metadata, and with the
dispatch/compute/combine pipeline in 2 chunks (background AllToAll); `loss.backward()` through the
exchange gives `value_and_grad`'s gradients. The msrun job is shared
with the hierarchical test (conftest.py's `moe_msrun_results`)."""
import numpy as np
import pytest

from moe_msrun_cases import EXPERT_PARALLEL_CASES


@pytest.mark.msrun
def test_expert_parallel_on_4_processes_equals_single_device(moe_msrun_results):
    for rank, res in enumerate(moe_msrun_results):
        for case in EXPERT_PARALLEL_CASES:
            out = res[case]
            assert out["rank"] == rank
            np.testing.assert_allclose(out["losses"], out["ref_losses"], rtol=1e-5)
            for what in ("grad_error", "param_error"):
                worst = max(out[what].values())
                assert worst < 1e-4, (case, what, out[what])
            assert out["held_expert_shape"][0] == 4  # 8 experts over expert=2: this process holds 4
            assert out["stats"]["rows"] > 0 and out["stats"]["metadata"] > 0
            # loss.backward() through the exchange equals value_and_grad: the same ops in the same order
            assert out["backward_error"] == 0.0, (case, out["backward_error"])
        # metadata: 2 members x 4 experts x int64 counts, or 2 x ceil(16 tokens x 4 experts / 8) mask bytes
        assert res["2x2x1+place"]["stats"]["metadata"] == 2 * 6 * 8  # 6 slots per member after re-placement
        assert sum(res["2x2x1+place"]["replicas"]) == 12
        # 2 overlap chunks of 8 tokens: 2 x 2 x ceil(8 x 4 / 8) mask bytes; the exchanges ran on
        # the background thread and were timed
        overlap = res["1x2x2+bits+overlap"]["stats"]
        assert overlap["metadata"] == 2 * 2 * 4
        assert overlap["comm_seconds"] > 0 and overlap["wait_seconds"] >= 0
        # per-exchange timestamps: 2 chunks x (dispatch + combine) on the background thread
        assert len(overlap["comm_intervals"]) == 4 and len(overlap["wait_intervals"]) == 4
        assert 0.0 <= overlap["overlap_ratio"] <= 1.0
        assert overlap["hidden_seconds"] + overlap["exposed_seconds"] == pytest.approx(overlap["comm_seconds"])
        assert set(overlap["phase_seconds"]) == {"send", "receive", "compute"}
