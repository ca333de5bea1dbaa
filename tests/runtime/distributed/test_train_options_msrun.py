"""Clipping, accumulation and loss scaling under msrun (4 processes, data x tensor with ZeRO-1):
the global norm counts each shard once (equal on every process, equal to the single-device norm),
the accumulated, clipped, scaled step equals the single-device loop with ops.clip_by_global_norm,
MindSpore's own clipping on a process's shards sees a wrong (smaller) norm, and the report has the
norm's scalar all-reduce ("clip grad norm"). Each process's Telemetry logs the global loss and
the single-device norm, tokens/s of the global batch, its own device's memory and the step's
communication. The data-parallel gradient sums run once per step (not once per micro-batch),
their bytes those of the simulation's report of the same step. The case (train_options_worker.py)
runs in the 4-process job of test_distributed_msrun.py (conftest.py's `dist_4_processes`)."""
import importlib.util
import os

import numpy as np
import pytest

from tolerances import training_rtol
from train_helpers import BATCH

REDUCTION = 32  # the DenseNorm model's longest reduction (its hidden width; the batch is 16)
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_options_worker.py")
# one device's gradient elements (data 2 x tensor 2): fc1.weight 32x16 and fc1.bias 32 split over tensor (256
# + 16), norm.gamma and norm.beta 32 each, fc2.weight 4x32 split over tensor (64), fc2.bias 4; float32
SHARD_BYTES = 4 * (256 + 16 + 32 + 32 + 64 + 4)


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


@pytest.mark.msrun
def test_telemetry_on_4_processes_logs_global_figures(dist_4_processes):
    """Each process's Telemetry (all_ranks=True) in the same job: the loss train_step returned (the
    global loss, within the training tolerance of one device's), the global gradient norm (one
    device's within the same), tokens/s of the global batch, peak memory of this process's own
    device (its shards, not the global model) and the step's communication with a time > 0."""
    rtol = training_rtol(REDUCTION, 2)
    results = [rank["options"] for rank in dist_4_processes]
    for res in results:
        tel, rank = res["telemetry"], res["rank"]
        records = tel["records"]
        assert [r["step"] for r in records] == list(range(len(res["losses"])))
        assert [r["loss"] for r in records] == res["losses"] == results[0]["losses"]  # every process the same
        np.testing.assert_allclose([r["loss"] for r in records], res["ref_losses"], rtol=rtol)
        assert [r["grad_norm"] for r in records] == res["norms"]
        np.testing.assert_allclose([r["grad_norm"] for r in records], res["ref_norms"], rtol=rtol)
        for r in records:
            assert r["tokens"] == BATCH  # the global batch, not this process's data-parallel half
            # tokens / seconds then x seconds: two float64 roundings, each <= 2^-53 relative
            assert r["tokens_per_second"] * r["seconds"] == pytest.approx(BATCH, rel=2 * 2.0 ** -53)
        last = records[-1]
        assert tel["report_ranks"] == [rank] and last["memory_peak"] == {str(rank): tel["report_total"]}
        # this device's parameter shards: tensor-parallel fc1 and fc2.weight split in two, the rest whole
        assert tel["report_parameters"] == tel["local_parameter_bytes"] < tel["global_parameter_bytes"]
        assert last["comm_bytes"] == tel["report_comm_bytes"] > 0 and last["comm_seconds"] > 0
        assert len(tel["lines"]) == len(records) and all(f"loss {r['loss']:.4f}" in line
                                                          for r, line in zip(records, tel["lines"]))


@pytest.mark.msrun
def test_accumulation_reduces_gradients_over_data_once_per_step_on_4_processes(dist_4_processes):
    """The same job's last step (2 accumulated micro-batches, ZeRO-1 over data): each process's
    data-parallel gradient traffic equals the simulation's report of the same step, byte for byte,
    and one reduction per step by hand: every gradient reduce-scattered once (MindSpore's LayerNorm's
    gamma and beta, read through a cast, and fc2.weight, gathered over tensor before its MatMul,
    included), its updated half all-gathered once; no data-parallel all-reduce of a micro-batch's."""
    spec = importlib.util.spec_from_file_location("train_options_worker", WORKER)
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    simulated = worker.simulated_comm_backward()
    # ring over the 2 data members: the reduce-scatter sends (n-1)/n of the shard's gradient, the all-gather
    # the other half of the updated shard; once per step (per micro-batch would be twice these)
    expected = {"ReduceScatter": {"bytes": SHARD_BYTES // 2, "input_bytes": SHARD_BYTES},
                "AllGather": {"bytes": SHARD_BYTES // 2, "input_bytes": SHARD_BYTES // 2}}
    for kind, row in expected.items():
        assert {k: simulated[kind]["data"][k] for k in row} == row, (kind, simulated[kind])
    assert "data" not in simulated.get("AllReduce", {}), simulated
    for res in (rank["options"] for rank in dist_4_processes):
        step = res["step_comm_backward"]
        for kind, row in expected.items():  # msrun buckets the reduce-scatter: fewer records, the same bytes
            assert {k: step[kind]["data"][k] for k in row} == row, (res["rank"], kind, step[kind])
        assert "data" not in step.get("AllReduce", {}), (res["rank"], step["AllReduce"])


@pytest.mark.msrun
def test_cast_weights_are_summed_in_float32_once_per_step_on_4_processes(dist_4_processes):
    """tests/runtime/cast_weights_case.py under msrun (data 4, 2 micro-batches, the same job): a
    float32 weight read through the model's own bfloat16 cast and one read by a `to_float(bfloat16)`
    Cell get, on every process, the exact float32 sum of the 8 bfloat16 contributions (bit for bit
    the simulation's, tests/runtime/test_bfloat16_gradient_reduction.py), not a sum rounded to
    bfloat16, and the SGD step it makes; each weight's data-parallel all-reduce runs once per step
    in float32 (not once per micro-batch in bfloat16), beside the global norm's."""
    for res in (rank["cast_weights"] for rank in dist_4_processes):
        assert res["rounded_sum_mismatches"] >= 8, res  # the data tells the two sums apart
        assert res["grad_dtypes"] == ["float32"], res
        assert res["grad_mismatches"] == {"w": 0, "inner.v": 0}, res
        assert res["weight_mismatches"] == {"w": 0, "inner.v": 0}, res
        # a ring over 4 sends 2 (n - 1) / n of two 8 x 4 float32 gradients and the norm's 8 bytes
        assert res["comm_backward"]["AllReduce"]["data"] == {"count": 3, "bytes": 3 * (2 * 128 + 8) // 2,
                                                               "input_bytes": 2 * 128 + 8}, res["comm_backward"]
