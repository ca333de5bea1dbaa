"""Topology presets, YAML loading, paths/rings/clusters and the alpha-beta model's choices."""
import os

import pytest

from mindspore_hyper import reset_context, set_context
from mindspore_hyper.comm import (
    Topology,
    choose_algorithm,
    clear_overrides,
    estimate_time,
    force_algorithm,
    load_topology,
    make_cost_model,
    set_threshold,
)
from mindspore_hyper.comm.topology import _CONFIG_DIR


@pytest.fixture(autouse=True)
def _clean():
    clear_overrides()
    reset_context()
    yield
    clear_overrides()
    reset_context()


def test_supernode384_preset_is_uniform_fast_fabric():
    t = Topology.preset("supernode384")
    assert t.num_devices == 384
    assert len(t.links) == 384 * 383 // 2
    p = t.path(0, 383)
    assert p["latency_s"] == pytest.approx(200e-9)
    assert p["bandwidth_Bps"] == pytest.approx(15 * 25e9)
    assert p["devices"] == [0, 383]
    assert t.is_uniform(range(0, 384, 7))
    assert len(t.clusters(range(16))) == 1


def test_node8_preset_clusters_and_ring_order():
    t = Topology.preset("node8")
    assert t.num_devices == 16 and t.node_of(7) == 0 and t.node_of(8) == 1
    assert not t.is_uniform()
    assert t.is_uniform(range(8))
    assert t.clusters() == [list(range(8)), list(range(8, 16))]
    assert t.path(0, 9)["latency_s"] == pytest.approx(10e-6)
    assert t.path(0, 9)["bandwidth_Bps"] == pytest.approx(12.5e9)
    # interleaved group: the ring visits each node's devices together (only 2 slow hops)
    group = [0, 8, 1, 9, 2, 10, 3, 11]
    order = t.ring_order(group)
    assert order[0] == 0 and sorted(order) == sorted(group)
    slow_hops = sum(t.node_of(order[i]) != t.node_of(order[(i + 1) % 8]) for i in range(8))
    assert slow_hops == 2
    assert Topology.preset("node8", 32).clusters()[3] == list(range(24, 32))


def test_ring_preset_paths_are_multi_hop():
    t = Topology.preset("ring")
    assert t.num_devices == 8 and len(t.links) == 8
    p = t.path(0, 3)
    assert p["devices"] == [0, 1, 2, 3]
    assert p["latency_s"] == pytest.approx(3e-6)
    assert t.path(0, 6)["devices"] == [0, 7, 6]  # the short way round
    assert t.ring_order([0, 4, 2, 6, 1, 5, 3, 7]) in ([0, 1, 2, 3, 4, 5, 6, 7], [0, 7, 6, 5, 4, 3, 2, 1])
    assert not t.is_uniform()
    assert len(t.clusters()) == 1  # one chain of cheap links: no hierarchy


@pytest.mark.parametrize("name,n", [("supernode384", 384), ("node8", 16), ("ring", 8)])
def test_yaml_files_equal_presets(name, n):
    y = Topology.from_yaml(os.path.join(_CONFIG_DIR, f"{name}.yaml"))
    p = Topology.preset(name)
    assert y.num_devices == p.num_devices == n
    def norm(links):
        return sorted((min(a, b), max(a, b)) for a, b, _, _ in links)

    assert norm(y.links) == norm(p.links)
    for a, b in [(0, 1), (0, n - 1), (1, n // 2)]:
        assert y.path(a, b)["latency_s"] == pytest.approx(p.path(a, b)["latency_s"])
        assert y.path(a, b)["bandwidth_Bps"] == pytest.approx(p.path(a, b)["bandwidth_Bps"])
    assert y.clusters() == p.clusters()


@pytest.mark.parametrize("text,field", [
    ("devices: 4\nmesh: {latency_ns: 100, bandwidth_GBps: -1}\n", "mesh.bandwidth_GBps"),
    ("devices: 4\nmesh: {bandwidth_GBps: 10}\n", "mesh"),
    ("devices: 4\nmesh: {latency_ns: 1, bandwidth_GBps: 1}\nspeed: 3\n", "speed"),
    ("mesh: {latency_ns: 1, bandwidth_GBps: 1}\n", "devices"),
    ("devices: 4\nlinks:\n  - {src: 0, dst: 9, latency_ns: 1, bandwidth_GBps: 1}\n", "links[0].dst"),
    ("devices: 4\nlinks:\n  - {src: 0, dst: 1, latency_ns: abc, bandwidth_GBps: 1}\n", "links[0].latency_ns"),
    ("devices: 4\nintra_node: {latency_ns: 1, bandwidth_GBps: 1}\n", "intra_node"),
    ("devices: 3\nnodes: [[0, 1], [1, 2]]\n", "nodes"),
])
def test_yaml_errors_name_the_field(tmp_path, text, field):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        Topology.from_yaml(str(path))
    assert f"field '{field}'" in str(err.value) and "bad.yaml" in str(err.value)


def test_yaml_disconnected_devices_rejected(tmp_path):
    path = tmp_path / "split.yaml"
    path.write_text("devices: 4\nlinks:\n  - {src: 0, dst: 1, latency_ns: 1, bandwidth_GBps: 1}\n")
    with pytest.raises(ValueError, match="not connected"):
        Topology.from_yaml(str(path))


def test_yaml_explicit_nodes_and_links(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text("name: two\nnodes: [[0, 2], [1, 3]]\nintra_node: {latency_ns: 100, bandwidth_GBps: 100}\n"
                    "inter_node: {latency_us: 5, bandwidth_GBps: 10}\n"
                    "links:\n  - {src: 0, dst: 1, latency_ns: 300, bandwidth_GBps: 50}\n")
    t = Topology.from_yaml(str(path))
    assert t.name == "two" and t.num_devices == 4
    assert t.clusters() == [[0, 2], [1, 3]]
    assert t.path(0, 1)["latency_s"] == pytest.approx(300e-9)  # the explicit link overrides
    # routing takes the lowest-latency path: 2 -> 0 -> 1 -> 3 (100 + 300 + 100 ns) beats the direct 5 us
    assert t.path(2, 3)["devices"] == [2, 0, 1, 3]
    assert t.path(2, 3)["latency_s"] == pytest.approx(500e-9)
    assert t.path(2, 3)["bandwidth_Bps"] == pytest.approx(50e9)


def test_load_topology_follows_context_flag(tmp_path):
    assert load_topology().name == "node8"  # the flag's default
    set_context(topology="ring")
    assert load_topology().name == "ring"
    path = tmp_path / "r4.yaml"
    path.write_text("devices: 4\nring: {latency_us: 2, bandwidth_GBps: 1}\n")
    set_context(topology=str(path))
    assert load_topology().num_devices == 4


def test_model_switches_protocol_by_size_on_supernode():
    group = list(range(64))
    small = choose_algorithm("all_reduce", 1024, group, "supernode384")
    large = choose_algorithm("all_reduce", 256 << 20, group, "supernode384")
    assert small[0] == "recursive_doubling" and large[0] == "ring"
    model = make_cost_model("supernode384")
    thr = model.small_message_threshold("all_reduce", group)
    assert 1024 < thr < (256 << 20)
    assert model.choose("all_reduce", thr, group)[0] == "recursive_doubling"
    assert model.choose("all_reduce", 2 * thr + 8, group)[0] == "ring"
    # the bandwidth term: ring moves 2(p-1)/p n bytes at 375 GB/s
    t = model.time("all_reduce", "ring", 1 << 30, group)
    assert t == pytest.approx(2 * 63 * 200e-9 + 2 * 63 / 64 * (1 << 30) / 375e9, rel=1e-6)
    assert choose_algorithm("broadcast", 64, group, "supernode384")[0] == "binomial"
    assert choose_algorithm("broadcast", 1 << 30, group, "supernode384")[0] == "pipelined_chain"


def test_model_picks_hierarchy_on_non_uniform_links():
    group = list(range(32))
    assert choose_algorithm("all_reduce", 64 << 20, group, Topology.preset("node8", 32))[0] == "hierarchical"
    assert choose_algorithm("all_reduce", 64 << 20, list(range(8)), "node8")[0] == "ring"
    # a uniform fabric never gets the hierarchy
    model = make_cost_model("supernode384")
    assert model.time("all_reduce", "hierarchical", 1 << 20, group) == float("inf")


def test_estimate_time_monotonic_and_kinds():
    group = [0, 1, 8, 9]
    prev = 0.0
    for n in (8, 1 << 10, 1 << 20, 1 << 28):
        t = estimate_time("all_reduce", n, group, "node8")
        assert t > prev
        prev = t
    for kind in ("all_gather", "reduce_scatter", "all_to_all", "broadcast", "barrier"):
        assert estimate_time(kind, 1 << 20, group, "node8") > 0
    assert estimate_time("send_recv", 1 << 20, [0, 9], "node8") == pytest.approx(10e-6 + (1 << 20) / 12.5e9)
    assert estimate_time("all_reduce", 1 << 20, [3], "node8") == 0.0
    # slower links between nodes cost more than inside a node
    assert estimate_time("all_to_all", 1 << 20, [0, 8], "node8") > estimate_time("all_to_all", 1 << 20, [0, 1], "node8")
    # a preset name covers the group: node8 grows to 8 nodes for 64 devices (hierarchy across them)
    assert choose_algorithm("all_reduce", 64 << 20, list(range(64)), "node8")[0] == "hierarchical"
    with pytest.raises(ValueError, match="kind"):
        estimate_time("allreduce", 8, group, "node8")


def test_user_overrides():
    group = list(range(16))
    set_threshold("all_reduce", 1 << 30)
    assert choose_algorithm("all_reduce", 1 << 29, group, "supernode384")[0] == "recursive_doubling"
    set_threshold("all_reduce", None)
    force_algorithm("all_reduce", "ring")
    assert choose_algorithm("all_reduce", 8, group, "supernode384")[0] == "ring"
    with pytest.raises(Exception, match="unknown algorithm"):
        force_algorithm("all_reduce", "butterfly")
