"""Expert parallelism under msrun (one process per device, the shared-memory transport's uneven
all-to-all): 3 Adam steps of data x expert (re-placed with EPLB replicas after 2 steps) and
expert x tensor parallel MoE equal the single device, with per-expert counts or the 1-bit routing mask as dispatch metadata, and with the
dispatch/compute/combine pipeline in 2 chunks (background AllToAll), and with DeepSeek-V3's routing
(sigmoid scores, a score correction bias that changes the choice, top-2-sum groups, scaling factor) and
gpt-oss's (biased router, biased clamped-SwiGLU experts split over tensor: b_down added once per process);
`loss.backward()` through the
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


@pytest.mark.msrun
def test_each_process_times_its_own_experts_ops(moe_msrun_results, pynative):
    """Under msrun each process records its own experts' matmuls as timed ops (moe/expert_ops.py):
    FLOPs of the last step's ExpertMatMul rows 3 x 2 x n x H x F_local per MoE call, n the rows its
    experts received. Hand count: 32 tokens x top-2 = 64 token copies a step, every copy computed
    by one expert member (no capacity limit), so over the members the FLOPs add up to 6 x 64 x H x
    F_local: 6 x 64 x 16 x 24 on data 2 x expert 2 (each device its own rows), 6 x 64 x 16 x 12 on
    expert 2 x tensor 2 (F 24 split in two; the two tensor peers of a member compute the same rows,
    so ranks 1 and 3 repeat ranks 0 and 2). Rank 0's equal the simulation's (its representative is
    device 0; same weights, data and learned routing)."""
    import mindspore as ms
    from mindspore import nn

    from mindspore_hyper import Layout, auto_parallelize
    from moe_models import MoENet, batches, copy_weights, expert_strategy

    def flops(rows):
        return sum(f * n for op, f, _, n in rows if op == "ExpertMatMul")

    by_rank = [{case: res[case]["expert_ops"] for case in EXPERT_PARALLEL_CASES} for res in moe_msrun_results]
    assert sum(flops(r["2x2x1+place"]) for r in by_rank) == 6 * 64 * 16 * 24
    tp = [r["1x2x2+bits+overlap"] for r in by_rank]
    assert tp[1] == tp[0] and tp[3] == tp[2] and flops(tp[0]) + flops(tp[2]) == 6 * 64 * 16 * 12
    pynative.set_context(mode="simulation", device_num=4)
    ms.set_seed(0)  # the worker's models, weights and batches
    ref = MoENet(shared=8)
    model = MoENet(shared=8, routing_bits=True, overlap_chunks=2)
    copy_weights(ref, model)
    par = auto_parallelize(model, expert_strategy(Layout((1, 2, 2), ("data", "expert", "tensor")), tensor=True))
    opt = nn.Adam(par.optimizer_parameters(), learning_rate=1e-2)
    for x, t in batches(3):
        par.train_step(opt, x, t)
    simulated = sorted([op, f, b, n] for (op, f, b), n in par.accounting.compute.items() if op.startswith("Expert"))
    assert simulated == tp[0]
