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
    ms.set_seed(1)
    layer, shape, width = LAYERS[name]()
    net = Loss(layer, width)
    net.set_train(True)
    return net, Tensor(RNG.standard_normal(shape).astype(np.float32))


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
    ref_loss, ref_grads = ms.value_and_grad(reference, None, ref_opt.parameters)(x)
    ref_opt(ref_grads)

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

    np.testing.assert_allclose(loss.asnumpy(), ref_loss.asnumpy(), rtol=1e-5)
    scale = max(np.abs(g.asnumpy()).max() for g in ref_grads)
    for param, grad in zip(ref_opt.parameters, ref_grads):
        got = parallel.last_gradients[param.name]
        np.testing.assert_allclose(got, grad.asnumpy(), rtol=1e-5, atol=1e-5 * scale, err_msg=param.name)
    for (pname, ref_param), (_, param) in zip(reference.parameters_and_names(), net.parameters_and_names()):
        np.testing.assert_allclose(param.asnumpy(), ref_param.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=pname)
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
    ref_loss, ref_grads = ms.value_and_grad(reference, None, ref_opt.parameters)(ids)
    ref_opt(ref_grads)

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

    np.testing.assert_allclose(loss.asnumpy(), ref_loss.asnumpy(), rtol=1e-5)
    for param, grad in zip(ref_opt.parameters, ref_grads):
        np.testing.assert_allclose(parallel.last_gradients[param.name], grad.asnumpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=param.name)
    for (name, ref_param), (_, param) in zip(reference.parameters_and_names(), net.parameters_and_names()):
        np.testing.assert_allclose(param.asnumpy(), ref_param.asnumpy(), rtol=1e-5, atol=2e-6, err_msg=name)
    assert seen and all(tensor_map[0] == "tensor" for tensor_map in seen), seen
