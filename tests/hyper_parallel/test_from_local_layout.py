"""Upstream's Layout call form in place of a mesh and placements: `DTensor.from_local(x, layout)`
and `redistribute(layout)` (upstream's redistribute test in its Layout form), against numpy and
against the same DTensor made from a DeviceMesh and placements; refusals name the field.

Tolerances: the values are moved, never computed (exact equality); the gradient is a sum of two
float32 products of O(1) values per element, so rtol 1e-6 is ~10 ulp."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from mindspore_hyper.hyper_parallel import (
    DTensor, Layout, Partial, Replicate, Shard, distribute_tensor, init_device_mesh,
)
from mindspore_hyper.shard.tensor_layout import TensorLayout

RNG = np.random.RandomState(0)


def test_a_layout_call_result_is_the_mesh_and_placements_it_names(fresh_session):
    fresh_session.set_context(device_num=4)
    layout = Layout((2, 2), ("dp", "tp"))
    local = RNG.randn(3, 2).astype(np.float32)
    dt = DTensor.from_local(Tensor(local), layout("None", "tp"))
    assert dt.device_mesh.mesh_dim_names == ("dp", "tp") and tuple(dt.device_mesh.shape) == (2, 2)
    assert dt.placements == (Replicate(), Shard(1)) and tuple(dt.shape) == (3, 4)
    # a plain tensor is every rank's piece: the 2 "tp" pieces side by side
    np.testing.assert_array_equal(dt.full_tensor().asnumpy(), np.concatenate([local, local], axis=1))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    same = DTensor.from_local(Tensor(local), mesh, (Replicate(), Shard(1)))
    assert same.layout == dt.layout and same.device_mesh == dt.device_mesh
    assert DTensor.from_local(Tensor(local), mesh).placements == (Replicate(), Replicate())  # torch's default


@pytest.mark.parametrize("tensor_map, placements", [
    (("dp", "tp"), (Shard(0), Shard(1))),
    ((("dp", "tp"), "None"), (Shard(0), Shard(0))),
    ((("tp", "dp"), "None"), (("tp", "dp"), "None")),  # "tp" major: no placement form, HyperParallel's alias form
])
def test_rank_local_pieces_under_a_layout_make_the_global_value(fresh_session, tensor_map, placements):
    fresh_session.set_context(device_num=4)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    value = RNG.randn(8, 6).astype(np.float32)
    pieces = distribute_tensor(Tensor(value), mesh, placements).to_local()  # each rank's own piece
    dt = DTensor.from_local(pieces, Layout((2, 2), ("dp", "tp"))(*tensor_map))
    np.testing.assert_array_equal(dt.full_tensor().asnumpy(), value)
    assert dt.layout.tensor_map == tuple(None if e == "None" else e for e in tensor_map)


def test_the_gradient_through_a_layout_equals_the_placements_form(fresh_session):
    fresh_session.set_context(device_num=4)
    layout = Layout((2, 2), ("dp", "tp"))("None", "tp")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    local = Tensor(RNG.randn(3, 2).astype(np.float32))
    weight = RNG.randn(3, 4).astype(np.float32)

    def loss(x, where):
        dt = DTensor.from_local(x, *where)
        return (dt.full_tensor() * Tensor(weight)).sum()

    by_layout = ms.grad(lambda x: loss(x, (layout,)))(local)
    by_placements = ms.grad(lambda x: loss(x, (mesh, (Replicate(), Shard(1)))))(local)
    # global = [x, x] along dim 1 (one copy per "tp" rank): d/dx = w[:, :2] + w[:, 2:]
    np.testing.assert_allclose(by_layout.asnumpy(), weight[:, :2] + weight[:, 2:], rtol=1e-6)
    np.testing.assert_array_equal(by_layout.asnumpy(), by_placements.asnumpy())


def test_redistribute_to_a_layout_as_upstreams_test(fresh_session):
    """Upstream's redistribute test (8 devices there, 4 here): shard -> replicate, replicate ->
    shard, and onto another Layout of the same devices ((1, 4) -> (1, 4, 1))."""
    fresh_session.set_context(device_num=4)
    layout = Layout((1, 4), ("dp", "tp"))
    gathered = DTensor.from_local(Tensor(np.ones((8, 1), np.float32)), layout("None", "tp")).redistribute(
        layout("None", "None"))
    assert gathered.placements == (Replicate(), Replicate())
    np.testing.assert_array_equal(gathered.to_local().asnumpy(), np.ones((8, 4), np.float32))
    value = RNG.randn(8, 8).astype(np.float32)
    split = DTensor.from_local(Tensor(value), layout("None", "None")).redistribute(layout("None", "tp"))
    assert split.placements == (Replicate(), Shard(1))
    np.testing.assert_array_equal(split.full_tensor().asnumpy(), value)
    other = Layout((1, 4, 1), ("dp", "tp", "sp"))
    moved = DTensor.from_local(Tensor(value), layout("None", "None")).redistribute(other("None", "tp"))
    assert moved.device_mesh.mesh_dim_names == ("dp", "tp", "sp")
    assert moved.placements == (Replicate(), Shard(1), Replicate())
    np.testing.assert_array_equal(moved.full_tensor().asnumpy(), value)


def test_a_partial_layout_becomes_placements_where_they_express_it(fresh_session):
    fresh_session.set_context(device_num=4)
    layout = Layout((2, 2), ("dp", "tp"))("None", "tp").with_partial({"dp": "sum"})
    local = RNG.randn(2, 3).astype(np.float32)
    dt = DTensor.from_local(Tensor(local), layout)
    assert dt.placements == (Partial("sum"), Shard(1))
    np.testing.assert_allclose(dt.full_tensor().asnumpy(), 2 * np.concatenate([local, local], axis=1), rtol=1e-6)


def test_layouts_it_cannot_take_are_refused_naming_the_field(fresh_session):
    fresh_session.set_context(device_num=4)
    layout = Layout((2, 2), ("dp", "tp"))
    x = Tensor(np.ones((4, 4), np.float32))
    with pytest.raises(ValueError, match=r"DTensor.from_local: layout.tensor_map=\(None, 'tp', None\) has 3 entries, "
                                         r"but the tensor has 2 dimensions"):
        DTensor.from_local(x, layout("None", "tp", "None"))
    with pytest.raises(ValueError, match=r"device_mesh is a Layout call result .* and placements=.* was given too"):
        DTensor.from_local(x, layout("None", "tp"), (Replicate(), Shard(1)))
    with pytest.raises(TypeError, match=r"got Layout \(a Layout: call it with the tensor map"):
        DTensor.from_local(x, layout)
    with pytest.raises(ValueError, match=r"layout.partial=.* marks a rank-local value"):
        DTensor.from_local(x, TensorLayout.rank_local(layout, 2, (1,)))  # what to_local() gives in simulation
    three = Layout((2, 2, 1), ("dp", "tp", "sp"))(("tp", "dp"), "None").with_partial({"sp": "sum"})
    with pytest.raises(ValueError, match=r"layout.tensor_map=\(\('tp', 'dp'\), None\) splits a dimension over several "
                                         r"axes in another order .* placements cannot express both"):
        DTensor.from_local(x, three)
