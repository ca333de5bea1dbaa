"""Two-level (hierarchical) expert dispatch in simulation: executed (rows go to the destination
group once, then to the experts' devices), equal to the flat dispatch and to one device
(forward, gradients, 5 Adam steps), with the bytes per link level measured from the exchanges."""
import numpy as np
import pytest
import mindspore as ms

import mindspore_hyper as mh
from mindspore_hyper import Layout
from mindspore_hyper.moe import MoE
from mindspore_hyper.moe.token_dispatch import plan_dispatch
from mindspore_hyper.moe.hierarchical import ExpertGroups, group_rows
from mindspore_hyper.runtime.simulation import simulate

from moe_models import (Interleaved, MoENet, assert_trains_like_one_device, batches, copy_weights,
                        expert_strategy)

pytestmark = pytest.mark.usefixtures("pynative")


def test_expert_groups_peers_levels_and_errors():
    g = ExpertGroups(8, 2)
    assert g.size == 4 and g.group_of(5) == 1 and list(g.members_of(1)) == [4, 5, 6, 7]
    assert g.peer(1, 1) == 5 and g.peer(6, 0) == 2 and g.peer(6, 1) == 6
    assert [g.level(0, 0), g.level(0, 3), g.level(0, 4)] == ["local", "intra_group", "inter_group"]
    with pytest.raises(ValueError, match="expert_groups=3 must be a positive integer dividing the 8 devices"):
        ExpertGroups(8, 3)
    from mindspore_hyper.comm.topology import Topology

    assert ExpertGroups.from_topology(Topology.preset("node8", 16), range(16)) == ExpertGroups(16, 2)
    assert ExpertGroups.from_topology(Topology.preset("node8", 16), [4, 5, 6, 7, 8, 9, 10, 11]).num_groups == 2
    with pytest.raises(ValueError, match="not contiguous groups of equal size; pass MoE\\(expert_groups=G\\)"):
        ExpertGroups.from_topology(Topology.preset("node8", 16), [0, 8, 1, 9])
    with pytest.raises(ValueError, match="has 8 devices, fewer than the mesh's"):
        ExpertGroups.from_topology(Topology.preset("node8", 8), range(16))
    with pytest.raises(ValueError, match="dispatch='ring'; expected 'flat' or 'hierarchical'"):
        MoE(16, 16, num_experts=8, dispatch="ring")
    with pytest.raises(ValueError, match="expert_groups=0 must be a positive integer"):
        MoE(16, 16, num_experts=8, dispatch="hierarchical", expert_groups=0)


def test_group_rows_send_each_token_once_per_group():
    # 4 members x 1 expert, 2 groups {0,1} {2,3}; token 0 -> experts 0,1 (group 0 twice), token 1 -> 1,2
    plan = plan_dispatch(np.array([[0, 1], [1, 2], [3, 2]]), 4)
    rows = group_rows(plan.tokens, ExpertGroups(4, 2), 1)
    assert [r.group for r in rows] == [0, 1]
    assert rows[0].tokens.tolist() == [0, 1] and rows[1].tokens.tolist() == [1, 2]
    assert {e: p.tolist() for e, p in rows[0].positions.items()} == {0: [0], 1: [0, 1]}
    assert {e: p.tolist() for e, p in rows[1].positions.items()} == {2: [0, 1], 3: [1]}


def _expected_inter_group_rows(moe, x_tokens, devices, groups, dedup):
    """Rows a dispatch sends across groups, counted from the routing in numpy."""
    experts = moe.router(x_tokens).experts
    per_device = moe.num_experts // devices
    group_size = devices // groups
    local = len(experts) // devices
    total = 0
    for d in range(devices):
        for row in experts[d * local:(d + 1) * local]:
            dest = [int(e) // per_device // group_size for e in row]
            other = [g for g in dest if g != d // group_size]
            total += len(set(other)) if dedup else len(other)
    return total


# (device matrix, axis names, train 5 steps)
CASES = {"expert4": ((4,), ("expert",), True), "data2-expert4": ((2, 4), ("data", "expert"), True)}


@pytest.mark.parametrize("case", list(CASES))
def test_hierarchical_equals_flat_and_one_device(case):
    matrix, names, train = CASES[case]
    devices = int(np.prod(matrix))
    mh.set_context(device_num=devices)
    ms.set_seed(0)
    ref = MoENet()
    # expert_groups on the flat dispatch only names the link groups its bytes are counted over
    flat, hier = MoENet(expert_groups=2), MoENet(dispatch="hierarchical", expert_groups=2)
    copy_weights(ref, flat)
    copy_weights(ref, hier)
    strategy = expert_strategy(Layout(matrix, names))
    sims = {"flat": simulate(flat, strategy), "hierarchical": simulate(hier, strategy)}
    data = batches(5)
    x, t = data[0]
    ref_loss, ref_grads = ms.value_and_grad(ref, None, ref.trainable_params())(x, t)
    stats = {}
    for name, sim in sims.items():
        net = sim.network
        loss, grads = ms.value_and_grad(sim, None, net.trainable_params())(x, t)
        assert abs(float(loss.asnumpy()) - float(ref_loss.asnumpy())) < 1e-6, name
        for p, a, b in zip(ref.trainable_params(), ref_grads, grads):
            np.testing.assert_allclose(b.asnumpy(), a.asnumpy(), rtol=1e-4, atol=1e-7, err_msg=f"{name} {p.name}")
        stats[name] = dict(net.moe.parallel().last_stats)
    # the bytes per link level, measured from the executed exchanges, against the routing
    members = matrix[-1]
    row = 16 * 4
    tokens = ref.inp(x).reshape(-1, 16)
    rows = {}
    for dedup in (False, True):
        rows[dedup] = 0
        for dp in range(devices // members):  # each data replica's expert group
            part = tokens[dp * 32 // (devices // members):(dp + 1) * 32 // (devices // members)]
            rows[dedup] += _expected_inter_group_rows(ref.moe, part, members, 2, dedup)
    # flat: one row per copy both ways; hierarchical: one row per (token, group) both ways, the
    # dispatch's rows also carrying the token's gates for the group's experts (float32 each), for
    # the forwarding device's weighted sum
    assert stats["flat"]["dispatch_link_bytes"]["inter_group"] == rows[False] * row
    assert stats["flat"]["combine_link_bytes"]["inter_group"] == rows[False] * row
    # 8 experts in 2 groups: 4 float32 gate columns on each row
    assert stats["hierarchical"]["dispatch_link_bytes"]["inter_group"] == rows[True] * (row + 4 * 4)
    assert stats["hierarchical"]["combine_link_bytes"]["inter_group"] == rows[True] * row
    flat_d, hier_d = stats["flat"]["dispatch_link_bytes"], stats["hierarchical"]["dispatch_link_bytes"]
    assert hier_d["inter_group"] < flat_d["inter_group"]  # top-2 of 8: some tokens hit 2 experts of a group
    # every copy still reaches its expert: the copies leaving their source are the flat ones
    assert flat_d["intra_group"] + flat_d["inter_group"] <= hier_d["intra_group"] + hier_d["inter_group"]
    assert rows[True] < rows[False]
    report = sims["hierarchical"].report().to_dict()["comm"]["AllToAll"]["expert"]
    assert report["count"] == 4  # two hops, dispatch and combine
    if not train:
        return

    assert_trains_like_one_device(ref, hier, sims["hierarchical"], data)


def test_hierarchical_with_overlap_chunks_and_interleaved_microbatches():
    mh.set_context(device_num=4)
    ms.set_seed(0)
    ref, par = MoENet(), MoENet(dispatch="hierarchical", expert_groups=2, overlap_chunks=2)
    copy_weights(ref, par)
    strategy = expert_strategy(Layout((4,), ("expert",)))
    sim = simulate(par, strategy)
    x, t = batches(1)[0]
    assert abs(float(sim(x, t).asnumpy()) - float(ref(x, t).asnumpy())) < 1e-6  # chunks keyed (microbatch, chunk)
    engine = par.moe.parallel()
    assert engine.states.pending() == []
    assert engine.last_stats["dispatch_link_bytes"]["inter_group"] > 0
    par2 = MoENet(dispatch="hierarchical", expert_groups=2)
    copy_weights(ref, par2)
    (x0, _), (x1, _) = batches(2)
    out = simulate(Interleaved(par2), strategy)(x0, x1).asnumpy()
    expect = np.concatenate([ref.moe(ref.inp(x0))[0].asnumpy(), ref.moe(ref.inp(x1))[0].asnumpy()])
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-6)
    assert par2.moe.parallel().states.pending() == []


def test_groups_from_the_topology_and_bad_groups(tmp_path):
    """Without expert_groups the topology's nodes are the groups (here nodes of 2 devices)."""
    topo = tmp_path / "pairs.yaml"
    topo.write_text("name: pairs\ndevices: 4\nnode_size: 2\nintra_node: {latency_us: 1, bandwidth_GBps: 56}\n"
                    "inter_node: {latency_us: 10, bandwidth_GBps: 12.5}\n")
    mh.set_context(device_num=4, topology=str(topo))
    ms.set_seed(0)
    ref, by_topo, explicit = MoENet(), MoENet(dispatch="hierarchical"), MoENet(dispatch="hierarchical",
                                                                               expert_groups=2)
    copy_weights(ref, by_topo)
    copy_weights(ref, explicit)
    strategy = expert_strategy(Layout((4,), ("expert",)))
    x, t = batches(1)[0]
    a = simulate(by_topo, strategy)(x, t)
    b = simulate(explicit, strategy)(x, t)
    assert abs(float(a.asnumpy()) - float(ref(x, t).asnumpy())) < 1e-6
    assert abs(float(b.asnumpy()) - float(a.asnumpy())) < 1e-6
    assert by_topo.moe.parallel().last_stats["dispatch_link_bytes"]["inter_group"] > 0
    assert by_topo.moe.parallel().last_stats["dispatch_link_bytes"] == \
        explicit.moe.parallel().last_stats["dispatch_link_bytes"]
    bad = MoENet(dispatch="hierarchical", expert_groups=3)
    with pytest.raises(ValueError, match="expert_groups=3 must be a positive integer dividing the 4 devices"):
        simulate(bad, strategy)(x, t)
    mh.set_context(topology="node8")  # one node of 8 holds all 4 devices: one group, no inter-group bytes
    one = MoENet(dispatch="hierarchical")
    copy_weights(ref, one)
    simulate(one, strategy)(x, t)
    assert one.moe.parallel().last_stats["dispatch_link_bytes"]["inter_group"] == 0


def test_library_collectives_refuse_the_hierarchical_dispatch():
    mh.set_context(device_num=4, sim_collectives="library")
    sim = simulate(MoENet(dispatch="hierarchical", expert_groups=2), expert_strategy(Layout((4,), ("expert",))))
    x, t = batches(1)[0]
    with pytest.raises(NotImplementedError, match="sim_collectives='library' moves only the flat dispatch"):
        sim(x, t)
