"""Upstream's dual-pipe overlap names (`CommComputeOverlap`, `HookCoordinator`, `HookRole`): a
backward chunk and a forward chunk of different microbatches run through `run` give the values of
running them one after the other on one device; the wrappers compute what they wrap."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn

from mindspore_hyper.hyper_parallel.comm_compute_overlap import CommComputeOverlap, HookCoordinator, HookRole

# Same float32 ops on the same values in the same order: bit-identical.


def _chunks(net, x1, x2):
    """A microbatch-2 forward and a microbatch-1 backward, as a 1F1B step pairs them."""
    grad_fn = ms.value_and_grad(lambda x: (net(x) ** 2).sum(), None, net.trainable_params())
    out = {}

    def fwd_fn():
        out["forward"] = net(x2).asnumpy()

    def bwd_fn():
        out["loss"], grads = grad_fn(x1)
        out["grads"] = [g.asnumpy() for g in grads]

    return fwd_fn, bwd_fn, out


def test_run_gives_the_values_of_the_two_chunks_run_in_turn(pynative):
    ms.set_seed(0)
    net = nn.Dense(4, 3)
    rng = np.random.RandomState(0)
    x1, x2 = (Tensor(rng.randn(2, 4).astype(np.float32)) for _ in range(2))
    fwd_fn, bwd_fn, want = _chunks(net, x1, x2)
    bwd_fn()
    fwd_fn()
    overlap = CommComputeOverlap()
    dispatch = overlap.wrap_dispatch(lambda h, scale: h * scale)
    combine = overlap.wrap_combine(lambda h: (h + 1, "aux"), is_last_layer=True)
    np.testing.assert_array_equal(dispatch(x1, 2.0).asnumpy(), (x1 * 2.0).asnumpy())
    assert combine(x1)[1] == "aux"
    fwd_fn, bwd_fn, got = _chunks(net, x1, x2)
    overlap.run(fwd_fn=fwd_fn, bwd_fn=bwd_fn)
    np.testing.assert_array_equal(got["forward"], want["forward"])
    np.testing.assert_array_equal(got["loss"].asnumpy(), want["loss"].asnumpy())
    for g, w in zip(got["grads"], want["grads"]):
        np.testing.assert_array_equal(g, w)
    assert not overlap.coordinator.is_enabled()


def test_a_failing_backward_is_raised_after_the_forward_ran():
    ran = []

    def bwd_fn():
        raise ValueError("boom")

    with pytest.raises(RuntimeError, match="backward thread") as info:
        CommComputeOverlap().run(fwd_fn=lambda: ran.append("fwd"), bwd_fn=bwd_fn)
    assert ran == ["fwd"] and isinstance(info.value.__cause__, ValueError)
    with pytest.raises(TypeError, match="fwd_fn must be callable"):
        CommComputeOverlap().run(fwd_fn=None, bwd_fn=lambda: None)


def test_coordinator_stays_disabled_and_checks_roles():
    coordinator = HookCoordinator()
    coordinator.rendezvous(HookRole.COMM)  # disabled: returns at once, as upstream's does
    coordinator.notify_dispatched(HookRole.COMM)
    coordinator.disable()
    with pytest.raises(TypeError, match="must be HookRole"):
        coordinator.rendezvous("comm")
    with pytest.raises(RuntimeError, match="two-thread rendezvous is not simulated"):
        coordinator.enable()
    with pytest.raises(TypeError, match="is_last_layer must be a bool"):
        CommComputeOverlap().wrap_combine(lambda h: h, is_last_layer=1)
