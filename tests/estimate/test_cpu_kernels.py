"""The measured per-op kernel table (cpu_kernels), the transport's alpha-beta fit, and how the
step-time model uses them: tiny shapes, no wall-clock assertions."""
import dataclasses

import pytest

from mindspore_hyper.estimate import JobStrategy, TransformerConfig, estimate_step_time, load_hardware
from mindspore_hyper.estimate.calibrate import save_hardware
from mindspore_hyper.estimate.layer_ops import (OPTIMIZER_KEY, head_forward_ops, kernel_key, layer_forward_ops,
                                                op_phase_seconds, op_seconds)
from mindspore_hyper.estimate.step_time import _stage_local_params
from mindspore_hyper.estimate.transport_calibration import alpha_beta

CONFIG = TransformerConfig(layers=2, hidden=64, heads=4, vocab=128, seq_len=16, micro_batch=2, dtype_bytes=4)


def _cpu():
    # a profile without a GEMM tiling (as calibrate_cpu's): the roofline is shape-independent
    return dataclasses.replace(load_hardware("a100-80gb"), attention="materialized", gemm_tiling=None)


def test_measured_kernels_positive_and_scale_with_the_shape():
    from mindspore_hyper.estimate.cpu_kernels import measure_kernels

    small = measure_kernels(CONFIG, JobStrategy(), repeats=1)
    ops = layer_forward_ops(CONFIG, JobStrategy(), "materialized") + head_forward_ops(CONFIG, JobStrategy())
    assert {kernel_key(op) for op in ops} | {OPTIMIZER_KEY} == set(small)
    for key, (forward, backward) in small.items():
        assert forward > 0 and backward >= 0, key
    # tensor parallel 2 measures the local (halved) GEMMs: keys of their own
    tp = measure_kernels(CONFIG, JobStrategy(tensor=2), repeats=1)
    tp_up = [op for op in layer_forward_ops(CONFIG, JobStrategy(tensor=2)) if op.name == "mlp up"][0]
    assert kernel_key(tp_up) in tp and kernel_key(tp_up) not in small


def test_measure_kernels_rejects_models_it_does_not_time():
    from mindspore_hyper.estimate.cpu_kernels import measure_kernels

    with pytest.raises(ValueError, match="kv_heads=heads"):
        measure_kernels(CONFIG.with_(kv_heads=2), JobStrategy())
    with pytest.raises(ValueError, match="experts=0, gated_mlp=False"):
        measure_kernels(CONFIG.with_(gated_mlp=True), JobStrategy())
    with pytest.raises(ValueError, match="repeats=0"):
        measure_kernels(CONFIG, JobStrategy(), repeats=0)


def test_the_model_uses_measured_kernels_and_round_trips(tmp_path):
    base = _cpu()
    st = JobStrategy(microbatches=1)
    ops = layer_forward_ops(CONFIG, st, "materialized") + head_forward_ops(CONFIG, st)
    kernels = {kernel_key(op): (1e-3, 2e-3) for op in ops}
    kernels[OPTIMIZER_KEY] = (1e-9, 0.0)
    hw = dataclasses.replace(base, kernels=kernels)
    # an op with weights splits its measured backward into input and weight gradients
    qkv = [op for op in ops if op.name == "qkv"][0]
    norm = [op for op in ops if op.name == "norm 1"][0]
    assert op_phase_seconds(qkv, hw) == (1e-3, 1e-3, 1e-3)
    assert op_phase_seconds(norm, hw) == (1e-3, 2e-3, 0.0)
    # without a table entry: the roofline, unchanged
    assert op_phase_seconds(qkv, base) == (op_seconds(qkv, base),) * 3
    est = estimate_step_time(CONFIG, st, hw)
    layer_ops = layer_forward_ops(CONFIG, st, "materialized")
    assert est.layer.forward == pytest.approx(1e-3 * len(layer_ops))
    assert est.layer.backward_input + est.layer.backward_weight == pytest.approx(2e-3 * len(layer_ops))
    assert est.optimizer == pytest.approx(1e-9 * _stage_local_params(CONFIG, st, 0))  # measured s per parameter
    # slower measured kernels -> a slower step
    slower = dataclasses.replace(hw, kernels={k: (2 * f, 2 * b) for k, (f, b) in kernels.items()})
    assert estimate_step_time(CONFIG, st, slower).seconds > est.seconds
    back = load_hardware(save_hardware(hw, str(tmp_path / "cpu.yaml")))
    assert set(back.kernels) == set(kernels)
    assert back.kernels[kernel_key(qkv)] == pytest.approx((1e-3, 2e-3))


def test_bad_kernel_entries_are_named():
    with pytest.raises(ValueError, match="kernels.qkv"):
        load_hardware({"peak_tflops": 1, "memory_GB": 1, "memory_bandwidth_GBps": 1,
                       "levels": [{"name": "shm", "devices": 4, "bandwidth_GBps": 1, "latency_us": 1}],
                       "efficiency": {"matmul": 1, "memory": 1, "network": 1, "message_overhead_us": 0},
                       "kernels": {"qkv": [1]}})


def test_alpha_beta_passes_through_both_points():
    alpha, bandwidth = alpha_beta(2, 4, 50e-6, 4 << 20, 2e-3)
    for n, t in ((4, 50e-6), (4 << 20, 2e-3)):
        assert 2 * alpha + n / bandwidth == pytest.approx(t)
    # 4 ranks: 6 steps and 3/2 of the bytes over the wire; points made with the same alpha, bandwidth
    alpha4, bandwidth4 = alpha_beta(4, 4, 6 * alpha + 1.5 * 4 / bandwidth, 4 << 20,
                                    6 * alpha + 1.5 * (4 << 20) / bandwidth)
    assert (alpha4, bandwidth4) == pytest.approx((alpha, bandwidth), rel=1e-6)
    with pytest.raises(ValueError, match="size=1"):
        alpha_beta(1, 4, 1e-5, 8, 2e-5)
    with pytest.raises(ValueError, match="small_s"):
        alpha_beta(2, 4, 2e-5, 8, 1e-5)
