"""fully_shard (FSDP2 / HyperParallel): parameters, gradients and optimizer states split over
the data-parallel mesh, trained against a single-device copy of the same model."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindspore_hyper.hyper_parallel import (
    ColwiseParallel, Replicate, RowwiseParallel, Shard, distribute_tensor, init_device_mesh, laid_out_parameters,
    parallelize_module,
)
from mindspore_hyper.hyper_parallel.fully_shard import fully_shard

# Adam moves each weight by ~lr = 1e-2 per step; sharded vs whole float32 sums of <= 64 terms
# differ by ~1e-6 relative. A missing or doubled gradient sum moves weights by O(lr).
ADAM_ATOL = 1e-5


class Mlp(nn.Cell):
    def __init__(self):
        super().__init__()
        self.up, self.down, self.norm = nn.Dense(8, 16), nn.Dense(16, 8), nn.LayerNorm((8,))

    def construct(self, x):
        return self.norm(self.down(ops.gelu(self.up(x))))


def copy_weights(source, target):
    for (_, p), (_, q) in zip(source.parameters_and_names(), target.parameters_and_names()):
        q.set_data(Tensor(p.asnumpy()))


def train(model, make_input, y, steps=3):
    optimizer = nn.Adam(model.trainable_params(), learning_rate=1e-2)
    grad_fn = ms.value_and_grad(lambda x, y: ((model(make_input(x)) - y) ** 2).mean(), None, optimizer.parameters)
    losses = []
    x = Tensor(np.random.RandomState(0).randn(4, 8).astype(np.float32))
    for _ in range(steps):
        loss, grads = grad_fn(x, y)
        optimizer(grads)
        losses.append(float(loss.full_tensor() if hasattr(loss, "full_tensor") else loss))
    return losses


def check_same(model, reference):
    for (name, p), (_, q) in zip(model.parameters_and_names(), reference.parameters_and_names()):
        np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), atol=ADAM_ATOL, err_msg=name)


@pytest.mark.parametrize("global_batch", [False, True], ids=["plain-batch", "batch-split-over-dp"])
def test_fully_shard_trains_like_one_device(fresh_session, global_batch):
    fresh_session.set_context(device_num=4)
    ms.set_seed(0)
    model, reference = Mlp(), Mlp()
    copy_weights(model, reference)
    mesh = init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
    fully_shard(model.up, mesh=mesh)
    fully_shard(model, mesh=mesh)
    placements = {k: v.placements for k, v in laid_out_parameters(model).items()}
    assert placements["up.weight"] == (Shard(0),) and placements["down.bias"] == (Shard(0),)
    y = Tensor(np.random.RandomState(1).randn(4, 8).astype(np.float32))
    as_input = (lambda x: distribute_tensor(x, mesh, [Shard(0)])) if global_batch else (lambda x: x)
    np.testing.assert_allclose(train(model, as_input, y), train(reference, lambda x: x, y), rtol=1e-5)
    check_same(model, reference)


def test_tensor_parallel_then_fully_shard_on_a_2x2_mesh(fresh_session):
    """torch's order: tensor parallel on mesh["tp"], then fully_shard on mesh["dp"]; a batch split
    over "dp" flows as DTensors through the tensor-parallel layers (use_local_output=False)."""
    fresh_session.set_context(device_num=4)
    ms.set_seed(3)
    model, reference = Mlp(), Mlp()
    copy_weights(model, reference)
    mesh = init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(use_local_output=False),
                                           "down": RowwiseParallel(use_local_output=False)})
    fully_shard(model, mesh=mesh["dp"])
    placements = {k: v.placements for k, v in laid_out_parameters(model).items()}
    assert placements["up.weight"] == (Shard(0), Shard(0))  # dp and tp both split the rows
    assert placements["down.weight"] == (Shard(0), Shard(1)) and placements["norm.gamma"] == (Shard(0),)  # dp only
    y = Tensor(np.random.RandomState(1).randn(4, 8).astype(np.float32))
    as_input = lambda x: distribute_tensor(x, mesh, [Shard(0), Replicate()])  # noqa: E731
    np.testing.assert_allclose(train(model, as_input, y), train(reference, lambda x: x, y), rtol=1e-5)
    check_same(model, reference)


def test_fully_shard_refuses_what_it_cannot_do(fresh_session):
    fresh_session.set_context(device_num=4)
    mesh = init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
    with pytest.raises(ValueError, match="mp_policy must be a MixedPrecisionPolicy"):
        fully_shard(Mlp(), mesh=mesh, mp_policy=object())
    with pytest.raises(ValueError, match="reshard_after_forward=2"):
        fully_shard(Mlp(), mesh=mesh, reshard_after_forward=2)
    fully_shard(nn.Dense(3, 2), mesh=mesh)  # 2 rows over 4 devices: torch.chunk pieces (test_uneven_shards.py)
    model = Mlp()
    fully_shard(model, mesh=mesh)
    with pytest.raises(ValueError, match="already fully sharded"):
        fully_shard(model, mesh=mesh)


def test_distributed_checkpoint_of_a_sharded_model_loads_on_another_mesh(fresh_session, tmp_path):
    """Upstream's `distributed_checkpoint.save/load` of a state dict: saved from tensor 2 x FSDP 2,
    loaded into a plain single-device model and into tensor 4 (values equal the saved ones)."""
    from mindspore_hyper.hyper_parallel.checkpoint import load, save

    fresh_session.set_context(device_num=4)
    ms.set_seed(4)
    model = Mlp()
    mesh = init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    saved = {name: p.asnumpy() for name, p in model.parameters_and_names()}
    manifest = save({"model": model.parameters_dict()}, checkpoint_id=tmp_path / "ckpt")
    assert manifest.mesh.device_matrix == (2, 2) and manifest.mode == "simulation"
    up = manifest.parameters["model.up.weight"]
    assert len(up.shards) == 4 and [tuple(x) if isinstance(x, list) else x for x in up.tensor_map][0] == ("tp", "dp")
    plain = Mlp()
    load({"model": plain.parameters_dict()}, checkpoint_id=tmp_path / "ckpt")
    for name, p in plain.parameters_and_names():
        np.testing.assert_array_equal(p.asnumpy(), saved[name], err_msg=name)
    from mindspore_hyper.hyper_parallel.session import reset_session

    reset_session()
    other = Mlp()
    parallelize_module(other, init_device_mesh("npu", (4,), mesh_dim_names=("tp",)),
                       {"up": ColwiseParallel(), "down": RowwiseParallel()})
    load({"model": other.parameters_dict()}, checkpoint_id=tmp_path / "ckpt")
    for name, p in other.parameters_and_names():
        np.testing.assert_array_equal(p.asnumpy(), saved[name], err_msg=name)
    with pytest.raises(Exception, match="custom storage"):
        save({"model": other.parameters_dict()}, checkpoint_id=tmp_path / "x", planner=object())
    with pytest.raises(Exception, match="expected a Parameter or a dict of them"):
        save({"model": {"w": Tensor(np.ones(2, np.float32))}}, checkpoint_id=tmp_path / "x")


def test_a_model_built_without_initialised_weights_trains_like_an_ordinary_one(fresh_session):
    """MindSpore's no_init_parameters (and HyperParallel's init_empty_weights): laying the model
    out initialises it with the values an ordinary initialisation with the same seed gives."""
    from mindspore.nn.utils import no_init_parameters

    from mindspore_hyper.hyper_parallel import init_empty_weights, init_parameters

    fresh_session.set_context(device_num=4)
    ms.set_seed(6)
    reference = Mlp()
    for context in (no_init_parameters, init_empty_weights):
        ms.set_seed(6)
        with context():
            model = Mlp()
        assert model.up.weight.has_init  # nothing materialised yet
        mesh = init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(use_local_output=False),
                                               "down": RowwiseParallel(use_local_output=False)})
        fully_shard(model, mesh=mesh["dp"])
        init_parameters(model)
        for (name, p), (_, q) in zip(model.parameters_and_names(), reference.parameters_and_names()):
            np.testing.assert_array_equal(p.asnumpy(), q.asnumpy(), err_msg=name)
        from mindspore_hyper.hyper_parallel.session import reset_session

        reset_session()
    with pytest.raises(ValueError, match="stage_index"):
        init_parameters(Mlp(), stage_index=1)
