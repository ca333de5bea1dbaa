"""Context parallelism in simulation: ring and Ulysses attention equal single-device MindSpore
(forward, gradients, 5 optimizer steps on every mesh) for the examples' GPT (causal), a
TransformerEncoderLayer classifier (padding mask) and converted models' scaled_dot_product_attention; no device forms
the [t, t] score matrix; the cp axis' traffic is reported; refusals name what is wrong."""
import sys

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, mint, nn, ops

import mindspore_hyper as mh
from mindspore_hyper.dtensor.context_parallel.ring_core import RingAttention
from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.migrate.generated_support import scaled_dot_product_attention
from mindspore_hyper.shard import Layout

from paths import EXAMPLES
from sim_checks import trains_like_single_device
from sim_models import Classifier

sys.path.insert(0, str(EXAMPLES))
from models import GPT  # noqa: E402  examples/models.py

SEQ, BATCH = 8, 2
MESHES = {
    "cp2": Layout((2,), ("cp",)),
    "cp4": Layout((4,), ("cp",)),
    "data2 x tensor2 x cp2": Layout((2, 2, 2), ("data", "tensor", "cp")),
}
CASES = [(method, mesh) for mesh in MESHES for method in ("ring", "ulysses")]
RNG = np.random.default_rng(0)


def _gpt():
    ms.set_seed(3)
    return GPT(vocab=16, hidden=8, heads=4, layers=1, seq=SEQ)


def _classifier():
    ms.set_seed(3)
    return Classifier()


def _gpt_inputs():
    ids = Tensor(RNG.integers(0, 16, (BATCH, SEQ)), ms.int32)
    return (ids,), (Tensor(RNG.integers(0, 16, (BATCH, SEQ)), ms.int32),)


def _classifier_inputs():
    x = Tensor(RNG.standard_normal((BATCH, SEQ, 16)).astype(np.float32))
    padding = np.zeros((BATCH, SEQ), bool)
    padding[0, 5:] = True  # sequence 0 has 5 tokens, sequence 1 all 8
    return (x, Tensor(padding)), (Tensor(np.array([0, 2]), ms.int32),)


def _strategy(mesh_name, method, model):
    mesh = MESHES[mesh_name]
    s = mesh(tensor_map=(), context_parallel="cp", context_method=method)
    if "tensor" in mesh.alias_names:  # Megatron-style splits of the projections and the MLP
        if model == "gpt":
            s.override("*.qkv.*", "tensor").override("*.fc1.*", "tensor")
            s.override("*.proj.weight", None, "tensor").override("*.fc2.weight", None, "tensor")
        else:
            s.override("encoder.dense1.*", "tensor").override("encoder.dense2.weight", None, "tensor")
    return s


def _cp_traffic(parallel, method):
    """Bytes per device the report shows for the cp axis' ring p2p (or AllToAll), forward and
    backward, and the report."""
    kind = "P2P" if method == "ring" else "AllToAll"
    report = parallel.report()
    forward = report.comm.get(kind, {}).get("cp", {}).get("bytes", 0)
    backward = report.comm_backward.get(kind, {}).get("cp", {}).get("bytes", 0)
    return forward, backward, report


@pytest.mark.parametrize("method, mesh_name", CASES)
def test_gpt_causal_trains_like_single_device(clean_context, method, mesh_name):
    inputs, labels = _gpt_inputs()
    parallel = trains_like_single_device(_gpt, inputs, labels, _strategy(mesh_name, method, "gpt"))
    forward, backward, _ = _cp_traffic(parallel, method)
    assert forward > 0 and backward > 0
    assert parallel.report().fallbacks == {}


@pytest.mark.parametrize("method, mesh_name", CASES)
def test_encoder_with_padding_trains_like_single_device(clean_context, method, mesh_name):
    inputs, labels = _classifier_inputs()
    parallel = trains_like_single_device(_classifier, inputs, labels, _strategy(mesh_name, method, "encoder"))
    forward, backward, _ = _cp_traffic(parallel, method)
    assert forward > 0 and backward > 0


class BiasedAttentionLM(nn.Cell):
    """Causal self-attention with a learned additive position bias [1, heads, t, t] (a
    T5/ALiBi-like parameter added to the scores beside the constant causal mask)."""

    def __init__(self, vocab=16, hidden=8, heads=2):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.embed = nn.Embedding(vocab, hidden)
        self.qkv = nn.Dense(hidden, 3 * hidden)
        bias = np.random.default_rng(7).standard_normal((1, heads, SEQ, SEQ)).astype(np.float32)
        self.position_bias = ms.Parameter(Tensor(bias), name="position_bias")
        self.causal = Tensor(np.triu(np.full((SEQ, SEQ), -1e9, np.float32), 1))
        self.head = nn.Dense(hidden, vocab)
        self.loss = nn.CrossEntropyLoss()

    def construct(self, ids, labels=None):
        x = self.embed(ids)
        b, t, _ = x.shape
        q, k, v = (y.reshape(b, t, self.heads, self.head_dim).transpose(0, 2, 1, 3)
                   for y in mint.split(self.qkv(x), x.shape[-1], -1))
        scores = ops.matmul(q, k.transpose(0, 1, 3, 2)) / (self.head_dim ** 0.5) + self.position_bias + self.causal
        out = ops.matmul(ops.softmax(scores, -1), v).transpose(0, 2, 1, 3).reshape(b, t, -1)
        logits = self.head(out)
        return logits if labels is None else self.loss(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


@pytest.mark.parametrize("mesh_name", ["cp2", "cp4"])
def test_a_learned_score_bias_gets_its_gradient_through_the_ring(clean_context, mesh_name):
    """The ring's hand-written backward gives an additive score bias computed from parameters its
    gradient (the bias parameter trains like on one device)."""
    def build():
        ms.set_seed(3)
        return BiasedAttentionLM()

    inputs, labels = _gpt_inputs()
    parallel = trains_like_single_device(build, inputs, labels, MESHES[mesh_name](
        tensor_map=(), context_parallel="cp", context_method="ring"))
    assert _cp_traffic(parallel, "ring")[0] > 0  # the attention ran as the ring


@pytest.mark.parametrize("method", ["ring", "ulysses"])
@pytest.mark.parametrize("causal", [True, False])
def test_converted_scaled_dot_product_attention(clean_context, method, causal):
    """The migrate helper (what converted models call): causal, or a boolean attention mask."""

    class Attention(nn.Cell):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Dense(16, 48)

        def construct(self, x, mask=None):
            b, t, _ = x.shape
            q, k, v = [y.reshape(b, t, 4, 4).transpose(0, 2, 1, 3) for y in mint.split(self.qkv(x), 16, -1)]
            return scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)

    ms.set_seed(0)
    model = Attention()
    x = Tensor(RNG.standard_normal((1, SEQ, 16)).astype(np.float32))
    mask = None if causal else Tensor(np.tril(np.ones((SEQ, SEQ), bool)) | (RNG.random((SEQ, SEQ)) > 0.5))
    params = model.trainable_params()
    ref, ref_grads = ms.value_and_grad(lambda a: (model(a, mask) ** 2).sum(), None, params)(x)
    mh.set_context(mode="simulation", device_num=4)
    parallel = mh.auto_parallelize(model, MESHES["cp4"](tensor_map=(), context_parallel="cp", context_method=method))
    out, grads = ms.value_and_grad(lambda a: (parallel(a, mask) ** 2).sum(), None, params)(x)
    assert float(out) == pytest.approx(float(ref), rel=1e-5)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(g.asnumpy(), r.asnumpy(), rtol=1e-5, atol=1e-5 * np.abs(r.asnumpy()).max())


@pytest.mark.parametrize("method", ["ring", "ulysses"])
def test_no_device_forms_the_score_matrix(clean_context, monkeypatch, method):
    """No DTensor made in a cp forward and backward holds [b, h, t, t] scores on a device: ring
    forms none with a whole [t, t] block, Ulysses 1/cp of the heads."""
    inputs, labels = _gpt_inputs()
    mh.set_context(mode="simulation", device_num=2)
    parallel = mh.auto_parallelize(_gpt(), _strategy("cp2", method, "gpt"))
    shapes = []
    create = DTensor._create

    def spy(layout, shards, global_shape, dtype, execution):
        made = create(layout, shards, global_shape, dtype, execution)
        shapes.append((made, layout.local_shape(global_shape)))
        return made

    monkeypatch.setattr(DTensor, "_create", staticmethod(spy))
    ms.value_and_grad(parallel, None, parallel.network.trainable_params())(*inputs, *labels)
    # deferred scores are placeholders (never computed: nothing but attention read them)
    shapes = [shape for made, shape in shapes if getattr(made, "_attention", None) is None]
    scores = [s for s in shapes if len(s) == 4 and s[-2:] == (SEQ, SEQ)]
    if method == "ring":
        assert shapes and not scores
    else:
        assert scores and all(s == (BATCH, 2, SEQ, SEQ) for s in scores)  # 4 heads over cp=2


def test_causal_ring_uses_the_balanced_zigzag_order(clean_context, monkeypatch):
    """cp=4 cuts 8 chunks; each device computes 9 of the 36 causal blocks, forward and backward
    (contiguous chunks would give 1, 3, 5 and 7 pairs of blocks)."""
    inputs, labels = _gpt_inputs()
    rings = []
    made = RingAttention.__init__

    def spy(self, *args, **kwargs):
        made(self, *args, **kwargs)
        rings.append(self)

    monkeypatch.setattr(RingAttention, "__init__", spy)
    mh.set_context(mode="simulation", device_num=4)
    parallel = mh.auto_parallelize(_gpt(), _strategy("cp4", "ring", "gpt"))
    ms.value_and_grad(parallel, None, parallel.network.trainable_params())(*inputs, *labels)
    assert rings and all(r.computed == {"forward": [9] * 4, "backward": [9] * 4} for r in rings)


def test_ulysses_refuses_heads_that_do_not_divide(clean_context):
    mh.set_context(mode="simulation", device_num=8)
    mesh = Layout((8,), ("cp",))
    parallel = mh.auto_parallelize(_gpt(), mesh(tensor_map=(), context_parallel="cp", context_method="ulysses"))
    with pytest.raises(Exception) as info:
        parallel(*_gpt_inputs()[0])
    text = str(info.value)
    assert "ulysses" in text and "size 4" in text and "divide by 8" in text and "'cp'" in text


def test_multihead_attention_refuses_need_weights(clean_context):
    ms.set_seed(0)
    attention = nn.MultiheadAttention(16, 4, batch_first=True)
    x = Tensor(RNG.standard_normal((1, SEQ, 16)).astype(np.float32))

    class SelfAttention(nn.Cell):
        def __init__(self):
            super().__init__()
            self.attention = attention

        def construct(self, x):
            return self.attention(x, x, x)[0]

    mh.set_context(mode="simulation", device_num=2)
    parallel = mh.auto_parallelize(SelfAttention(), MESHES["cp2"](tensor_map=(), context_parallel="cp"))
    with pytest.raises(ValueError, match="need_weights=True"):
        parallel(x)


def test_deferred_scores_read_by_other_ops_compute_as_usual(clean_context):
    """A batched matmul that is not attention (its result goes through exp) gives the same values."""

    class Products(nn.Cell):
        def construct(self, a, b):
            return mint.exp(mint.matmul(a, b) * 0.1).sum(-1)

    a = Tensor(RNG.standard_normal((1, 2, SEQ, 4)).astype(np.float32))
    b = Tensor(RNG.standard_normal((1, 2, 4, SEQ)).astype(np.float32))
    ref = Products()(a, b).asnumpy()
    mh.set_context(mode="simulation", device_num=2)
    parallel = mh.auto_parallelize(Products(), Layout((2,), ("cp",))(tensor_map=(), context_parallel="cp",
                                                                       input_map=(None, None, "cp")))
    np.testing.assert_allclose(parallel(a, b).asnumpy(), ref, rtol=1e-6)


def test_with_pipeline_stages_trains_like_single_device(clean_context):
    """pipeline 2 x cp 2 (1F1B, 2 microbatches), one step: each stage's ring attention runs across
    cp (Ulysses composes the same way: the stage strategy carries the declaration)."""
    method = "ring"
    reference, model = _gpt_layers(2), _gpt_layers(2)
    mh.set_context(mode="simulation", device_num=4)
    strategy = Layout((2, 2), ("pipeline", "cp"))(tensor_map=(), context_parallel="cp", context_method=method)
    parallel = mh.auto_parallelize(model, strategy, pipeline={"schedule": "1f1b", "microbatches": 2})
    inputs, labels = _gpt_inputs()
    optimizer = nn.Momentum(parallel.optimizer_parameters(), 0.05, 0.9)
    ref_opt = nn.Momentum(reference.trainable_params(), 0.05, 0.9)
    loss = float(parallel.train_step(optimizer, *inputs, *labels))
    ref_loss, grads = ms.value_and_grad(reference, None, ref_opt.parameters)(*inputs, *labels)
    ref_opt(grads)
    assert loss == pytest.approx(float(ref_loss), rel=1e-5)
    for (name, ref_param), (_, param) in zip(reference.parameters_and_names(), model.parameters_and_names()):
        np.testing.assert_allclose(param.asnumpy(), ref_param.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    assert {"cp@stage0", "cp@stage1"} <= set(parallel.report().comm["P2P"])


def _gpt_layers(layers):
    ms.set_seed(3)
    return GPT(vocab=16, hidden=8, heads=4, layers=layers, seq=SEQ)
