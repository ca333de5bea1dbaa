"""Group-limited routing and the dispatch bytes per topology link level."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor

from mindspore_hyper.comm.topology import Topology
from mindspore_hyper.moe import MoE
from mindspore_hyper.moe.groups import expert_groups, link_bytes
from mindspore_hyper.moe.router import limit_groups

pytestmark = pytest.mark.usefixtures("pynative")


def test_limit_groups_keeps_the_best_groups():
    choice = np.array([[0.1, 0.5, 0.2, 0.05, 0.1, 0.05],
                       [0.3, 0.0, 0.0, 0.0, 0.3, 0.4]])
    out = limit_groups(choice, 3, 1)  # groups {0,1}, {2,3}, {4,5}; best by largest probability
    assert np.isfinite(out[0]).tolist() == [True, True, False, False, False, False]
    assert np.isfinite(out[1]).tolist() == [False, False, False, False, True, True]


def test_group_limited_moe_uses_few_groups_and_matches_its_own_reference():
    ms.set_seed(0)
    moe = MoE(16, 16, num_experts=8, top_k=2, num_groups=4, topk_groups=1)
    x = Tensor(np.random.default_rng(0).normal(size=(32, 16)).astype(np.float32))
    routing = moe.router(x)
    groups = routing.experts // 2
    assert (groups[:, 0] == groups[:, 1]).all()  # both copies inside the token's one group
    probs = routing.probs.asnumpy()
    best_group = probs.reshape(32, 4, 2).max(-1).argmax(-1)
    assert (groups[:, 0] == best_group).all()
    with pytest.raises(ValueError, match="num_groups=3 must divide num_experts=8"):
        MoE(16, 16, num_experts=8, num_groups=3)
    with pytest.raises(ValueError, match="its groups must hold top_k=4 experts"):
        MoE(16, 16, num_experts=8, top_k=4, num_groups=4, topk_groups=1)


def test_link_bytes_flat_vs_two_level():
    topo = Topology.preset("node8", 16)
    assert expert_groups(topo, range(16)) == [list(range(8)), list(range(8, 16))]
    # device 0 sends one token to experts on devices 0 (local), 1 (same node), 9 and 10 (other node)
    chosen = [np.array([[0, 1, 9, 10]])] + [np.zeros((0, 4), np.int64)] * 15
    flat = link_bytes(chosen, 1, topo, 100)
    assert flat == {"local": 100, "intra_node": 100, "inter_node": 200}
    two = link_bytes(chosen, 1, topo, 100, two_level=True)
    assert two == {"local": 100, "intra_node": 200, "inter_node": 100}


def test_group_limited_routing_under_expert_parallelism(clean_context):
    """8 experts on expert=4 devices, 4 groups of 2 experts (one group per device): with one
    group per token both copies of a token go to one device; numbers equal one device. The
    dispatch sends one row per copy (no per-device de-duplication), so the rows sent do not
    shrink here; `link_bytes` counts one row per (token, device) as a de-duplicating dispatch
    would."""
    import mindspore_hyper as mh
    from mindspore import nn
    from mindspore_hyper import Layout
    from mindspore_hyper.runtime.simulation import simulate

    class Routed(nn.Cell):
        def __init__(self, moe):
            super().__init__()
            self.moe = moe

        def construct(self, x):
            return self.moe(x)[0]

    mh.set_context(device_num=4)
    x = Tensor(np.random.default_rng(1).normal(size=(64, 16)).astype(np.float32))
    for groups in (1, 4):
        ms.set_seed(0)
        moe = MoE(16, 16, num_experts=8, top_k=2, num_groups=groups, topk_groups=1)
        sim = simulate(Routed(moe), Layout((4,), ("expert",))(tensor_map=()).override("*.experts.*", "expert"))
        y = sim(x).asnumpy()
        np.testing.assert_allclose(y, moe(x)[0].asnumpy(), rtol=1e-5, atol=1e-6)  # same as one device
        assert moe.parallel().last_stats["rows"] > 0
        devices_per_token = {len(set((row // 2).tolist())) for row in moe.router(x).experts}
        assert devices_per_token == ({1} if groups == 4 else {1, 2})
