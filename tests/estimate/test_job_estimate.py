"""Whole-job estimate: parameter counts, tensor/pipeline/ZeRO splits, offload tiers, activations,
KV cache, fit limits, sweeps, job files; every figure computed by hand here."""
import pytest

from mindspore_hyper.estimate import (JobStrategy, TransformerConfig, estimate_job, estimate_stage,
                                      in_flight_microbatches, largest_fitting, plot_sweep, preset, sequence_sweep,
                                      stage_layers)

GPT = preset("gpt-example")  # examples/models.py GPT: vocab 128, hidden 64, heads 4, 2 layers, seq 16, fp32
# per layer: ln1 128 + qkv 192*64+192 + proj 64*64+64 + ln2 128 + fc1 256*64+256 + fc2 64*256+64 = 49,984
# embedding 128*64 + positions 16*64 = 9,216; final norm 128 + head 128*64 = 8,320
GPT_PARAMS = 2 * 49_984 + 9_216 + 8_320  # 117,504


def test_gpt_example_parameter_count():
    assert GPT.layer_params().total == 49_984
    assert GPT.total_params() == GPT_PARAMS
    assert GPT.largest_layer_params() == 49_984


def test_llama2_7b_parameter_count_is_the_published_one():
    assert preset("llama2-7b").total_params() == 6_738_415_616


def test_tensor_parallel_split_by_hand():
    # t=4, per device: embedding 8192/4 + 1024; per layer 128 + 12480/4 + (4096/4 + 64) + 128 + 16640/4
    # + (16384/4 + 64) = 12,784; final norm 128 + head 8192/4
    s = estimate_stage(GPT, JobStrategy(tensor=4), 0)
    assert s.parameters == 4 * (2048 + 1024 + 2 * 12_784 + 128 + 2048) == 123_264


def test_grouped_query_attention_and_moe_counts():
    # h=64, heads 8, kv 2 (head_dim 8): k and v are 64x16 + 16 each; experts 4 x (64*256+256+256*64+64)
    c = TransformerConfig(layers=1, hidden=64, heads=8, vocab=100, seq_len=8, kv_heads=2, experts=4,
                          learned_positions=False)
    layer = c.layer_params()
    assert layer.kv == 2 * (64 * 16 + 16)
    assert layer.experts == 4 * (64 * 256 + 256 + 256 * 64 + 64)
    assert layer.replicated == 64 + 4 * 64 + 64 * 4  # proj bias, two layernorms, router
    # tensor 4 > kv_heads 2: each device keeps one whole kv head = half the kv parameters;
    # expert 2 x tensor 4: an eighth of the experts' parameters
    s = estimate_stage(c, JobStrategy(data=2, tensor=4, expert=2), 0)
    # embedding 6400/4; attention q, q bias, proj 8256/4; replicated proj bias, norms, router 576;
    # final norm 128 and head 6400/4
    expected = 6400 // 4 + 8256 // 4 + (64 + 256 + 256) + layer.kv // 2 + layer.experts // 8 + 128 + 6400 // 4
    assert s.parameters == 2 * expected  # dtype_bytes 2


def test_zero_stages_by_hand():
    # fp32, Adam (2 states x 4 bytes, no master copy), data 8: a shard is 117,504 / 8 = 14,688 parameters
    full, shard = GPT_PARAMS, GPT_PARAMS // 8
    expected = {0: (full * 4, full * 4, full * 8), 1: (full * 4, full * 4, shard * 8),
                2: (full * 4, shard * 4, shard * 8), 3: (shard * 4, shard * 4, shard * 8)}
    for stage, (p, g, o) in expected.items():
        s = estimate_stage(GPT, JobStrategy(data=8, zero_stage=stage), 0)
        assert (s.parameters, s.gradients, s.optimizer_states) == (p, g, o)


def test_mixed_precision_optimizer_bytes():
    c = GPT.with_(dtype_bytes=2)
    assert estimate_stage(c, JobStrategy(), 0).optimizer_states == GPT_PARAMS * 12  # master + m + v
    assert estimate_stage(c, JobStrategy(master_weights=False), 0).optimizer_states == GPT_PARAMS * 8
    assert estimate_stage(c, JobStrategy(optimizer_states=1), 0).optimizer_states == GPT_PARAMS * 8


def test_pipeline_stage_layers_and_in_flight():
    assert [stage_layers(5, 2, k) for k in range(2)] == [2, 3]
    assert [stage_layers(8, 4, k) for k in range(4)] == [2, 2, 2, 2]
    s = JobStrategy(pipeline=4)
    assert [in_flight_microbatches(s, k) for k in range(4)] == [4, 3, 2, 1]  # 1F1B: p - stage
    assert [in_flight_microbatches(s.with_(microbatches=2), k) for k in range(4)] == [2, 2, 2, 1]
    assert in_flight_microbatches(s.with_(in_flight=7), 3) == 7


def test_pipeline_stage_parameters():
    c = GPT.with_(layers=4)
    first, last = estimate_job(c, JobStrategy(pipeline=2)).stages
    assert first.parameters == (9_216 + 2 * 49_984) * 4  # embedding + 2 layers
    assert last.parameters == (2 * 49_984 + 8_320) * 4   # 2 layers + final norm and head
    tied = c.with_(tied_embeddings=True)
    assert estimate_stage(tied, JobStrategy(pipeline=2), 1).parameters == last.parameters  # a copy of the table
    assert tied.total_params() == c.total_params() - 128 * 64


def test_megatron_activations_by_hand():
    # s=1024, b=2, h=512, a=8, t=4 -> Table 2 row 2 = 37,748,736 B per layer; 4 layers on 2 stages
    c = TransformerConfig(layers=4, hidden=512, heads=8, vocab=1000, seq_len=1024, micro_batch=2)
    first, last = estimate_job(c, JobStrategy(tensor=4, pipeline=2)).stages
    assert (first.in_flight, last.in_flight) == (2, 1)
    assert first.activations == 37_748_736 * 2 * 2
    # last stage: 2 layers x 1 micro-batch + fp32 logits 4 * s * b * v / t
    assert last.activations == 37_748_736 * 2 + 4 * 1024 * 2 * 1000 // 4
    # selective: row 4 = 16,777,216 per layer; full: 2sbh = 2,097,152 per layer
    sel = estimate_stage(c, JobStrategy(tensor=4, pipeline=2, recompute="selective"), 0)
    assert sel.activations == 16_777_216 * 4
    assert estimate_stage(c, JobStrategy(tensor=4, pipeline=2, recompute="full"), 0).activations == 2_097_152 * 4
    assert any("Table 2 row 4" in n for n in sel.notes)


def test_offload_tiers_by_hand():
    s = estimate_stage(GPT, JobStrategy(offload_params="host", offload_optimizer="disk"), 0)
    # the device keeps the largest piece (a layer, 49,984 parameters) and its gradients
    assert (s.parameters, s.gradients, s.optimizer_states) == (49_984 * 4, 49_984 * 4, 0)
    assert s.host == GPT_PARAMS * 4 * 2 and s.disk == GPT_PARAMS * 8


def test_inference_kv_cache_by_hand():
    llama = preset("llama2-7b").with_(micro_batch=2)
    s = estimate_stage(llama, JobStrategy(inference=True), 0)
    assert s.kv_cache == 2 * 32 * 2 * 4096 * 32 * 128 * 2 == 4_294_967_296
    assert (s.gradients, s.optimizer_states, s.in_flight) == (0, 0, 0)
    # tensor 8: an eighth of the heads per device
    assert estimate_stage(llama, JobStrategy(inference=True, tensor=8), 0).kv_cache == 4_294_967_296 // 8
    # grouped-query attention with more tensor ranks than kv heads: one kv head per device
    gqa = llama.with_(kv_heads=4)
    assert estimate_stage(gqa, JobStrategy(inference=True, tensor=8), 0).kv_cache == 4_294_967_296 // 32


def test_design_figures_are_the_kv_cache_of_a_7b_model():
    """The design's "4.3 GB at 4K -> 137.3 GB at 128K" (shared/seed, section 1) is exactly 1 MiB per
    token: the fp16 KV cache of a Llama-2-7B-shaped model (32 layers, hidden 4096, 32 kv heads) for
    2 sequences: 4.29 GB at 4096 tokens, 137.44 GB at 131072 (decimal GB; the design's 137.3 is
    4.29 x 32). Training activations cannot give the pair: Table 2's s^2 term makes 128K/4K far
    more than 32x, and the parameters do not grow with the sequence."""
    llama = preset("llama2-7b").with_(micro_batch=2)
    short, long = (estimate_stage(llama.with_(seq_len=s), JobStrategy(inference=True), 0) for s in (4096, 131072))
    assert round(short.kv_cache / 1e9, 1) == 4.3
    assert abs(long.kv_cache / 1e9 - 137.3) / 137.3 < 0.002
    assert round(short.kv_cache / 1e9, 2) * 32 == pytest.approx(137.28)
    train = [estimate_stage(llama.with_(seq_len=s, micro_batch=1), JobStrategy(), 0) for s in (4096, 131072)]
    assert train[1].activations / train[0].activations > 100
    assert short.total / 1e9 > 4.3 * 3  # with the 13.5 GB of fp16 parameters the totals are far off


def test_fits_and_largest_fitting():
    c = preset("llama2-7b")
    st = JobStrategy(data=8, tensor=4, zero_stage=1, recompute="selective")
    budget = 64 * 2**30
    assert estimate_job(c, st, budget).fits is True
    assert estimate_job(c, st, 2**30).fits is False
    assert estimate_job(c, st).fits is None
    for field in ("micro_batch", "seq_len"):
        n = largest_fitting(c, st, budget, field)
        assert estimate_job(c.with_(**{field: n}), st).peak.total <= budget
        assert estimate_job(c.with_(**{field: n + 1}), st).peak.total > budget
    assert largest_fitting(c, st, 2**30) == 0
    sp = st.with_(sequence_parallel=True)
    assert largest_fitting(c, sp, budget, "seq_len") % 4 == 0


def test_sequence_sweep_and_plot(tmp_path):
    c = preset("llama2-7b")
    sweep = sequence_sweep(c, JobStrategy(data=8, tensor=8, zero_stage=1, recompute="selective",
                                          sequence_parallel=True), device_memory=64 * 2**30)
    assert [e.config.seq_len for e in sweep] == [4096, 8192, 16384, 32768, 65536, 131072]
    totals = [e.peak.total for e in sweep]
    assert totals == sorted(totals) and sweep[0].fits and not sweep[-1].fits
    path = plot_sweep(sweep, str(tmp_path / "sweep.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="increasing sequence lengths"):
        sequence_sweep(c, JobStrategy(), [8192, 4096])


def test_report_text_and_dict():
    job = estimate_job(GPT, JobStrategy(data=2, pipeline=2), device_memory=1 << 20)
    text = str(job)
    assert "data 2 x tensor 1 x pipeline 2 = 4 devices" in text and "does NOT fit" in text
    d = job.to_dict()
    assert d["total_params"] == GPT_PARAMS and len(d["stages"]) == 2 and d["fits"] is False
    assert d["stages"][0]["total"] == job.stages[0].total


@pytest.mark.parametrize("make, match", [
    (lambda: TransformerConfig(layers=2, hidden=64, heads=3, vocab=10, seq_len=8), "hidden=64 must divide by heads=3"),
    (lambda: TransformerConfig(layers=0, hidden=64, heads=4, vocab=10, seq_len=8), "layers=0: expected an int >= 1"),
    (lambda: GPT.with_(dtype_bytes=3), "dtype_bytes=3: expected one of 1, 2, 4, 8"),
    (lambda: GPT.with_(norm="batch"), "norm='batch': expected one of 'layernorm', 'rmsnorm'"),
    (lambda: JobStrategy(zero_stage=4), "zero_stage=4: expected 0, 1, 2 or 3"),
    (lambda: JobStrategy(offload_params="nvme"), "offload_params='nvme': expected one of 'device', 'host', 'disk'"),
    (lambda: JobStrategy(data=4, expert=3), "expert=3: the expert-parallel size must divide data=4"),
    (lambda: JobStrategy(inference=True, recompute="full"), "recompute='full' has no meaning with inference=True"),
    (lambda: estimate_job(GPT, JobStrategy(tensor=3)), r"tensor=3: the attention heads \(4\)"),
    (lambda: estimate_job(GPT, JobStrategy(pipeline=3)), "pipeline=3: more stages than layers"),
    (lambda: estimate_job(GPT.with_(seq_len=15), JobStrategy(tensor=2, sequence_parallel=True)),
     "seq_len=15 must divide by tensor=2"),
    (lambda: estimate_job(GPT, JobStrategy(data=2, expert=2)), "expert=2: needs a MoE model"),
    (lambda: estimate_stage(GPT, JobStrategy(), 1), r"stage=1: expected an int in \[0, 0\]"),
    (lambda: estimate_job(GPT, JobStrategy(), device_memory=0), "device_memory=0: expected a byte count"),
    (lambda: estimate_job(GPT, JobStrategy(tensor=2, activation_model="simulation")),
     "activation_model='simulation' models the simulation's data-parallel runs.*tensor=2"),
    (lambda: estimate_job(GPT, JobStrategy(data=2, zero_stage=3, activation_model="simulation")),
     "does not cover zero_stage=3"),
    (lambda: estimate_job(preset("llama2-7b"), JobStrategy(activation_model="simulation")),
     "examples/models.py GPT, which has norm='layernorm'; got norm='rmsnorm'"),
])
def test_bad_input_is_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()
