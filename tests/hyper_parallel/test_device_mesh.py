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
    (lambda: init_device_mesh("npu", (2, 4), mesh_dim_names=("dp",)), r"mesh dimensions \(2, shape \(2, 4\)\) "
     r"should be equal to mesh_dim_names length \(1\)"),
    (lambda: init_device_mesh("npu", (2, 4), mesh_dim_names=("dp", "dp")), "Each element of mesh_dim_names"),
    (lambda: init_device_mesh("npu", (2, 4), mesh_dim_names=("interleaved_parallel", "dp")),
     "'interleaved_parallel' should be at the last dim of mesh_dim_names"),
    (lambda: init_device_mesh("npu", (2, 4), mesh_dim_names=("dp", "interleaved_parallel")),
     "'interleaved_parallel' .* is not supported"),
    (lambda: init_device_mesh("npu", (8,), init_backend=1), "init_backend=1; expected a bool"),
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


def test_upstream_s_mesh_properties_and_refusals(fresh_session):
    fresh_session.set_context(device_num=8)
    mesh = init_device_mesh("npu", (2, 4), mesh_dim_names=("dp", "tp"))
    assert mesh.mesh_shape == (2, 4) and mesh.rank_list == tuple(range(8)) and mesh.root_mesh is None
    assert mesh["tp"].root_mesh == mesh and mesh["tp"].mesh_shape == (4,)
    with pytest.raises(RuntimeError, match="Cannot slice a DeviceMesh without mesh_dim_names"):
        init_device_mesh("npu", (2, 2, 2))["dim0"]  # the default names are not names to slice by (upstream, torch)
    unbacked = init_device_mesh("npu", (2, 2, 2), mesh_dim_names=("dp", "tp", "cp"), init_backend=False)
    for ask in (lambda: unbacked.get_group(2), lambda: unbacked["tp"].get_group()):
        with pytest.raises(RuntimeError, match="process groups not initialized"):
            ask()


def test_from_group_makes_the_mesh_of_a_named_group_and_lays_out_on_it(fresh_session):
    import mindspore as ms
    from mindspore_hyper.hyper_parallel import distribute_tensor
    from mindspore_hyper.hyper_parallel.process_group import create_group

    fresh_session.set_context(device_num=8)
    name = create_group(list(range(4, 8)))
    assert name == "4-4-5-6-7"  # upstream's default name
    mesh = DeviceMesh.from_group(name, "npu", mesh_dim_names=("tp",))
    assert mesh["tp"].rank_list == (4, 5, 6, 7) and mesh.mesh_dim_names == ("tp",)
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    d = distribute_tensor(ms.Tensor(x), mesh, [Shard(0)])
    np.testing.assert_array_equal(d.full_tensor().asnumpy(), x)  # a layout only moves values: exact
    with pytest.raises(ValueError, match=r"differs from the group's ranks \[4, 5, 6, 7\]"):
        DeviceMesh.from_group(name, "npu", mesh=[0, 1, 2, 3])
    with pytest.raises(ValueError, match="mesh is required with a list of 1 groups"):
        DeviceMesh.from_group([name], "npu")
    with pytest.raises(ValueError, match="has 1 dimensions; expected one per group"):
        DeviceMesh.from_group([name, name], "npu", mesh=[4, 5, 6, 7])
    with pytest.raises(ValueError, match="'nope': no such group"):
        DeviceMesh.from_group("nope", "npu")


FROM_GROUP = """
    from mindspore_hyper.hyper_parallel import DeviceMesh, get_rank, init_device_mesh

    r = get_rank()
    m = init_device_mesh("npu", (2, 4), mesh_dim_names=("dp", "tp"))
    two = DeviceMesh.from_group([m.get_group("dp"), m.get_group("tp")], "npu", mesh=(m.mesh[0], m.mesh[1]),
                                mesh_dim_names=("tp", "cp"))
    assert two["tp"].mesh_shape == (2,) and two["tp"].rank_list == (r % 4, r % 4 + 4), two["tp"].rank_list
    assert two["cp"].rank_list == tuple(range(r - r % 4, r - r % 4 + 4)) and two["cp"].root_mesh == two
    m3 = init_device_mesh("npu", (2, 2, 2), mesh_dim_names=("dp", "tp", "cp"))
    three = DeviceMesh.from_group([m3["dp"].get_group(), m3["tp"].get_group()], "npu",
                                  mesh=m3.mesh[:, :, m3.get_local_rank("cp")], mesh_dim_names=("dp", "tp"))
    assert three["dp"].rank_list == m3["dp"].rank_list and three["tp"].rank_list == m3["tp"].rank_list
    one = DeviceMesh.from_group(m.get_group("tp"), "npu", mesh_dim_names=("x",))
    assert one.rank_list == m["tp"].rank_list and one.get_group().ranks == m.get_group("tp").ranks
    try:
        DeviceMesh.from_group([m.get_group("tp"), m.get_group("dp")], "npu", mesh=m.mesh)
        raise AssertionError("groups in the wrong order were taken")
    except ValueError as error:
        assert "not the group along mesh dimension 0 ('dim0') through rank" in str(error), error
"""


def test_from_group_on_every_rank_as_upstream_s_test_builds_it(fresh_session, tmp_path):
    import textwrap

    from mindspore_hyper.hyper_parallel.rank_threads import run_per_rank, simulated_communication
    from mindspore_hyper.hyper_parallel.session import refuse_in_simulation

    script = tmp_path / "from_group.py"
    script.write_text(textwrap.dedent(FROM_GROUP))
    with simulated_communication(8, refuse_in_simulation):
        assert run_per_rank(str(script), 8) == 0  # every rank's asserts passed (a failing rank raises)
