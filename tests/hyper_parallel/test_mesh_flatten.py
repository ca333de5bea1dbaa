"""DeviceMesh._unflatten / _flatten (torch's private methods, which MindFormers 2.0's
ParallelDims.build_mesh calls) against the meshes torch's own DeviceMesh gives each rank."""
from contextlib import contextmanager

import numpy as np
import pytest
from mindspore import Tensor

from mindspore_hyper.hyper_parallel import Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from mindspore_hyper.hyper_parallel import rank_threads

WORLD = 8


@contextmanager
def as_rank(rank: int):
    """Ask rank questions as `rank` (what one thread of a per-rank simulation does)."""
    rank_threads._LOCAL.rank = rank
    try:
        yield
    finally:
        del rank_threads._LOCAL.rank


def build_meshes(init):
    """MindFormers' build_mesh at pp=2, batch=2, cp=1, tp=2 (dp_replicate=1, fsdp=2, ep=2), plus
    reshapings of 2-D and 3-D meshes: {label: mesh}. `init` is torch's or this package's
    init_device_mesh."""
    world = init("cpu", (WORLD,), mesh_dim_names=("world",))
    loading = world._unflatten(0, (2, 2, 1, 2), ("pp", "batch", "cp", "tp"),
                               backend_override={"cp": "fake", "batch": "fake"})
    loss = loading["batch", "cp"]._flatten("loss_mesh")
    dense = world._unflatten(0, (2, 1, 2, 2), ("pp", "dp_replicate", "fsdp", "tp"))
    sparse = world._unflatten(0, (2, 1, 2, 2), ("pp", "dp_replicate", "efsdp", "ep"))
    grid = init("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
    meshes = {
        "loading": loading, "loading[tp]": loading["tp"], "loss": loss, "world[loss_mesh]": world["loss_mesh"],
        "dense[fsdp]": dense["fsdp"], "dense[dp_replicate,fsdp]": dense["dp_replicate", "fsdp"],
        "sparse[efsdp,ep]": sparse["efsdp", "ep"],
        "grid[dp,tp] flattened": grid["dp", "tp"]._flatten(),
        "grid flattened": grid._flatten("all"),
        "grid[cp] unflattened": grid["cp"]._unflatten(0, (1, 2), ("c1", "c2")),
        "grid tp unflattened": grid._unflatten("tp", (2, 1), ("t1", "t2")),
        "grid[dp,tp] flattened, unflattened": grid["dp", "tp"]._flatten("dt")._unflatten(0, (2, 2), ("d", "t")),
    }
    return meshes


def torch_view(rank: int):
    """Each mesh's ranks, dimension names, local rank and group as torch gives them to `rank`."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh as torch_init
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)
    try:
        out = {}
        for label, mesh in build_meshes(torch_init).items():
            group = dist.get_process_group_ranks(mesh.get_group()) if mesh.ndim == 1 else None
            out[label] = (mesh.mesh.tolist(), tuple(mesh.mesh_dim_names), list(mesh.get_coordinate()), group)
        return out
    finally:
        dist.destroy_process_group()


def our_view(rank: int, meshes):
    with as_rank(rank):
        return {label: (mesh.mesh.tolist(), mesh.mesh_dim_names, mesh.get_coordinate(),
                        list(mesh.get_group().ranks) if mesh.ndim == 1 else None) for label, mesh in meshes.items()}


def test_meshes_equal_torch_s_on_every_rank(fresh_session):
    import warnings

    fresh_session.set_context(device_num=WORLD)
    meshes = build_meshes(init_device_mesh)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: slicing a flattened dim from the root will be deprecated
        for rank in range(WORLD):
            assert our_view(rank, meshes) == torch_view(rank), f"rank {rank}"


def test_flatten_is_registered_with_the_root_and_reused(fresh_session):
    fresh_session.set_context(device_num=WORLD)
    world = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("world",))
    loading = world._unflatten("world", (2, 4), ("pp", "batch"))
    loss = loading["batch"]._flatten("loss")
    assert loading["batch"]._flatten("loss") is loss and world["loss"] is loss
    assert loss.mesh_dim_names == ("loss",) and loss.size() == 4
    assert loading["batch"]._flatten("batch") == loading["batch"]  # a 1-D mesh keeps its own name
    np.testing.assert_array_equal(loading.mesh, np.arange(WORLD).reshape(2, 4))  # the whole mesh: no rank needed


def test_dtensors_on_reshaped_meshes_equal_numpy(fresh_session):
    fresh_session.set_context(device_num=WORLD)
    world = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("world",))
    loading = world._unflatten(0, (2, 2, 2), ("pp", "batch", "tp"))
    loss = loading["batch", "tp"]._flatten("loss")
    x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    on_loss = distribute_tensor(Tensor(x), loss, [Shard(0)])  # 4 row blocks of 2, replicated over "pp"
    assert on_loss.to_local().shape == (2, 3)
    np.testing.assert_array_equal((on_loss * 2).full_tensor().asnumpy(), x * 2)  # exact: integers in float32
    partial = distribute_tensor(Tensor(x), loading, [Replicate(), Shard(1), Replicate()]).redistribute(
        loading, [Replicate(), Replicate(), Partial("sum")])
    np.testing.assert_array_equal(partial.full_tensor().asnumpy(), x)  # a Partial's full value is its sum


@pytest.mark.parametrize("call, message", [
    (lambda w: w._unflatten(0, (3, 3), ("a", "b")), "product of mesh_sizes is 9, but dimension 0"),
    (lambda w: w._unflatten(0, (2, 4), ("a",)), "one non-empty string per mesh size"),
    (lambda w: w._unflatten("x", (2, 4), ("a", "b")), "dim 'x' is not in"),
    (lambda w: w._unflatten(1, (2, 4), ("a", "b")), r"dim must be a dimension index in \[0, 1\)"),
    (lambda w: w._unflatten(0, (2, 0, 4), ("a", "b", "c")), "mesh_sizes must be positive ints"),
    (lambda w: w._unflatten(0, (2, 4), ("a", "a")), r"name\(s\) \['a'\] would repeat"),
    (lambda w: w._unflatten(0, (2, 4), ("a", "b"), backend_override={"c": "fake"}), "backend_override key 'c'"),
    (lambda w: w._unflatten(0, (2, 4), ("a", "b"))._flatten("world"), "not already a dimension of the root mesh"),
    (lambda w: (w._unflatten(0, (2, 4), ("a", "b"))["a"]._flatten("f"),
                w._unflatten(0, (2, 4), ("a", "b"))["b"]._flatten("f")), "was made before on other devices"),
    (lambda w: (w._unflatten(0, (2, 4), ("a", "b"))["a"]._flatten("f"), w._unflatten(0, (2, 4), ("a", "b"))["f"]),
     "sliced from the mesh it was flattened from"),
])
def test_bad_reshapes_are_refused_with_the_field(fresh_session, call, message):
    fresh_session.set_context(device_num=WORLD)
    with pytest.raises((ValueError, KeyError), match=message):
        call(init_device_mesh("cpu", (WORLD,), mesh_dim_names=("world",)))
