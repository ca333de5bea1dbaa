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
    with pytest.raises(ValueError, match="not divisible by 2"):
        parallelize_module(nn.Dense(4, 3), mesh["tp"], ColwiseParallel())
