"""parallelize_module with the tensor-parallel styles, on MindSpore's own layers, trained
against a single-device copy of the same model."""
import sys

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, mint, nn, ops

from mindspore_hyper.hyper_parallel import (
    ColwiseParallel, DTensor, NoParallel, PrepareModuleInput, PrepareModuleOutput, Replicate, RowwiseParallel,
    SequenceParallel, Shard, init_device_mesh, laid_out_parameters, parallelize_module,
)
from mindspore_hyper.hyper_parallel.report import session_report
from paths import EXAMPLES

# Two Adam steps move each weight by about lr = 1e-2; float32 rounding of sharded vs whole
# reductions of <= 64 terms moves it by ~1e-6 relative. A wrong or missing gradient sum is O(lr).
ADAM_ATOL = 1e-5


def copy_weights(source, target):
    for (_, p), (_, q) in zip(source.parameters_and_names(), target.parameters_and_names()):
        q.set_data(Tensor(p.asnumpy()))


def train(model, loss_fn, batches, steps=3):
    optimizer = nn.Adam(model.trainable_params(), learning_rate=1e-2)
    grad_fn = ms.value_and_grad(loss_fn, None, optimizer.parameters)
    losses = []
    for step in range(steps):
        loss, grads = grad_fn(*batches[step % len(batches)])
        optimizer(grads)
        losses.append(float(loss))
    return losses


class Mlp(nn.Cell):
    def __init__(self, linear=nn.Dense):
        super().__init__()
        self.up, self.down = linear(8, 16), linear(16, 8)

    def construct(self, x):
        return self.down(ops.gelu(self.up(x)))


@pytest.mark.parametrize("linear", [nn.Dense, mint.nn.Linear], ids=["nn.Dense", "mint.nn.Linear"])
def test_colwise_rowwise_mlp_trains_like_one_device(fresh_session, linear):
    fresh_session.set_context(device_num=4)
    ms.set_seed(1)
    model, reference = Mlp(linear), Mlp(linear)
    copy_weights(model, reference)
    mesh = init_device_mesh("npu", (4,), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    placements = {k: v.placements for k, v in laid_out_parameters(model).items()}
    assert placements == {"up.weight": (Shard(0),), "up.bias": (Shard(0),), "down.weight": (Shard(1),),
                          "down.bias": (Replicate(),)}
    rng = np.random.RandomState(0)
    batches = [(Tensor(rng.randn(3, 8).astype(np.float32)), Tensor(rng.randn(3, 8).astype(np.float32)))]
    mse = lambda m: (lambda x, y: ((m(x) - y) ** 2).mean())  # noqa: E731
    np.testing.assert_allclose(train(model, mse(model), batches), train(reference, mse(reference), batches), rtol=1e-5)
    for (name, p), (_, q) in zip(model.parameters_and_names(), reference.parameters_and_names()):
        np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), atol=ADAM_ATOL, err_msg=name)
    # the report names the style that moved the bytes: RowwiseParallel's output (Partial -> Replicate)
    (mesh_report,) = [m for m in session_report("simulation", 4)["meshes"]  # models other tests left alive
                      if m["source"] == "HyperParallel API" and m["dim_names"] == ["tp"]]
    row = next(r for r in mesh_report["collectives"] if r["phase"] == "forward" and r["kind"] == "AllReduce")
    assert row["causes"] == {"RowwiseParallel output of down": 3}  # one per forward of the 3 steps


class UnevenMlp(nn.Cell):
    """Two Colwise/Rowwise pairs whose hidden features (6, 7) tp=4 does not divide: torch.chunk
    pieces 2, 2, 2, 0 (one device holds no feature) and 2, 2, 2, 1. `pre` is unsplit, so its
    gradient passes through the Colwise input's backward (including the empty piece's)."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Dense(5, 5)
        self.up1, self.down1 = nn.Dense(5, 6), nn.Dense(6, 5)
        self.up2, self.down2 = nn.Dense(5, 7), nn.Dense(7, 3)

    def construct(self, x):
        h = ops.tanh(self.pre(x))
        h = h + self.down1(ops.tanh(self.up1(h)))
        return self.down2(ops.tanh(self.up2(h)))


def test_colwise_rowwise_with_features_the_devices_do_not_divide_train_like_one_device(fresh_session):
    """Upstream's and torch's semantics: uneven torch.chunk pieces of the split features."""
    fresh_session.set_context(device_num=4)
    ms.set_seed(2)
    model, reference = UnevenMlp(), UnevenMlp()
    copy_weights(model, reference)
    mesh = init_device_mesh("npu", (4,), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, {"up1": ColwiseParallel(), "down1": RowwiseParallel(),
                                     "up2": ColwiseParallel(), "down2": RowwiseParallel()})
    pieces = {name: [tuple(dt.local_shard(r).shape) for r in range(4)]
              for name, dt in laid_out_parameters(model).items() if name in ("up1.weight", "down2.weight")}
    assert pieces == {"up1.weight": [(2, 5), (2, 5), (2, 5), (0, 5)], "down2.weight": [(3, 2), (3, 2), (3, 2), (3, 1)]}
    rng = np.random.RandomState(1)
    x, y = (Tensor(rng.randn(3, n).astype(np.float32)) for n in (5, 3))
    # forward: the same float32 products, the 4 devices' partial sums added in another order
    # (<= 7 terms of O(1): ~1e-6 relative)
    np.testing.assert_allclose(model(x).asnumpy(), reference(x).asnumpy(), rtol=1e-5, atol=1e-6)
    mse = lambda m: (lambda x, y: ((m(x) - y) ** 2).mean())  # noqa: E731
    grads = ms.grad(mse(model), None, model.trainable_params())(x, y)
    expected = ms.grad(mse(reference), None, reference.trainable_params())(x, y)
    for p, g, e in zip(model.trainable_params(), grads, expected):
        np.testing.assert_allclose(g.asnumpy(), e.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=p.name)
    np.testing.assert_allclose(train(model, mse(model), [(x, y)]), train(reference, mse(reference), [(x, y)]),
                               rtol=1e-5)
    for (name, p), (_, q) in zip(model.parameters_and_names(), reference.parameters_and_names()):
        np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), atol=ADAM_ATOL, err_msg=name)


def test_the_examples_llama_trains_like_one_device_on_a_2x2_mesh_slice(fresh_session):
    """The example's model (attention on each device's heads, vocabulary-parallel embedding, a
    replicated-output head) on the "tp" slice of a dp x tp mesh."""
    fresh_session.set_context(device_num=4)
    from mindspore_hyper.hyper_parallel import install_hyper_parallel

    install_hyper_parallel()
    sys.path.insert(0, str(EXAMPLES))
    try:
        import hyper_parallel_llama as example
    finally:
        sys.path.remove(str(EXAMPLES))
    ms.set_seed(0)
    model, reference = example.Llama(tp=2, layers=1), example.Llama(tp=1, layers=1)
    copy_weights(model, reference)
    mesh = init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], example.PLAN)
    rng = np.random.RandomState(2)
    batches = [(Tensor(rng.randint(0, 64, (2, 8)).astype(np.int32)), Tensor(rng.randint(0, 64, (2, 8)).astype(np.int32)))
               for _ in range(2)]
    np.testing.assert_allclose(example.train(model, batches, 1e-2), example.train(reference, batches, 1e-2), rtol=1e-5)


def test_colwise_embedding_and_sequence_parallel_norm(fresh_session):
    fresh_session.set_context(device_num=2)
    ms.set_seed(2)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embed, self.norm = nn.Embedding(10, 8), nn.LayerNorm((8,))

        def construct(self, ids):
            return self.norm(self.embed(ids))

    model, reference = Net(), Net()
    copy_weights(model, reference)
    mesh = init_device_mesh("npu", (2,), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, {"embed": ColwiseParallel(output_layouts=Shard(1)), "norm": SequenceParallel()})
    ids = Tensor(np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32))
    out = model(ids)
    assert isinstance(out, DTensor) and out.placements == (Shard(1),)  # the sequence stays split
    np.testing.assert_allclose(out.full_tensor().asnumpy(), reference(ids).asnumpy(), rtol=1e-6, atol=1e-6)


def test_prepare_module_input_output_and_no_parallel(fresh_session):
    fresh_session.set_context(device_num=2)
    mesh = init_device_mesh("npu", (2,), mesh_dim_names=("tp",))
    seen = {}

    class Probe(nn.Cell):
        def construct(self, x):
            seen["input"] = x
            return x * 2.0

    probe = parallelize_module(Probe(), mesh, PrepareModuleInput(input_layouts=(Shard(0),),
                                                                 desired_input_layouts=(Replicate(),)))
    x = Tensor(np.arange(6, dtype=np.float32).reshape(3, 2))
    out = probe(x)
    assert seen["input"].placements == (Replicate(),) and out.shape == (6, 2)  # two ranks' (3, 2) shards
    np.testing.assert_array_equal(out.full_tensor().asnumpy(), np.concatenate([x.asnumpy()] * 2) * 2)
    exit_probe = parallelize_module(Probe(), mesh, PrepareModuleOutput(output_layouts=(Shard(0),),
                                                                       desired_output_layouts=(Replicate(),)))
    np.testing.assert_array_equal(exit_probe(x).asnumpy(), np.concatenate([x.asnumpy()] * 2) * 2)
    dense = nn.Dense(2, 3)
    expected = dense(x).asnumpy()
    parallelize_module(dense, mesh, NoParallel())
    assert {k: v.placements for k, v in laid_out_parameters(dense).items()} == {"weight": (Replicate(),),
                                                                                   "bias": (Replicate(),)}
    np.testing.assert_allclose(dense(x).asnumpy(), expected, rtol=1e-6)


def test_plans_that_cannot_apply_are_refused_with_the_fix(fresh_session):
    fresh_session.set_context(device_num=4)
    mesh = init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "tp"))
    with pytest.raises(ValueError, match="1-D mesh.*mesh\\['tp'\\]"):
        parallelize_module(Mlp(), mesh, {"up": ColwiseParallel()})
    with pytest.raises(ValueError, match="'upp' matches no submodule of Mlp; nearest names: \\['up'"):
        parallelize_module(Mlp(), mesh["tp"], {"upp": ColwiseParallel()})
    with pytest.raises(ValueError, match="LayerNorm: tensor-parallel styles split nn.Dense"):
        parallelize_module(nn.LayerNorm((8,)), mesh["tp"], ColwiseParallel())
    # a Linear's features the devices do not divide split as torch.chunk (test below); an Embedding's
    # vocabulary cannot: its lookup needs equal pieces, refused when it runs
    embedding = parallelize_module(nn.Embedding(5, 4), mesh["tp"], RowwiseParallel())
    with pytest.raises(RuntimeError, match="Gather.*dimension 0 of shape \\(5, 4\\) has size 5, not divisible by 2"):
        embedding(Tensor(np.array([[0, 4]], np.int32)))
