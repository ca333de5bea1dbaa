"""Step-time terms of how a framework runs a strategy (issue 39, item 2: the held-out profile), each
checked against a hand computation from its definition (docs/estimate.md, "Held-out validation"):

- `p2p_overlap=False`: a blocking stage-to-stage transfer stops its sender (Megatron-LM 2021-2022);
- the receiver's all-gather of a scatter-gathered stage boundary (tensor parallel, no sequence parallel);
- `tp_backward_overlap`: the column-parallel linears' input-gradient collective beside their
  weight-gradient GEMM (Megatron-LM's async all-reduce);
- `grad_accumulation_fused=False`: the separate add of each micro-batch's gradients (Megatron 2021);
- `context_method="all_gather"`: Llama 3's exposed K/V all-gather;
- `efficiency.attention`: the flash kernel's own fraction of peak.

The equalities are between the same float64 formulas evaluated in two orders (sums of a few dozen
terms of similar size), so they hold to rel 1e-9, far above float64 rounding (~1e-16 per operation).
"""
import math

import pytest

from mindspore_hyper.estimate.calibrate import save_hardware
from mindspore_hyper.estimate.collective_time import collective_seconds, group_fanouts, transfer_seconds
from mindspore_hyper.estimate.hardware import hardware_from_dict, load_hardware
from mindspore_hyper.estimate.layer_ops import layer_forward_ops, op_phase_seconds, op_seconds
from mindspore_hyper.estimate.step_time import estimate_step_time
from mindspore_hyper.estimate.strategy import JobStrategy
from mindspore_hyper.estimate.transformer_config import TransformerConfig

REL = 1e-9  # see the module doc


def _gpt(**changes):
    values = dict(layers=8, hidden=2048, heads=16, vocab=51200, seq_len=2048, micro_batch=2)
    values.update(changes)
    return TransformerConfig(**values)


def test_a_blocking_transfer_costs_its_sender_one_transfer_per_micro_batch():
    """1F1B over 2 stages: each rank sends one tensor per micro-batch (stage 0 its activation, stage
    1 its input gradient), so blocking adds one transfer per extra micro-batch to the steady state."""
    config, hw = _gpt(), load_hardware("a100-80gb")
    st = JobStrategy(tensor=2, pipeline=2, data=2)

    def seconds(m, overlap):
        return estimate_step_time(config, st.with_(microbatches=m, p2p_overlap=overlap), hw).seconds

    tokens = config.micro_batch * config.seq_len
    p2p = transfer_seconds(tokens * config.hidden * config.dtype_bytes / 2, hw, group_fanouts(hw, 2, 2 * 2))
    extra = (seconds(8, False) - seconds(4, False)) - (seconds(8, True) - seconds(4, True))
    assert p2p > 0 and extra == pytest.approx(4 * p2p, rel=REL)
    blocked = estimate_step_time(config, st.with_(microbatches=8, p2p_overlap=False), hw)
    (term,) = [c for c in blocked.comm if c.axis == "pipeline"]
    assert term.hidden == 0.0 and term.seconds == pytest.approx(2 * 8 * p2p, rel=REL)


def test_without_a_pipeline_the_transfer_options_change_nothing():
    config = _gpt()
    st = JobStrategy(tensor=2, data=2, microbatches=4)
    assert estimate_step_time(config, st.with_(p2p_overlap=False)).seconds == estimate_step_time(config, st).seconds


def test_a_scatter_gathered_boundary_is_all_gathered_by_its_receiver():
    config, hw = _gpt(), load_hardware("a100-80gb")
    st = JobStrategy(tensor=4, pipeline=2, microbatches=4)
    est = estimate_step_time(config, st, hw)
    (term,) = [c for c in est.comm if c.name.startswith("pipeline scatter-gather")]
    full = config.micro_batch * config.seq_len * config.hidden * config.dtype_bytes
    one = collective_seconds("all_gather", full, hw, group_fanouts(hw, 4, 1))
    assert term.count == 2 * 4 and term.bytes == full and term.seconds == pytest.approx(8 * one, rel=REL)
    assert term.hidden == 0.0
    sp = estimate_step_time(config, st.with_(sequence_parallel=True), hw)  # the boundary is sharded already
    assert not [c for c in sp.comm if c.name.startswith("pipeline scatter-gather")]


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_the_backward_collective_hides_behind_the_weight_gradient_gemm(sequence_parallel):
    config, hw = _gpt(), load_hardware("a100-80gb")
    st = JobStrategy(tensor=8, microbatches=3, recompute="full", sequence_parallel=sequence_parallel)
    plain = estimate_step_time(config, st, hw)
    hidden = estimate_step_time(config, st.with_(tp_backward_overlap=True), hw)
    tokens = config.micro_batch * config.seq_len
    kind = "reduce_scatter" if sequence_parallel else "all_reduce"
    one = collective_seconds(kind, tokens * config.hidden * config.dtype_bytes, hw, group_fanouts(hw, 8, 1))
    wgrads = [op_phase_seconds(op, hw)[2] for op in layer_forward_ops(config, st, hw.attention)
              if op.name in ("qkv", "mlp up")]
    per_layer = sum(min(one, w) for w in wgrads)
    assert len(wgrads) == 2 and per_layer > 0
    assert plain.seconds - hidden.seconds == pytest.approx(config.layers * 3 * per_layer, rel=REL)
    (term,) = [c for c in hidden.comm if c.name.startswith("tensor parallel backward") and c.collective == kind]
    assert term.hidden == pytest.approx(config.layers * 3 * per_layer, rel=REL)


def test_a_separate_gradient_accumulation_reads_and_writes_every_parameter_per_micro_batch():
    config, hw = _gpt(), load_hardware("a100-80gb")
    st = JobStrategy(tensor=2, microbatches=3)
    fused = estimate_step_time(config, st, hw)
    separate = estimate_step_time(config, st.with_(grad_accumulation_fused=False), hw)
    h, f, v = config.hidden, config.ffn, config.vocab
    # one layer on one of 2 tensor-parallel devices: q, k, v, out (4 h^2) and the MLP (2 h f) with
    # their split biases (3h + f) split; the out and down biases and both norms (2 x 2h) replicated
    layer = (4 * h * h + 2 * h * f + 3 * h + f) / 2 + h + h + 4 * h
    embedding = v * h / 2 + config.seq_len * h  # vocabulary-parallel table, replicated positions
    head = v * h / 2 + 2 * h  # untied head and the final norm
    params = config.layers * layer + embedding + head
    seconds = 3 * params * 3 * config.dtype_bytes / (hw.memory_bandwidth * hw.efficiency.memory)
    assert separate.seconds - fused.seconds == pytest.approx(seconds, rel=1e-6)  # ceil of odd splits: none here


def test_llamas_context_all_gather_is_exposed():
    config, hw = _gpt(kv_heads=4, seq_len=8192, micro_batch=1), load_hardware("h100-80gb")
    st = JobStrategy(context_parallel=4, context_method="all_gather", microbatches=2)
    est = estimate_step_time(config, st, hw)
    gathered = 8192 * 2 * 4 * config.head_dim * config.dtype_bytes  # the whole sequence's K and V
    fan = group_fanouts(hw, 4, 1)
    assert est.layer.comm_forward == pytest.approx(collective_seconds("all_gather", gathered, hw, fan), rel=REL)
    assert est.layer.comm_backward == pytest.approx(collective_seconds("reduce_scatter", gathered, hw, fan),
                                                    rel=REL)
    assert all(c.hidden == 0.0 for c in est.comm if c.axis == "context")
    with pytest.raises(ValueError, match="context_method='gather': expected one of 'ring', 'ulysses', 'all_gather'"):
        JobStrategy(context_parallel=2, context_method="gather")


def test_the_flash_kernel_runs_at_its_own_efficiency(tmp_path):
    hw = load_hardware("h100-80gb")
    assert hw.efficiency.attention == 0.35
    config = _gpt(seq_len=8192, micro_batch=1)
    (core,) = [op for op in layer_forward_ops(config, JobStrategy(tensor=8), "flash") if op.kind == "attention"]
    assert op_seconds(core, hw) == pytest.approx(core.flops / (hw.peak_flops * 0.35), rel=REL)  # compute-bound
    at_matmul = hw.with_efficiency(attention=None)
    assert op_seconds(core, at_matmul) == pytest.approx(core.flops / (hw.peak_flops * 0.80), rel=REL)
    assert load_hardware(save_hardware(hw, str(tmp_path / "h.yaml"))).efficiency.attention == 0.35
    assert math.isclose(op_phase_seconds(core, hw)[1], 2.5 * op_seconds(core, hw))


def test_the_new_fields_are_checked():
    for name in ("p2p_overlap", "tp_backward_overlap", "grad_accumulation_fused"):
        with pytest.raises(ValueError, match=name):
            JobStrategy(**{name: "no"})
    data = {"peak_tflops": 100, "memory_GB": 1, "memory_bandwidth_GBps": 100, "attention": "materialized",
            "levels": [{"name": "l", "devices": 8, "bandwidth_GBps": 10, "latency_us": 1}],
            "efficiency": {"matmul": 0.8, "memory": 0.8, "network": 0.8, "message_overhead_us": 0, "attention": 0.4}}
    with pytest.raises(ValueError, match="'x.yaml': field 'efficiency.attention': the flash kernel's efficiency"):
        hardware_from_dict(data, "x.yaml")
    data.update(attention="flash")
    data["efficiency"]["attention"] = 1.5
    with pytest.raises(ValueError, match="field 'efficiency.attention': expected a number > 0 and <= 1"):
        hardware_from_dict(data, "x.yaml")
