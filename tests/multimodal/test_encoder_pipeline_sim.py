"""AsyncEncoderPipeline in simulation: per-request identity, completion order, back-pressure,
overlap, training numerics equal to the synchronous single-process model."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mindspore_hyper.multimodal import AsyncEncoderPipeline, Batch, FeatureCache, signature_dim
from mm_models import direct_outputs, loss_fn, make_batches, make_models


def unit_costs(encode=1.0, lm=1.0, backward=0.5, slow=None):
    """A cost model: `slow` maps batch_id -> encode seconds."""
    def cost(kind, batch, rows):
        if kind == "encode":
            return (slow or {}).get(batch.batch_id, encode)
        return lm if kind == "lm" else backward
    return cost


@pytest.mark.parametrize("ahead, num_encoders", [(0, 1), (1, 1), (2, 2), (1, 3)])
def test_outputs_per_request_equal_the_direct_model(ahead, num_encoders):
    encoder, lm = make_models()
    batches = make_batches(5)
    pipe = AsyncEncoderPipeline(encoder, lm, ahead=ahead, num_encoders=num_encoders, mode="simulation")
    result = pipe.infer(batches)
    assert sorted(result.outputs) == list(range(10))
    for b in batches:
        expected = direct_outputs(encoder, lm, b)
        for i, rid in enumerate(b.request_ids):
            np.testing.assert_allclose(result.outputs[rid], expected[i], rtol=1e-5, atol=1e-6)
    assert result.reused_from == {} and result.cache_stats is None


def test_shuffled_completion_keeps_identity_and_stragglers_do_not_stall():
    encoder, lm = make_models()
    batches = make_batches(6)
    # batch 0 (encoder 0) is a straggler: encoder 1's batches finish first and are consumed first
    pipe = AsyncEncoderPipeline(encoder, lm, ahead=2, num_encoders=2, mode="simulation",
                                cost_model=unit_costs(encode=1.0, lm=0.5, slow={0: 5.0, 3: 0.2}))
    result = pipe.infer(batches)
    t = result.timeline
    order = t.consume_order()
    assert order != sorted(order) and sorted(order) == list(range(6))
    assert order[:2] == [1, 3]  # ready work of encoder 1 runs while batch 0 is still encoding
    lm_start = {e.args["batch"]: e.start for e in t.of("lm", "lm")}
    encode_end = {e.args["batch"]: e.end for e in t.of(kind="encode")}
    assert lm_start[1] < encode_end[0]
    # the LM takes batches in encode-completion order (whenever it is free)
    for a, b in zip(order, order[1:]):
        assert encode_end[a] <= encode_end[b] or lm_start[b] >= encode_end[b] > lm_start[a]
    for b in batches:
        expected = direct_outputs(encoder, lm, b)
        for i, rid in enumerate(b.request_ids):
            np.testing.assert_allclose(result.outputs[rid], expected[i], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ahead", [1, 2, 3])
def test_back_pressure_bounds_batches_ahead(ahead):
    encoder, lm = make_models()
    batches = make_batches(7)
    pipe = AsyncEncoderPipeline(encoder, lm, ahead=ahead, mode="simulation",
                                cost_model=unit_costs(encode=1.0, lm=3.0))
    t = pipe.infer(batches).timeline
    enc_start = {e.args["batch"]: e.start for e in t.of("encoder0", "encode")}
    lm_start = {e.args["batch"]: e.start for e in t.of("lm", "lm")}
    for k in range(ahead, 7):
        # the encoder starts batch k only once the LM took batch k - ahead ...
        assert enc_start[k] >= lm_start[k - ahead]
    # ... and it does start it then (a slow LM is what limits the encoder)
    assert any(enc_start[k] == lm_start[k - ahead] for k in range(ahead, 7))
    points = sorted(set(enc_start.values()) | set(lm_start.values()))
    for p in points:  # batches encoded or encoding but not yet taken by the LM
        waiting = sum(1 for k in range(7) if enc_start[k] <= p and lm_start[k] > p)
        assert waiting <= ahead


def test_timeline_overlap_and_makespan_sync_vs_async():
    encoder, lm = make_models()
    batches = make_batches(4)
    sync = AsyncEncoderPipeline(encoder, lm, ahead=0, mode="simulation", cost_model=unit_costs()).infer(batches)
    fast = AsyncEncoderPipeline(encoder, lm, ahead=1, mode="simulation", cost_model=unit_costs()).infer(batches)
    assert sync.timeline.makespan == pytest.approx(8.0) and sync.timeline.overlap("encoder0", "lm") == 0.0
    assert fast.timeline.makespan == pytest.approx(5.0)
    assert fast.timeline.overlap("encoder0", "lm") == pytest.approx(3.0)
    s = fast.timeline.summary()
    assert s["requests"] == 8 and s["throughput"] == pytest.approx(8 / 5.0)
    assert s["latency_mean"] == pytest.approx(np.mean([2, 3, 4, 5]))


def test_arrivals_delay_encoding_and_latency_counts_from_arrival(tmp_path):
    encoder, lm = make_models()
    batches = [Batch(b.batch_id, b.request_ids, b.images, b.text, None, arrival=2.0 * b.batch_id)
               for b in make_batches(3, labels=False)]
    t = AsyncEncoderPipeline(encoder, lm, ahead=1, mode="simulation", cost_model=unit_costs()).infer(batches).timeline
    assert [e.start for e in t.of("encoder0", "encode")] == [0.0, 2.0, 4.0]
    assert t.latencies() == {0: 2.0, 1: 2.0, 2: 2.0}
    path = tmp_path / "trace.json"
    t.to_chrome_trace(str(path))
    import json
    names = {e["name"] for e in json.loads(path.read_text())["traceEvents"]}
    assert {"encode b0", "lm b2"} <= names


def test_cache_reuses_features_of_repeated_images():
    encoder, lm = make_models()
    batches = make_batches(4, duplicates_of={2: 0, 3: 1})
    cache = FeatureCache(signature_dim(16), threshold=0.98)
    result = AsyncEncoderPipeline(encoder, lm, ahead=1, cache=cache, mode="simulation",
                                  cost_model=lambda kind, batch, rows: float(rows)).infer(batches)
    assert result.reused_from == {4: 0, 5: 1, 6: 2, 7: 3}
    # the cost model sees the images really encoded: none for the repeated batches
    assert [e.duration for e in result.timeline.of("encoder0", "encode")] == [2.0, 2.0, 0.0, 0.0]
    assert result.cache_stats["hits"] == 4 and result.cache_stats["misses"] == 4
    for b in batches:
        expected = direct_outputs(encoder, lm, b)
        for i, rid in enumerate(b.request_ids):
            np.testing.assert_allclose(result.outputs[rid], expected[i], rtol=1e-5, atol=1e-6)


def _sync_grads(encoder, lm, batches):
    params = encoder.trainable_params() + lm.trainable_params()

    def total(*_):
        loss = 0.0
        for b in batches:
            logits = lm(encoder(ms.Tensor(b.images)), ms.Tensor(b.text))
            loss = loss + loss_fn(logits, ms.Tensor(b.labels))
        return loss

    loss, grads = ms.value_and_grad(total, grad_position=None, weights=params)()
    return float(loss.asnumpy()), [g.asnumpy() for g in grads]


def test_training_gradients_and_steps_equal_the_synchronous_model():
    batches = make_batches(5, seed=1)
    encoder, lm = make_models(seed=3)
    ref_encoder, ref_lm = make_models(seed=3)
    pipe = AsyncEncoderPipeline(encoder, lm, ahead=2, num_encoders=2, mode="simulation",
                                cost_model=unit_costs(slow={0: 4.0}))
    opt = nn.SGD(pipe.parameters(), learning_rate=0.1)
    ref_params = ref_encoder.trainable_params() + ref_lm.trainable_params()
    ref_opt = nn.SGD(ref_params, learning_rate=0.1)
    for step in range(3):
        result = pipe.train_step(batches, loss_fn)
        assert result.timeline.consume_order() != sorted(result.timeline.consume_order())
        ref_loss, ref_grads = _sync_grads(ref_encoder, ref_lm, batches)
        assert result.loss == pytest.approx(ref_loss, rel=1e-5)
        assert len(result.grads) == len(ref_grads)
        for g, r in zip(result.grads, ref_grads):
            np.testing.assert_allclose(g.asnumpy(), r, rtol=1e-4, atol=1e-6)
        opt(result.grads)
        ref_opt(tuple(ms.Tensor(g) for g in ref_grads))
    for p, r in zip(pipe.parameters(), ref_params):
        np.testing.assert_allclose(p.asnumpy(), r.asnumpy(), rtol=1e-4, atol=1e-6)
    backward = result.timeline.of(kind="encoder_backward")
    assert len(backward) == 5


def test_bad_arguments():
    encoder, lm = make_models()
    with pytest.raises(ValueError, match="ahead"):
        AsyncEncoderPipeline(encoder, lm, ahead=-1, mode="simulation")
    with pytest.raises(ValueError, match="num_encoders"):
        AsyncEncoderPipeline(encoder, lm, num_encoders=0, mode="simulation")
    with pytest.raises(ValueError, match="mode"):
        AsyncEncoderPipeline(encoder, lm, mode="native")
    with pytest.raises(ValueError, match="cache"):
        AsyncEncoderPipeline(encoder, lm, cache=object(), mode="simulation")
    with pytest.raises(ValueError, match="cost_model"):
        AsyncEncoderPipeline(encoder, lm, mode="simulation", cost_model=3)
    with pytest.raises(ValueError, match="encoder_ranks"):
        AsyncEncoderPipeline(encoder, lm, mode="simulation", encoder_ranks=[0])
    cached = AsyncEncoderPipeline(encoder, lm, cache=FeatureCache(signature_dim(16)), mode="simulation")
    with pytest.raises(ValueError, match="cache: training"):
        cached.train_step(make_batches(1), loss_fn)
    pipe = AsyncEncoderPipeline(encoder, lm, mode="simulation")
    with pytest.raises(ValueError, match="labels"):
        pipe.train_step(make_batches(1, labels=False), loss_fn)
    with pytest.raises(ValueError, match="batch_id 0 appears twice"):
        pipe.infer(make_batches(1) * 2)
    b = make_batches(2)
    with pytest.raises(ValueError, match="request id 0 appears in two batches"):
        pipe.infer([b[0], Batch(1, b[0].request_ids, b[1].images, b[1].text)])
    with pytest.raises(ValueError, match="batches: expected at least one"):
        pipe.infer([])
    with pytest.raises(ValueError, match=r"images must be a \(B=2"):
        Batch(0, (0, 1), b[0].images[:1], b[0].text)
    with pytest.raises(ValueError, match="duplicates"):
        Batch(0, (0, 0), b[0].images, b[0].text)


def test_timeline_plot_writes_a_png(tmp_path):
    encoder, lm = make_models()
    t = AsyncEncoderPipeline(encoder, lm, ahead=1, mode="simulation", cost_model=unit_costs()).infer(
        make_batches(3)).timeline
    path = tmp_path / "gantt.png"
    t.plot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_custom_signature_function_is_used_by_the_cache():
    from mindspore_hyper.multimodal import image_signature

    encoder, lm = make_models()
    calls = []

    def small_signature(image):
        calls.append(image.shape)
        return image_signature(image, size=8)

    cache = FeatureCache(signature_dim(8), threshold=0.98)
    result = AsyncEncoderPipeline(encoder, lm, cache=cache, signature=small_signature, mode="simulation").infer(
        make_batches(2, duplicates_of={1: 0}))
    assert len(calls) == 4 and result.reused_from == {2: 0, 3: 1}
