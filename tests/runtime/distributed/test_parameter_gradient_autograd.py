"""`DistributedModel`'s parameter gradient sum (`_ParameterGradient`: identity forward, the
gradient's sum over the group in the backward) differentiates the same through
`mindspore.value_and_grad` and through MindSpore's `run_backward` (torch-style `loss.backward()`),
which could not run its former custom-bprop Cell.

One process, one member of a data-parallel group of 2 whose other member's contribution equals
this one's (a mirror model: the sum is twice the contribution)."""
import numpy as np
from mindspore import Parameter, Tensor

from mindspore_hyper.comm.collectives import AxisGroup
from mindspore_hyper.runtime.distributed.distributed_model import _ParameterGradient
from autograd_paths import both_ways

X = np.random.default_rng(7).standard_normal((3, 4)).astype(np.float32)
C = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)


class _Mirror:
    """A model whose gradient sum over the group of 2 is twice this member's contribution."""

    def __init__(self):
        self.calls = []

    def sum_parameter_gradient(self, slot, group, dout):
        self.calls.append((slot, group, dout.asnumpy().copy()))
        return dout * 2


def test_value_and_grad_and_run_backward_sum_the_gradient_over_the_group():
    model, group = _Mirror(), AxisGroup("data", (0, 1), (0,))
    w = Parameter(Tensor(np.ones((3, 4), np.float32)), name="w")
    fan_out = _ParameterGradient(model, "slot of w", group)

    def loss():
        shard = fan_out(w)
        np.testing.assert_array_equal(shard.asnumpy(), w.asnumpy())  # identity forward
        return (shard * Tensor(X) * Tensor(C)).sum()

    want = 2 * (X * C)  # the contribution x * c (one float32 product, as numpy's) summed over 2 equal members
    (by_value_and_grad,), (by_run_backward,) = both_ways(loss, [w])
    np.testing.assert_array_equal(by_value_and_grad, want)
    np.testing.assert_array_equal(by_run_backward, want)
    assert [(slot, g) for slot, g, _ in model.calls] == [("slot of w", group)] * 2  # once per backward
    for _, _, dout in model.calls:
        np.testing.assert_array_equal(dout, X * C)
