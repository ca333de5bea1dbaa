"""nn.GRU, nn.LSTM, Conv2d + BatchNorm2d (training, moving statistics) and
nn.TransformerEncoderLayer in simulation equal the single-device Cell: the loss, the gradients,
the parameters and buffers after one optimizer step, on a data-parallel mesh and on a 2x2 mesh
with some parameters split over "tensor"."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn

import mindspore_hyper as mh
from mindspore_hyper import Layout
from tolerances import (U32, adam_first_step_bound, assert_within, gradient_tolerance, momentum_first_step_bound,
                        reduction_length, training_rtol)

RNG = np.random.default_rng(3)
DATA = Layout((4,), ("data",))
GRID = Layout((2, 2), ("data", "tensor"))


class Loss(nn.Cell):
    """A fixed random projection of the layer's (first) output, summed: every output element
    gets a distinct gradient."""

    def __init__(self, layer, width):
        super().__init__()
        self.layer = layer
        self.weights = Tensor(np.random.default_rng(9).standard_normal((width,)).astype(np.float32))

    def construct(self, x):
        out = self.layer(x)
        out = out[0] if isinstance(out, tuple) else out
        return (out * self.weights[:out.shape[-1]]).sum()


def _gru():
    return nn.GRU(8, 16, num_layers=1, batch_first=True), (4, 5, 8), 16


def _lstm():
    return nn.LSTM(8, 16, num_layers=2, batch_first=True), (4, 5, 8), 16


def _conv_bn():
    return nn.SequentialCell([nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()]), (4, 3, 6, 6), 6


def _encoder_layer():
    return nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True), (4, 6, 16), 16


LAYERS = {"GRU": _gru, "LSTM": _lstm, "Conv2d+BatchNorm2d": _conv_bn, "TransformerEncoderLayer": _encoder_layer}

# parameter name pattern -> tensor map on the 2x2 mesh (the rest replicated)
SPLITS = {
    "GRU": {"*weight_ih*": ("tensor", None), "*weight_hh*": ("tensor", None)},
    "LSTM": {"*weight_ih_l0": ("tensor", None), "*bias_hh*": ("tensor",)},
    "Conv2d+BatchNorm2d": {"layer.0.weight": ("tensor", None, None, None), "layer.1.*": ("tensor",)},
    "TransformerEncoderLayer": {"*in_proj_weight": ("tensor", None), "*dense1.*": ("tensor",),
                                "*dense2.weight": (None, "tensor")},
}


def _build(name):
    """The layer under the loss, and its input: both fixed by seeds of their own, so a test's data
    does not depend on which tests ran before it in the process."""
    ms.set_seed(1)
    layer, shape, width = LAYERS[name]()
    net = Loss(layer, width)
    net.set_train(True)
    return net, Tensor(np.random.default_rng(3).standard_normal(shape).astype(np.float32))


def _scales(reference, x):
    """What the float32 bounds scale with, from the reference before its step (its buffers restored
    after the extra forward): the sum of |terms| of the loss, and for each buffer the size of what a
    training forward writes into it. BatchNorm writes 0.1 of the batch mean (a reduction of length
    N*H*W, its error bounded relative to mean|h|) and of the unbiased batch variance (relative to
    2 mean(h**2) * K / (K - 1)) per channel; 0.9 of the old value is exact to rounding."""
    buffers = [p for p in reference.get_parameters() if not p.requires_grad]
    saved = [p.asnumpy().copy() for p in buffers]
    out = reference.layer(x)
    out = (out[0] if isinstance(out, tuple) else out).asnumpy()
    loss_terms = float(np.abs(out * reference.weights.asnumpy()[:out.shape[-1]]).sum())
    scales = {}
    for cell_name, cell in reference.cells_and_names():
        if isinstance(cell, nn.BatchNorm2d):
            h = _batch_norm_input(reference, cell_name, x).astype(np.float64)
            k = h.size // h.shape[1]
            scales[cell.moving_mean.name] = 0.1 * np.abs(h).mean((0, 2, 3))
            scales[cell.moving_variance.name] = 0.1 * 2 * (h ** 2).mean((0, 2, 3)) * k / (k - 1)
    for p, value in zip(buffers, saved):
        p.set_data(Tensor(value))
    assert set(scales) == {p.name for p in buffers}, "a buffer this test does not know how to bound"
    return loss_terms, scales


def _batch_norm_input(reference, cell_name, x):
    """The input of the SequentialCell's BatchNorm: the cells before it applied to x."""
    cells = list(reference.layer.cells())
    index = int(cell_name.rsplit(".", 1)[1])
    for cell in cells[:index]:
        x = cell(x)
    return x.asnumpy()


def _optimizer(name, params):
    # The key bias of attention has an exact gradient of 0 (softmax is shift-invariant): Adam
    # would blow float noise up to full steps, so the encoder layer takes plain momentum SGD.
    if name == "TransformerEncoderLayer":
        return nn.Momentum(params, 0.05, 0.9)
    return nn.Adam(params, 1e-2)


@pytest.mark.parametrize("mesh_name", ["data-parallel", "2x2"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_trains_like_single_device(clean_context, name, mesh_name):
    reference, x = _build(name)
    ref_opt = _optimizer(name, reference.trainable_params())
    loss_terms, buffer_scales = _scales(reference, x)
    ref_loss, ref_grads = ms.value_and_grad(reference, None, ref_opt.parameters)(x)
    ref_grads = [g.asnumpy() for g in ref_grads]
    ref_opt(tuple(Tensor(g) for g in ref_grads))

    net, _ = _build(name)
    if mesh_name == "data-parallel":
        strategy = DATA(tensor_map=())
    else:
        strategy = GRID(tensor_map=())
        for pattern, tensor_map in SPLITS[name].items():
            strategy.override(pattern, *tensor_map)
    mh.set_context(mode="simulation", device_num=strategy.mesh.size)
    parallel = mh.auto_parallelize(net, strategy)
    optimizer = _optimizer(name, parallel.optimizer_parameters())
    loss = parallel.train_step(optimizer, x)

    # Tolerances from the computation (tests/tolerances.py), for the longest float32 reduction K of
    # the step. The loss is a signed sum: within the training bound of the sum of |terms|.
    reduction = reduction_length(ref_opt.parameters, np.prod(x.shape[:-1]))
    assert_within(loss.asnumpy(), ref_loss.asnumpy(), training_rtol(reduction, 1) * loss_terms, "loss")
    # Gradients: relative to the element and to the largest gradient (cancellation).
    grad_tols = gradient_tolerance(ref_grads, reduction)
    for param, grad, tol in zip(ref_opt.parameters, ref_grads, grad_tols):
        assert_within(parallel.last_gradients[param.name], grad, tol, param.name)
    # Parameters after one step: the gradient error just bounded, propagated exactly through the
    # optimizer's first update (Adam: a near-zero gradient may move by up to lr, a large one by
    # almost nothing; momentum SGD: lr times the gradient error).
    for param, grad, tol in zip(ref_opt.parameters, ref_grads, grad_tols):
        want = param.asnumpy()
        if isinstance(ref_opt, nn.Adam):
            bound = adam_first_step_bound(grad, tol, 1e-2, param=want)
        else:
            bound = momentum_first_step_bound(grad, tol, 0.05, param=want)
        assert_within(net.parameters_dict()[param.name].asnumpy(), want, bound, param.name)
    # Buffers written in the forward (BatchNorm's moving statistics): see _scales.
    got_buffers = {p.name: p.asnumpy() for p in net.get_parameters() if not p.requires_grad}
    assert got_buffers.keys() == buffer_scales.keys()
    for buffer in reference.get_parameters():
        if not buffer.requires_grad:
            want = buffer.asnumpy()
            bound = training_rtol(reduction, 1) * buffer_scales[buffer.name] + 2 * U32 * np.abs(want)
            assert_within(got_buffers[buffer.name], want, bound, buffer.name)
    assert parallel.report().fallbacks == {}


def test_batch_norm_moving_statistics_follow_their_split(clean_context):
    reference, x = _build("Conv2d+BatchNorm2d")
    reference(x)
    net, _ = _build("Conv2d+BatchNorm2d")
    strategy = GRID(tensor_map=()).override("layer.1.moving_*", "tensor")
    mh.set_context(mode="simulation", device_num=4)
    mh.auto_parallelize(net, strategy)(x)
    bn, ref_bn = net.layer[1], reference.layer[1]
    assert not np.allclose(ref_bn.moving_mean.asnumpy(), 0.0)  # one training forward moved them
    np.testing.assert_allclose(bn.moving_mean.asnumpy(), ref_bn.moving_mean.asnumpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(bn.moving_variance.asnumpy(), ref_bn.moving_variance.asnumpy(), rtol=1e-5)


def test_batch_norm_inference_keeps_the_batch_split(clean_context):
    reference, x = _build("Conv2d+BatchNorm2d")
    reference.set_train(False)
    expected = reference(x).asnumpy()
    net, _ = _build("Conv2d+BatchNorm2d")
    net.set_train(False)
    mh.set_context(mode="simulation", device_num=4)
    parallel = mh.auto_parallelize(net, DATA(tensor_map=()))
    np.testing.assert_allclose(parallel(x).asnumpy(), expected, rtol=1e-5)
    assert "AllGather" not in parallel.report().comm  # no gathers before the final sum


class RunningMean(nn.Cell):
    """Writes two buffers in its forward: a running mean (ops.assign) and a call count
    (ops.assign_add)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 8)
        self.running = ms.Parameter(Tensor(np.zeros(8, np.float32)), name="running", requires_grad=False)
        self.calls = ms.Parameter(Tensor(np.zeros(1, np.int32)), name="calls", requires_grad=False)

    def construct(self, x):
        y = self.fc(x)
        ms.ops.assign(self.running, self.running * 0.9 + y.mean(0) * 0.1)
        ms.ops.assign_add(self.calls, Tensor(np.ones(1, np.int32)))
        return y.sum()


def test_buffers_written_in_the_forward_are_written_back(clean_context):
    x = Tensor(RNG.standard_normal((4, 8)).astype(np.float32))
    ms.set_seed(2)
    reference = RunningMean()
    expected = [reference(x).asnumpy() for _ in range(2)]
    ms.set_seed(2)
    net = RunningMean()
    strategy = GRID(tensor_map=()).override("running", "tensor").override("fc.weight", "tensor", None)
    mh.set_context(mode="simulation", device_num=4)
    parallel = mh.auto_parallelize(net, strategy)
    got = [parallel(x).asnumpy() for _ in range(2)]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    np.testing.assert_allclose(net.running.asnumpy(), reference.running.asnumpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(net.calls.asnumpy(), [2])


class EmbedGRUHead(nn.Cell):
    """Embedding 50x16 -> GRU 16->16 (batch first) -> Dense, summed."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.gru = nn.GRU(16, 16, batch_first=True)
        self.head = nn.Dense(16, 4)

    def construct(self, ids):
        out, _ = self.gru(self.emb(ids))
        return (self.head(out) * Tensor(np.arange(1, 5, dtype=np.float32))).sum()


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "per-shard"])
def test_gru_with_every_weight_split_over_tensor_on_a_3d_mesh(clean_context, batched):
    """Regression: one pattern ("tensor", None) for every weight on a 2x2x2 mesh crashed the
    batched path (a GRU weight reaches its cell as a plain Tensor carrying the Parameter's
    param_info, a Ref that ops.stack refused beside plain shards); without batching the weight
    silently ran replicated instead of by its layout."""
    ids = Tensor(np.random.default_rng(0).integers(0, 50, (4, 5)).astype(np.int32))
    ms.set_seed(0)
    reference = EmbedGRUHead()
    ref_opt = nn.Adam(reference.trainable_params(), 1e-2)
    terms = reference.head(reference.gru(reference.emb(ids))[0]).asnumpy() * np.arange(1, 5)
    ref_loss, ref_grads = ms.value_and_grad(reference, None, ref_opt.parameters)(ids)
    ref_grads = [g.asnumpy() for g in ref_grads]
    ref_opt(tuple(Tensor(g) for g in ref_grads))

    ms.set_seed(0)
    net = EmbedGRUHead()
    mh.set_context(mode="simulation", device_num=8)
    strategy = Layout((2, 2, 2), ("data", "tensor", "pipeline"))(tensor_map=("tensor", None))
    parallel = mh.auto_parallelize(net, strategy)
    parallel.execution.batch_shards = batched
    seen = []  # the layouts the GRU cell's input-weight matmul ran on
    parallel.execution.observer = lambda call, decision: seen.extend(
        t.layout.tensor_map for t in call.tensors if call.name == "MatMul" and tuple(t.shape) == (48, 16))
    loss = parallel.train_step(nn.Adam(parallel.optimizer_parameters(), 1e-2), ids)

    # derived bounds as in test_layer_trains_like_single_device (the loss: a signed sum, relative to
    # the sum of |terms|)
    reduction = reduction_length(ref_opt.parameters, ids.size)
    assert_within(loss.asnumpy(), ref_loss.asnumpy(), training_rtol(reduction, 1) * np.abs(terms).sum(), "loss")
    grad_tols = gradient_tolerance(ref_grads, reduction)
    for param, grad, tol in zip(ref_opt.parameters, ref_grads, grad_tols):
        assert_within(parallel.last_gradients[param.name], grad, tol, param.name)
        want = param.asnumpy()
        bound = adam_first_step_bound(grad, tol, 1e-2, param=want)
        assert_within(net.parameters_dict()[param.name].asnumpy(), want, bound, param.name)
    assert seen and all(tensor_map[0] == "tensor" for tensor_map in seen), seen
