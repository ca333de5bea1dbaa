"""Step-time model: one layer's FLOPs and bytes by hand, the alpha-beta sums, the pipeline bubble,
and how the parts add up (dense, GQA, MoE, sequence and context parallel)."""
import math

import pytest

from mindspore_hyper.estimate import (JobStrategy, TransformerConfig, estimate_job, estimate_step_time, global_batch,
                                      load_hardware)
from mindspore_hyper.estimate.collective_time import collective_seconds, group_fanouts
from mindspore_hyper.estimate.layer_ops import layer_forward_ops, model_flops_per_token, op_seconds
from mindspore_hyper.estimate.pipeline_time import _simulated, pipeline_makespan, rank_stages

TINY = TransformerConfig(layers=2, hidden=16, heads=2, vocab=32, seq_len=8, micro_batch=1, ffn=64)
TOY_HW = {"name": "toy", "peak_tflops": 1, "memory_GB": 16, "memory_bandwidth_GBps": 1,
          "levels": [{"name": "node", "devices": 4, "bandwidth_GBps": 100, "latency_us": 1},
                     {"name": "net", "devices": 64, "bandwidth_GBps": 10, "latency_us": 5}],
          "efficiency": {"matmul": 1.0, "memory": 1.0, "network": 0.5, "message_overhead_us": 1},
          "attention": "materialized"}


def test_one_layer_flops_and_bytes_by_hand():
    # t=2, no SP, 2-byte elements: T = 8 tokens, q 8 wide, one local kv head of 8, f/t = 32
    ops = {op.name: op for op in layer_forward_ops(TINY, JobStrategy(tensor=2), "materialized")}
    expected = {  # name: (flops, bytes)
        "norm 1": (0, 2 * 8 * 16 * 2),
        "qkv": (2 * 8 * 16 * 24, 2 * (8 * 16 + 16 * 24 + 8 * 24)),
        "attention core": (4 * 1 * 1 * 8 * 8 * 8, 2 * (2 * 8 * 8 + 2 * 8 * 8)),
        "scores": (0, 13 * 8 * 8),
        "projection": (2 * 8 * 8 * 16, 2 * (8 * 8 + 16 * 8 + 8 * 16)),
        "dropout-add 1": (0, 8 * 16 * 7),
        "norm 2": (0, 2 * 8 * 16 * 2),
        "mlp up": (2 * 8 * 16 * 32, 2 * (8 * 16 + 16 * 32 + 8 * 32)),
        "mlp activation": (0, 8 * 32 * 2 * 2),
        "mlp down": (2 * 8 * 32 * 16, 2 * (8 * 32 + 32 * 16 + 8 * 16)),
        "dropout-add 2": (0, 8 * 16 * 7),
    }
    assert {k: (op.flops, op.bytes) for k, op in ops.items()} == expected
    flash = {op.name: op for op in layer_forward_ops(TINY, JobStrategy(tensor=2), "flash")}
    assert flash["attention core"].flops == 1024 and "scores" not in flash  # causal half skipped, no scores
    # sequence parallel: norms and dropouts on T/t tokens
    sp = {op.name: op for op in layer_forward_ops(TINY, JobStrategy(tensor=2, sequence_parallel=True), "flash")}
    assert sp["norm 1"].bytes == 2 * 4 * 16 * 2 and sp["dropout-add 2"].bytes == 4 * 16 * 7
    # roofline on 1 TFLOP/s and 1 GB/s: the qkv GEMM is memory bound here
    hw = load_hardware(TOY_HW)
    assert op_seconds(ops["qkv"], hw) == pytest.approx(1408 / 1e9)
    assert op_seconds(ops["norm 1"], hw) == pytest.approx(512 / 1e9)


def test_gqa_moe_and_context_ops_by_hand():
    gqa = TINY.with_(heads=4, kv_heads=1)  # head_dim 4, one kv head of 4
    qkv = {op.name: op for op in layer_forward_ops(gqa, JobStrategy(), "flash")}["qkv"]
    assert qkv.flops == 2 * 8 * 16 * (16 + 2 * 4)
    moe = TINY.with_(experts=4, top_k=2)
    ops = {op.name: op for op in layer_forward_ops(moe, JobStrategy(data=2, expert=2), "flash")}
    assert ops["router"].flops == 2 * 8 * 16 * 4
    assert ops["expert up"].flops == 2 * (8 * 2) * 16 * 64  # T x top_k routed tokens
    assert ops["expert up"].bytes == 2 * (16 * 16 + 2 * 16 * 64 + 16 * 64)  # two local experts' weights
    cp = {op.name: op for op in layer_forward_ops(TINY, JobStrategy(context_parallel=2), "materialized")}
    assert cp["qkv"].flops == 2 * 4 * 16 * 48  # T = 8 / 2 tokens
    assert cp["attention core"].flops == 4 * 1 * 2 * 4 * 8 * 8  # 4 local queries against all 8 keys


def test_model_flops_are_korthikantis_formula():
    c = TransformerConfig(layers=96, hidden=12288, heads=96, vocab=51200, seq_len=2048)
    s, h, l, v = 2048, 12288, 96, 51200
    paper = 72 * s * l * h * h * (1 + s / (6 * h) + v / (12 * h * l))
    assert model_flops_per_token(c) * s == pytest.approx(paper, rel=1e-12)
    # and the sum of one device's ops (t=1, full attention) x layers x 3 + the head
    ops = layer_forward_ops(TINY, JobStrategy(), "materialized")
    per_seq = 3 * (TINY.layers * sum(op.flops for op in ops) + 2 * 8 * 16 * 32)
    assert model_flops_per_token(TINY) * 8 == pytest.approx(per_seq)


def test_group_fanouts_over_levels():
    hw = load_hardware(TOY_HW)
    assert group_fanouts(hw, 4, 1) == (4, 1)
    assert group_fanouts(hw, 8, 1) == (4, 2)
    assert group_fanouts(hw, 4, 2) == (2, 2)
    assert group_fanouts(hw, 2, 4) == (1, 2)
    assert group_fanouts(hw, 16, 4) == (1, 16)
    assert group_fanouts(hw, 1, 64) == (1, 1)
    with pytest.raises(ValueError, match="spans 128 devices; hardware 'toy' has 64"):
        group_fanouts(hw, 32, 4)


def test_alpha_beta_sums_by_hand():
    hw = load_hardware(TOY_HW)  # node: alpha 1+1 us, beta 1/(50 GB/s); net: alpha 5+1 us, beta 1/(5 GB/s)
    f = (4, 2)
    assert collective_seconds("all_reduce", 1e6, hw, f) == pytest.approx(
        (2 * 3 * 2e-6 + 2 * 3 / 4 * 1e6 / 50e9) + (2 * 1 * 6e-6 + 2 * 1 / 2 * 2.5e5 / 5e9))
    assert collective_seconds("all_gather", 1e6, hw, f) == pytest.approx(
        (3 * 2e-6 + 3 / 4 * 1e6 / 50e9) + (6e-6 + 1 / 2 * 2.5e5 / 5e9))
    assert collective_seconds("reduce_scatter", 1e6, hw, f) == collective_seconds("all_gather", 1e6, hw, f)
    assert collective_seconds("all_to_all", 8e5, hw, f) == pytest.approx(
        3 * (2e-6 + 8e5 / 50e9 / 8) + 4 * (6e-6 + 8e5 / 5e9 / 8))
    assert collective_seconds("send_recv", 1e6, hw, (1, 2)) == pytest.approx(6e-6 + 1e6 / 5e9)
    assert collective_seconds("all_reduce", 1e9, hw, (1, 1)) == 0.0
    with pytest.raises(ValueError, match="kind='gather'"):
        collective_seconds("gather", 1, hw, f)


def test_peer_wait_is_paid_once_per_collective_of_two_or_more_ranks():
    waiting = load_hardware({**TOY_HW, "efficiency": {**TOY_HW["efficiency"], "peer_wait_us": 300}})
    assert waiting.efficiency.peer_wait == pytest.approx(3e-4)
    hw = load_hardware(TOY_HW)
    for kind, f in (("all_reduce", (4, 2)), ("all_gather", (4, 1)), ("all_to_all", (2, 2)), ("send_recv", (1, 2))):
        assert collective_seconds(kind, 1e6, waiting, f) == pytest.approx(collective_seconds(kind, 1e6, hw, f) + 3e-4)
    assert collective_seconds("all_reduce", 1e6, waiting, (1, 1)) == 0.0
    # a tensor-parallel step pays it for each of its 4 all-reduces per layer and micro-batch
    st = JobStrategy(tensor=2, microbatches=1)
    slower, base = estimate_step_time(TINY, st, waiting), estimate_step_time(TINY, st, hw)
    assert slower.seconds - base.seconds == pytest.approx(TINY.layers * 4 * 3e-4)


def test_alpha_beta_matches_the_cpp_cost_model_on_one_level():
    from mindspore_hyper.comm.cost import estimate_time

    hw = load_hardware({**TOY_HW, "levels": [{"name": "ub", "devices": 384, "bandwidth_GBps": 375,
                                              "latency_us": 0.2}],
                        "efficiency": {"matmul": 1, "memory": 1, "network": 1, "message_overhead_us": 0}})
    n = 1 << 30  # large: the library's ring algorithm (at p = 2 recursive doubling saves one alpha)
    for p in (4, 8, 64):
        assert collective_seconds("all_reduce", n, hw, group_fanouts(hw, p)) == pytest.approx(
            estimate_time("all_reduce", n, list(range(p)), "supernode384"), rel=1e-9)


def test_rank_stages_are_the_builders():
    from mindspore_hyper.schedule import build_schedule

    for kind, v in (("1f1b", 1), ("interleaved_1f1b", 2), ("zb_h1", 1), ("zb_v", 2), ("dualpipe_v", 2)):
        schedule = build_schedule(kind, 4, 8, v)
        assert rank_stages(kind, 4, v) == tuple(schedule.stages_of(r) for r in range(4)), kind


def test_bubble_of_1f1b_is_the_published_one():
    from mindspore_hyper.schedule.formulas import published_idle

    pipe = pipeline_makespan("1f1b", 4, 8, 1, [1.0] * 4, [1.0] * 4, [1.0] * 4, 0.0)
    assert pipe.makespan == pytest.approx((8 + 3) * 3) and pipe.bubble == pytest.approx(published_idle("1f1b", 4))
    assert pipe.source == "simulator" and pipe.simulated_microbatches == 4
    formula = pipeline_makespan("1f1b", 4, 8, 1, [1.0] * 4, [1.0] * 4, [1.0] * 4, 0.0, simulation_limit=0)
    assert formula.source == "formula" and formula.makespan == pytest.approx(pipe.makespan)


@pytest.mark.parametrize("kind, v", [("1f1b", 1), ("interleaved_1f1b", 2), ("zb_h1", 1), ("zb_v", 2),
                                     ("dualpipe_v", 2)])
def test_steady_state_extension_equals_simulating_every_microbatch(kind, v):
    p, m = 4, 20
    stages = p * v
    f = tuple(1.0 + 0.1 * s for s in range(stages))  # uneven stages
    bi = tuple(1.2 * x for x in f)
    bw = tuple(0.8 * x for x in f)
    pipe = pipeline_makespan(kind, p, m, v, f, bi, bw, 0.05)
    assert pipe.simulated_microbatches < m
    assert pipe.makespan == pytest.approx(_simulated(kind, p, m, v, f, bi, bw, 0.05), rel=1e-9)


def _hw_fast_net():
    return load_hardware("a100-80gb")


def test_single_device_step_is_the_sum_of_its_parts():
    st = JobStrategy(microbatches=3)
    r = estimate_step_time(TINY, st, "a100-80gb")
    per_mb = TINY.layers * (r.layer.forward + r.layer.backward_input + r.layer.backward_weight)
    assert r.pipeline.bubble == 0.0 and not r.comm
    head = r.pipeline.work / 3 - per_mb
    assert head > 0  # the LM head and the cross-entropy
    assert r.seconds == pytest.approx(r.pipeline.work + r.optimizer)
    assert sum(r.breakdown.values()) == pytest.approx(r.seconds)
    hw = _hw_fast_net()
    assert r.mfu == pytest.approx(model_flops_per_token(TINY) * 3 * 8 / (r.seconds * hw.peak_flops))
    assert r.tokens_per_second == pytest.approx(3 * 8 / r.seconds) and r.global_batch == 3
    # Adam with fp32 master weights: 2 x 2 + 2 x 4 x 3 bytes per parameter through HBM at 90%
    assert r.optimizer == pytest.approx(TINY.total_params() * 28 / (2039e9 * 0.9))


GPT = TransformerConfig(layers=8, hidden=1024, heads=16, vocab=32000, seq_len=1024, micro_batch=2)


def _term(result, name):
    terms = [c for c in result.comm if c.name.startswith(name)]
    assert len(terms) == 1, [c.name for c in result.comm]
    return terms[0]


def test_tensor_parallel_terms():
    hw = load_hardware("a100-80gb")
    r = estimate_step_time(GPT, JobStrategy(tensor=4, microbatches=2), hw)
    fwd = _term(r, "tensor parallel forward")
    n = 2 * 1024 * 1024 * 2  # T h e
    assert (fwd.collective, fwd.axis, fwd.levels, fwd.count, fwd.bytes) == ("all_reduce", "tensor", ("nvlink",),
                                                                            2 * 8 * 2, n)
    assert fwd.seconds == pytest.approx(32 * collective_seconds("all_reduce", n, hw, (4, 1)))
    assert fwd.exposed == fwd.seconds
    sp = estimate_step_time(GPT, JobStrategy(tensor=4, sequence_parallel=True, microbatches=2), hw)
    assert _term(sp, "tensor parallel forward (all-gather)").count == 32
    assert _term(sp, "tensor parallel backward (reduce-scatter)").collective == "reduce_scatter"
    full = estimate_step_time(GPT, JobStrategy(tensor=4, microbatches=2, recompute="full"), hw)
    assert _term(full, "tensor parallel forward").count == 64  # the recomputed forward communicates again
    assert full.seconds > r.seconds


def test_data_parallel_sync_overlaps_the_backward():
    hw = load_hardware("a100-80gb")
    r = estimate_step_time(GPT, JobStrategy(data=16, microbatches=1), hw)  # spans 2 nodes
    sync = _term(r, "data-parallel gradient all-reduce")
    assert sync.levels == ("nvlink", "infiniband") and sync.count == 1
    assert sync.bytes == GPT.total_params() * 2
    overlap = 7 * (r.layer.backward_input + r.layer.backward_weight)  # (L - 1) layers of the last backward
    assert sync.hidden == pytest.approx(min(sync.seconds, overlap))
    assert r.grad_sync_exposed == pytest.approx(sync.exposed)
    z1 = estimate_step_time(GPT, JobStrategy(data=16, microbatches=1, zero_stage=1), hw)
    assert _term(z1, "data-parallel gradient reduce-scatter").collective == "reduce_scatter"
    assert _term(z1, "ZeRO-1/2 parameter all-gather").exposed > 0
    assert z1.optimizer == pytest.approx(r.optimizer / 16)


def test_moe_alltoall_terms():
    moe = GPT.with_(experts=8, top_k=2)
    r = estimate_step_time(moe, JobStrategy(data=4, expert=4, microbatches=1), "a100-80gb")
    a2a = _term(r, "expert AllToAll forward")
    assert (a2a.collective, a2a.axis, a2a.count, a2a.bytes) == ("all_to_all", "expert", 2 * 8, 2 * 1024 * 2 * 1024 * 2)
    dense = estimate_step_time(GPT, JobStrategy(data=4, microbatches=1), "a100-80gb")
    assert r.seconds > dense.seconds


def test_context_parallel_ring_and_ulysses():
    hw = load_hardware("h100-80gb")
    long = GPT.with_(seq_len=32768, micro_batch=1)
    ring = estimate_step_time(long, JobStrategy(context_parallel=4, microbatches=1), hw)
    term = _term(ring, "context ring forward")
    tokens, kv = 32768 / 4, 1024
    assert (term.collective, term.axis, term.count, term.bytes) == ("send_recv", "context", 3 * 8, tokens * 2 * kv * 2)
    core = [t for name, kind, _, _, t in ring.layer.ops if kind == "attention"][0]
    assert term.hidden == pytest.approx(min(term.seconds, 8 * core))
    backward = _term(ring, "context ring backward (K/V and their gradients)")
    assert (backward.count, backward.bytes) == (3 * 8, 2 * tokens * 2 * kv * 2)
    home = _term(ring, "context ring backward (gradients home)")  # the accumulators' last step, exposed
    assert (home.collective, home.count, home.bytes, home.hidden) == ("send_recv", 8, tokens * 2 * kv * 2, 0.0)
    uly = estimate_step_time(long, JobStrategy(context_parallel=4, context_method="ulysses", microbatches=1), hw)
    a2a = _term(uly, "context Ulysses forward")
    assert a2a.collective == "all_to_all" and a2a.bytes == tokens * (2 * 1024 + 2 * kv) * 2
    single = estimate_step_time(long, JobStrategy(microbatches=1), hw)
    assert ring.seconds < single.seconds and ring.global_batch == single.global_batch == 1
    with pytest.raises(ValueError, match="ulysses.*heads=16 must divide by tensor x context_parallel = 2 x 16"):
        estimate_step_time(long, JobStrategy(tensor=2, context_parallel=16, context_method="ulysses"), hw)


def test_context_parallel_memory_divides_activations_and_kv_cache():
    c = GPT.with_(seq_len=8192, micro_batch=1)
    one = estimate_job(c, JobStrategy(recompute="selective")).peak
    four = estimate_job(c, JobStrategy(recompute="selective", context_parallel=4)).peak
    assert four.activations == pytest.approx(one.activations / 4, abs=1)
    assert four.parameters == one.parameters
    kv1 = estimate_job(c, JobStrategy(inference=True)).peak.kv_cache
    kv4 = estimate_job(c, JobStrategy(inference=True, context_parallel=4)).peak.kv_cache
    assert kv4 * 4 == kv1 == 2 * 8 * 8192 * 1024 * 2
    # ZeRO shards over data x context
    z = estimate_job(c, JobStrategy(data=2, context_parallel=4, zero_stage=1)).peak
    assert z.optimizer_states == math.ceil(c.total_params() / 8) * 12
    with pytest.raises(ValueError, match="context_parallel=3: seq_len=8192 must divide"):
        estimate_job(c, JobStrategy(context_parallel=3))
    with pytest.raises(ValueError, match="context_method='spiral'"):
        JobStrategy(context_parallel=2, context_method="spiral")


def test_schedule_fields_and_interleaved_memory():
    st = JobStrategy(pipeline=4, microbatches=8, schedule="interleaved_1f1b", chunks=2)
    c = GPT
    # stage 0: ((p - 1) * 2 + (v - 1) * p + 1) / v = (6 + 4 + 1) / 2 = 5.5 stage-shares in flight
    assert estimate_job(c, st).stages[0].in_flight == 5.5
    r = estimate_step_time(c, st, "a100-80gb")
    plain = estimate_step_time(c, st.with_(schedule="1f1b", chunks=1), "a100-80gb")
    assert r.pipeline.bubble < plain.pipeline.bubble
    with pytest.raises(ValueError, match="chunks=1: schedule='zb_v' runs exactly 2 chunks"):
        JobStrategy(pipeline=2, schedule="zb_v")
    with pytest.raises(ValueError, match="schedule='pipedream'"):
        JobStrategy(schedule="pipedream")


def test_refusals_name_the_field():
    with pytest.raises(ValueError, match="inference=True: estimate_step_time models a training step"):
        estimate_step_time(GPT, JobStrategy(inference=True), "a100-80gb")
    with pytest.raises(ValueError, match="offload_params"):
        estimate_step_time(GPT, JobStrategy(offload_params="host"), "a100-80gb")
    with pytest.raises(ValueError, match="8192 devices; hardware 'a100-80gb' has 4480"):
        estimate_step_time(GPT, JobStrategy(data=8192), "a100-80gb")
    with pytest.raises(ValueError, match="unknown preset"):
        estimate_step_time(GPT, JobStrategy(), "tpu-v9")
    with pytest.raises(ValueError, match="microbatches=2: schedule='1f1b' needs at least 4 micro-batches"):
        estimate_step_time(GPT, JobStrategy(pipeline=4, microbatches=2), "a100-80gb")
    with pytest.raises(ValueError, match="microbatches=6: schedule='dualpipe_v' needs at least 8"):
        estimate_step_time(GPT, JobStrategy(pipeline=4, microbatches=6, schedule="dualpipe_v", chunks=2), "a100-80gb")
    assert global_batch(GPT, JobStrategy(data=4, pipeline=2, microbatches=8)) == 64


def test_tied_embeddings_across_stages_add_their_all_reduce():
    tied = GPT.with_(tied_embeddings=True)
    r = estimate_step_time(tied, JobStrategy(pipeline=2, data=8, microbatches=4), "a100-80gb")
    term = _term(r, "tied embedding gradient")
    assert term.levels == ("infiniband",) and term.bytes == 32000 * 1024 * 2  # stage 0 and 1 are 8 ranks apart
    untied = estimate_step_time(GPT, JobStrategy(pipeline=2, data=8, microbatches=4), "a100-80gb")
    assert not [c for c in untied.comm if c.name.startswith("tied")]
