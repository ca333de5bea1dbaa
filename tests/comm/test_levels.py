"""comm.levels and comm.cost.hierarchical_time: a network given as levels of domains is the device
graph `Topology.from_levels` builds (node8 exactly), and its pure-Python hierarchical times are
the C++ cost model's on that graph."""
import pytest

from mindspore_hyper.comm.cost import hierarchical_time, make_cost_model, transfer_time
from mindspore_hyper.comm.levels import Level, group_fanouts, levels_spanned
from mindspore_hyper.comm.topology import Topology, read_yaml

NODE8 = (Level("node", 8, 56e9, 1e-6), Level("net", 16, 12.5e9, 10e-6))


def _ab(levels):
    return [lv.latency for lv in levels], [1 / lv.bandwidth for lv in levels]


def test_node8_is_two_levels():
    graph, preset = Topology.from_levels(NODE8), Topology.preset("node8")
    assert sorted(graph.links) == sorted(preset.links) and graph.clusters() == preset.clusters()
    assert Topology.from_levels(NODE8, 4).num_devices == 4
    with pytest.raises(ValueError, match=r"num_devices=17: expected an int in \[1, 16\]"):
        Topology.from_levels(NODE8, 17)


def test_fanouts_and_levels_spanned():
    assert group_fanouts(NODE8, 16) == (8, 2) and group_fanouts(NODE8, 2, 8) == (1, 2)
    assert levels_spanned(NODE8, (1, 2)) == ("net",) and levels_spanned(NODE8, (1, 1)) == ()
    with pytest.raises(ValueError, match="spans 32 devices; the network has 16"):
        group_fanouts(NODE8, 4, 8)


def test_hierarchical_times_are_the_cpp_models_on_the_graph():
    model = make_cost_model(Topology.from_levels(NODE8))
    alphas, betas = _ab(NODE8)
    n = 1 << 26
    assert hierarchical_time("all_reduce", n, alphas, betas, group_fanouts(NODE8, 16)) == pytest.approx(
        model.time("all_reduce", "hierarchical", n, list(range(16))), rel=1e-12)
    assert hierarchical_time("send_recv", n, alphas, betas, (1, 2)) == pytest.approx(
        model.choose("send_recv", n, [0, 9])[1], rel=1e-12)
    assert transfer_time(n, alphas, betas, (2, 1)) == pytest.approx(model.choose("send_recv", n, [0, 1])[1], rel=1e-12)
    one = (NODE8[0],)
    a1, b1 = _ab(one)
    assert hierarchical_time("all_gather", n, a1, b1, (8,)) == pytest.approx(
        model.time("all_gather", "ring", n, list(range(8))), rel=1e-12)
    assert hierarchical_time("all_reduce", n, alphas, betas, (1, 1), fixed=1.0) == 0.0
    with pytest.raises(ValueError, match="kind='broadcast'"):
        hierarchical_time("broadcast", n, alphas, betas, (8, 2))


def test_read_yaml_names_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [")
    with pytest.raises(ValueError, match=r"topology file '.*bad.yaml': invalid YAML"):
        read_yaml(str(bad), "topology")
    with pytest.raises(ValueError, match=r"hardware file '.*none.yaml': cannot read"):
        read_yaml(str(tmp_path / "none.yaml"), "hardware")
