"""DeviceMesh and init_device_mesh: shape, names, sub-meshes, placements, rank questions."""
import numpy as np
import pytest

from mindspore_hyper.hyper_parallel import (
    DeviceMesh, Partial, RankDependentError, Replicate, Shard, StridedShard, get_current_mesh, init_device_mesh,
)


def test_mesh_shape_names_and_sub_meshes(fresh_session):
    fresh_session.set_context(device_num=8)
    mesh = init_device_mesh("npu", (2, 4), mesh_dim_names=("dp", "tp"))
    assert mesh.shape == (2, 4) and mesh.ndim == 2 and mesh.size() == 8 and mesh.size("tp") == 4
    assert mesh.mesh_dim_names == ("dp", "tp")
    np.testing.assert_array_equal(mesh.mesh, np.arange(8).reshape(2, 4))
    tp = mesh["tp"]
    assert tp.shape == (4,) and tp.mesh_dim_names == ("tp",) and tp.size() == 4
    assert mesh["tp", "dp"].mesh_dim_names == ("tp", "dp")
    assert get_current_mesh() is mesh
    with tp:
        assert get_current_mesh() is tp
    assert get_current_mesh() is mesh


def test_sub_mesh_placements_map_onto_the_root(fresh_session):
    fresh_session.set_context(device_num=8)
    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    layout = mesh["tp"].tensor_layout((Shard(-1),), ndim=2)
    assert layout.tensor_map == (None, "tp")
    assert mesh.tensor_layout((Shard(0), Partial("sum")), ndim=2).placements == (Shard(0), Partial("sum"))
    assert mesh["tp"].placements_of(layout) == (Shard(1),)
    assert mesh.tensor_layout(("dp", "None"), ndim=2).tensor_map == ("dp", None)  # upstream's alias form


@pytest.mark.parametrize("call, message", [
    (lambda: init_device_mesh("npu", (3,)), "3 devices do not divide the job's 8"),
    (lambda: init_device_mesh("npu", (16,)), "16 devices, but the job has 8"),
    (lambda: init_device_mesh("npu", (4,), rank_list=(0, 1, 2)), "rank_list has 3 ranks; expected"),
    (lambda: init_device_mesh("npu", (4,), rank_list=(6, 7, 8, 9)).execution(), "rank 8 is outside the job"),
    (lambda: DeviceMesh("npu", [[0, 1], [1, 2]]), "distinct non-negative ranks"),
    (lambda: init_device_mesh("tpu", (8,)), "device_type='tpu'"),
    (lambda: init_device_mesh("npu", (2, 4), mesh_dim_names=("dp",)), "1 names for a 2-dimensional mesh"),
    (lambda: init_device_mesh("npu", (0, 8)), "positive ints"),
    (lambda: init_device_mesh("npu", (8,), mesh_dim_names=("x",))["y"], "no such dimension"),
])
def test_bad_meshes_are_refused_with_the_field(call, message):
    with pytest.raises((ValueError, KeyError), match=message):
        call()


def test_bad_placements_are_refused(fresh_session):
    mesh = init_device_mesh("npu", (2, 4), mesh_dim_names=("dp", "tp"))
    with pytest.raises(ValueError, match="one per mesh dimension"):
        mesh.tensor_layout((Shard(0),), ndim=2)
    with pytest.raises(ValueError, match="StridedShard is not supported"):
        mesh.tensor_layout((StridedShard(0, 2), Replicate()), ndim=2)
    with pytest.raises(ValueError, match="not a dimension of this mesh"):
        mesh.tensor_layout(("pp", "None"), ndim=2)
    with pytest.raises(ValueError, match="only 2 dimensions"):
        mesh.tensor_layout((Shard(2), Replicate()), ndim=2)


def test_rank_questions_are_refused_in_simulation_with_the_reason():
    mesh = init_device_mesh("npu", (8,), mesh_dim_names=("tp",))
    for ask in (mesh.get_rank, mesh.get_coordinate, lambda: mesh.get_local_rank("tp"), mesh.get_group):
        with pytest.raises(RankDependentError, match="runs the script once for all 8"):
            ask()
    sub = init_device_mesh("npu", (2, 4), mesh_dim_names=("dp", "tp"))["tp"]
    with pytest.raises(RankDependentError, match="sub-mesh"):
        sub.mesh


def test_a_mesh_of_explicit_ranks():
    mesh = DeviceMesh("npu", [[4, 5, 6, 7], [0, 1, 2, 3]], mesh_dim_names=("a", "b"))
    assert mesh.root.rank_list == (4, 5, 6, 7, 0, 1, 2, 3)
    np.testing.assert_array_equal(mesh.mesh, [[4, 5, 6, 7], [0, 1, 2, 3]])


def test_a_mesh_on_some_of_the_job_s_ranks(fresh_session):
    fresh_session.set_context(device_num=8)
    mesh = DeviceMesh("cpu", [[6, 4], [7, 5]], mesh_dim_names=("dp", "tp"))
    assert mesh.members == (4, 5, 6, 7) and mesh.root.rank_list == (2, 0, 3, 1) and mesh.size() == 4
    np.testing.assert_array_equal(mesh.mesh, [[6, 4], [7, 5]])
    assert "ranks=[4, 5, 6, 7]" in repr(mesh)
    assert mesh != DeviceMesh("cpu", [[2, 0], [3, 1]], mesh_dim_names=("dp", "tp"))  # same shape, other devices
    explicit = init_device_mesh("cpu", (2, 2), rank_list=(6, 4, 7, 5), mesh_dim_names=("dp", "tp"))
    assert explicit == mesh and explicit.copies == 1


def test_init_device_mesh_smaller_than_the_job_tiles_it_as_upstream(fresh_session):
    fresh_session.set_context(device_num=8)
    mesh = init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "tp"))
    assert mesh.copies == 2 and mesh.members == (0, 1, 2, 3) and mesh.size() == 4
    with pytest.raises(RankDependentError, match="tiling the job 2 times"):
        mesh.mesh  # ranks 0..3 or 4..7, by the calling rank
