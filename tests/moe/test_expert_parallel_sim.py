"""Expert parallelism in simulation: forward, gradients and 5 training steps equal the
single-device MoE (dropless) on 2, 4 and 8 devices, with data and tensor parallelism; dispatch
state is per microbatch (interleaved microbatches)."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import nn

import mindspore_hyper as mh
from mindspore_hyper import Layout
from mindspore_hyper.runtime.simulation import simulate
from mindspore_hyper.moe.expert_parallel import ExpertInputs

from moe_models import (Interleaved, MoENet, assert_computes_like_one_device, assert_trains_like_one_device,
                        batches, copy_weights, expert_strategy)

pytestmark = pytest.mark.usefixtures("pynative")

# (device matrix, axis names, tensor-parallel experts, shared expert size ("gated N": with Qwen2-MoE's
# sigmoid gate), train 5 steps too).
# 5 training steps on 8 devices (data x expert x tensor) run in examples/moe_training.py
# (tests/moe/test_moe_example.py) and on 4 processes in test_expert_parallel_msrun.py; here
# 8 devices check forward and gradients only, to keep the suite fast.
CASES = {
    "expert2": ((2,), ("expert",), False, 0, True),
    "data2-expert2": ((2, 2), ("data", "expert"), False, 8, True),
    "data2-expert2-tensor2": ((2, 2, 2), ("data", "expert", "tensor"), True, 8, False),
    # Qwen2-MoE's shared expert: its output scaled by sigmoid(shared_expert_gate(x)), split over tensor too
    "data2-expert2-tensor2-gated": ((2, 2, 2), ("data", "expert", "tensor"), True, "gated 8", False),
    "expert8": ((8,), ("expert",), False, 0, False),
}



@pytest.mark.parametrize("case", list(CASES))
def test_forward_gradients_and_training_match_single_device(case):
    matrix, names, tensor, shared, train = CASES[case]
    gated = isinstance(shared, str)
    shared = int(str(shared).split()[-1])
    mh.set_context(device_num=int(np.prod(matrix)))
    ms.set_seed(0)
    ref, par = MoENet(shared=shared, shared_gate=gated), MoENet(shared=shared, shared_gate=gated)
    copy_weights(ref, par)
    sim = simulate(par, expert_strategy(Layout(matrix, names), tensor=tensor))
    data = batches(5)
    x, t = data[0]
    assert_computes_like_one_device(ref, par, sim, x, t)
    assert sim.network.moe.last_expert_counts.sum() == 32 * 2  # the whole batch's routing
    if not train:  # (training steps on 2, 4 and 8 devices above; this keeps the suite fast)
        return

    assert_trains_like_one_device(ref, par, sim, data)


def test_report_counts_expert_all_to_all():
    mh.set_context(device_num=4)
    ms.set_seed(0)
    sim = simulate(MoENet(), expert_strategy(Layout((4,), ("expert",))))
    x, t = batches(1)[0]
    sim(x, t)
    row = sim.report().to_dict()["comm"]["AllToAll"]["expert"]
    assert row["count"] == 2  # dispatch and combine
    assert sim.network.moe.parallel().last_stats["rows"] > 0


def test_interleaved_microbatches_keep_their_own_dispatch_state():
    mh.set_context(device_num=4)
    ms.set_seed(0)
    ref, par = MoENet(), MoENet()
    copy_weights(ref, par)
    sim = simulate(Interleaved(par), expert_strategy(Layout((2, 2), ("data", "expert"))))
    (x0, _), (x1, _) = batches(2)
    out = sim(x0, x1).asnumpy()
    expect = np.concatenate([ref.moe(ref.inp(x0))[0].asnumpy(), ref.moe(ref.inp(x1))[0].asnumpy()])
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-6)
    assert par.moe.parallel().states.pending() == []


def test_router_must_be_replicated_and_weights_consistent():
    mh.set_context(device_num=2)
    strategy = expert_strategy(Layout((2,), ("expert",)))
    strategy.override("*.router.weight", None, "expert")
    sim = simulate(MoENet(), strategy)
    x, t = batches(1)[0]
    with pytest.raises(ValueError, match="router weight must be replicated"):
        sim(x, t)
    strategy = Layout((2,), ("expert",))(tensor_map=()).override("*.experts.w_gate", "expert")
    sim = simulate(MoENet(), strategy)
    with pytest.raises(ValueError, match=r"experts.w_up is laid out as \(None, None, None\); expected \(\('expert',\), None, None\)"):
        sim(x, t)


def test_overlap_chunks_give_the_same_numbers():
    mh.set_context(device_num=4)
    ms.set_seed(0)
    ref, par = MoENet(), MoENet(overlap_chunks=3)
    copy_weights(ref, par)
    sim = simulate(par, expert_strategy(Layout((2, 2), ("data", "expert"))))
    x, t = batches(1)[0]
    ref_loss, ref_grads = ms.value_and_grad(ref, None, ref.trainable_params())(x, t)
    loss, grads = ms.value_and_grad(sim, None, par.trainable_params())(x, t)
    assert abs(float(loss.asnumpy()) - float(ref_loss.asnumpy())) < 1e-6
    for p, a, b in zip(ref.trainable_params(), ref_grads, grads):
        np.testing.assert_allclose(b.asnumpy(), a.asnumpy(), rtol=1e-4, atol=1e-7, err_msg=p.name)
    assert par.moe.parallel().states.pending() == []
    with pytest.raises(ValueError, match="overlap_chunks=0 must be an integer >= 1"):
        MoENet(overlap_chunks=0)


def test_library_all_to_all_in_simulation_gives_the_same_numbers(monkeypatch):
    """sim_collectives="library": the rows move through the C++ library's in-process all_to_all_v."""
    from mindspore_hyper.comm.inprocess import InProcessCommunicator

    calls = []
    original = InProcessCommunicator.all_to_all_v
    monkeypatch.setattr(InProcessCommunicator, "all_to_all_v", lambda self, *a: calls.append(1) or original(self, *a))
    mh.set_context(device_num=4, sim_collectives="library")
    ms.set_seed(0)
    ref, par = MoENet(shared=8), MoENet(shared=8)
    copy_weights(ref, par)
    sim = simulate(par, expert_strategy(Layout((2, 2), ("expert", "tensor")), tensor=True))
    x, t = batches(1)[0]
    ref_loss, ref_grads = ms.value_and_grad(ref, None, ref.trainable_params())(x, t)
    loss, grads = ms.value_and_grad(sim, None, par.trainable_params())(x, t)
    assert abs(float(loss.asnumpy()) - float(ref_loss.asnumpy())) < 1e-6
    for p, a, b in zip(ref.trainable_params(), ref_grads, grads):
        np.testing.assert_allclose(b.asnumpy(), a.asnumpy(), rtol=1e-4, atol=1e-7, err_msg=p.name)
    assert sim.report().to_dict()["comm"]["AllToAll"]["expert"]["count"] == 2
    assert len(calls) == 2 * 2  # dispatch + combine, forward + backward (one expert group: tokens are
    # replicated over "tensor")


def test_experts_replicated_under_data_parallelism():
    """No expert axis: every device runs all experts on its own tokens (no exchange)."""
    mh.set_context(device_num=2)
    ms.set_seed(0)
    ref, par = MoENet(), MoENet()
    copy_weights(ref, par)
    sim = simulate(par, Layout((2,), ("data",))(tensor_map=()))
    x, t = batches(1)[0]
    ref_loss, ref_grads = ms.value_and_grad(ref, None, ref.trainable_params())(x, t)
    loss, grads = ms.value_and_grad(sim, None, par.trainable_params())(x, t)
    assert abs(float(loss.asnumpy()) - float(ref_loss.asnumpy())) < 1e-6
    for p, a, b in zip(ref.trainable_params(), ref_grads, grads):
        np.testing.assert_allclose(b.asnumpy(), a.asnumpy(), rtol=1e-4, atol=1e-7, err_msg=p.name)
    comm = sim.report().to_dict()["comm"]  # no expert axis: no AllToAll is reported
    assert "AllToAll" not in comm and "AllReduce" in comm


def test_engine_errors_name_the_microbatch():
    engine = MoENet().moe.parallel()
    with pytest.raises(RuntimeError, match="microbatch 7 has no dispatch waiting"):
        engine.compute(ExpertInputs(7, {}))


class _Routed(nn.Cell):
    def __init__(self, moe):
        super().__init__()
        self.moe = moe

    def construct(self, x):
        return self.moe(x)[0]


def test_capacity_applies_per_device_like_gshard_groups():
    """With a capacity factor each device drops beyond its own capacity: the result equals the
    single-device layer run on each device's tokens separately."""
    from mindspore_hyper.moe import MoE

    mh.set_context(device_num=4)
    ms.set_seed(0)
    ref, par = MoE(16, 24, num_experts=8, top_k=2, capacity_factor=0.5), MoE(16, 24, num_experts=8, top_k=2,
                                                                               capacity_factor=0.5)
    copy_weights(ref, par)
    sim = simulate(_Routed(par), expert_strategy(Layout((2, 2), ("data", "expert"))))
    x = batches(1, batch=8, seq=4)[0][0]
    out = sim(x).asnumpy().reshape(32, 16)
    tokens = x.asnumpy().reshape(32, 16)
    expect = np.concatenate([ref(ms.Tensor(tokens[8 * d:8 * (d + 1)]))[0].asnumpy() for d in range(4)])
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-6)
    whole = ref(ms.Tensor(tokens))[0].asnumpy()
    assert not np.allclose(out, whole, atol=1e-6)  # and differs from capacity over the whole batch
