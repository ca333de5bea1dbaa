"""`ProcessCollectives` (msrun's collectives, one group member per process) differentiate the same
through `mindspore.value_and_grad` and through MindSpore's `run_backward` (torch-style
`loss.backward()`), which could not run their former custom-bprop Cells.

One process, member 0 of a group of 2 whose other member holds the same values as this one (a
mirror communicator: a sum over the group is twice this member's array, a gather two copies):
each collective's forward and backward then have closed forms, written in numpy below."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, ops
from mindspore._c_expression import run_backward
from mindspore.graph.api import _pynative_executor

from mindspore_hyper.comm.collective_cause import set_cause
from mindspore_hyper.comm.collectives import AxisGroup
from mindspore_hyper.comm.process_collectives import ProcessCollectives


class _Mirror:
    """A communicator of 2 members, this one member 0, the other holding the same arrays."""

    def all_reduce(self, a, op):
        return 2 * a if op == "sum" else a.copy()  # avg, max, min of two equal arrays

    def all_gather(self, a, dim):
        return np.concatenate([a, a], dim)

    def reduce_scatter(self, a, dim, op):
        piece = np.array_split(a, 2, axis=dim)[0]
        return 2 * piece if op == "sum" else piece.copy()

    def all_to_all(self, a, split_dim, concat_dim):
        piece = np.array_split(a, 2, axis=split_dim)[0]  # member 0's piece, from both members
        return np.concatenate([piece, piece], concat_dim)

    def broadcast(self, a, root):
        return a.copy()


X = np.random.RandomState(0).randn(4, 6).astype(np.float32)
W = np.random.RandomState(1).randn(4, 6).astype(np.float32)


def _halves(a, dim):
    return np.array_split(a, 2, axis=dim)


# name -> (the collective on this member's tensor a = x * w, its value in numpy, the gradient it
# passes back for an upstream gradient c, in numpy)
CASES = {
    "all_reduce sum": (lambda pc, g, a: pc.all_reduce([a], "sum", g)[0], lambda a: 2 * a, lambda c: c),
    "all_reduce avg": (lambda pc, g, a: pc.all_reduce([a], "avg", g)[0], lambda a: a, lambda c: c / 2),
    # max: both members win every element, so each gets half the gradient (ties split evenly)
    "all_reduce max": (lambda pc, g, a: pc.all_reduce([a], "max", g)[0], lambda a: a, lambda c: c / 2),
    "all_gather": (lambda pc, g, a: pc.all_gather([a], 1, g)[0], lambda a: np.concatenate([a, a], 1),
                   lambda c: _halves(c, 1)[0]),
    "all_gather, gradient partial": (lambda pc, g, a: pc.all_gather([a], 0, g, grad_partial=True)[0],
                                     lambda a: np.concatenate([a, a], 0), lambda c: 2 * _halves(c, 0)[0]),
    "reduce_scatter sum": (lambda pc, g, a: pc.reduce_scatter([a], 0, "sum", g)[0], lambda a: 2 * _halves(a, 0)[0],
                           lambda c: np.concatenate([c, c], 0)),
    "reduce_scatter avg": (lambda pc, g, a: pc.reduce_scatter([a], 1, "avg", g)[0], lambda a: _halves(a, 1)[0],
                           lambda c: np.concatenate([c, c], 1) / 2),
    "reduce_scatter min": (lambda pc, g, a: pc.reduce_scatter([a], 0, "min", g)[0], lambda a: _halves(a, 0)[0],
                           lambda c: np.concatenate([c, c], 0) / 2),
    "all_to_all": (lambda pc, g, a: pc.all_to_all([a], 0, 1, g)[0],
                   lambda a: np.concatenate([_halves(a, 0)[0]] * 2, 1),
                   lambda c: np.concatenate([_halves(c, 1)[0]] * 2, 0)),
    "local_slice": (lambda pc, g, a: pc.local_slice(a, 0, g)[0], lambda a: _halves(a, 0)[0],
                    lambda c: np.concatenate([c, c], 0)),
    "make_partial": (lambda pc, g, a: pc.make_partial(a, "sum", g)[0], lambda a: a, lambda c: c),
    "fan_out": (lambda pc, g, a: pc.fan_out(a, g), lambda a: a, lambda c: 2 * c),
    "broadcast": (lambda pc, g, a: pc.broadcast([a], 0, g)[0], lambda a: a, lambda c: c),
}


@pytest.mark.parametrize("name", list(CASES))
def test_value_and_grad_and_run_backward_give_the_closed_form(name):
    collective, value, gradient = CASES[name]
    records = []
    pc = ProcessCollectives(lambda ranks: _Mirror(), recorder=lambda *row: records.append(row))
    group = AxisGroup("dp", (0, 1), (0,))
    x, w = Tensor(X), Parameter(Tensor(W), name="w")

    def loss():
        previous = set_cause("the forward's cause")
        try:
            out = collective(pc, group, x * w)
        finally:
            set_cause(previous)
        c = Tensor(np.linspace(-1, 1, out.size, dtype=np.float32).reshape(out.shape))
        return (out * c).sum(), out, c

    (total, out, c), (grad,) = ms.value_and_grad(loss, None, [w], has_aux=True)()
    np.testing.assert_array_equal(out.asnumpy(), value(X * W))  # the forward moves values, exact
    # grad of sum(c * f(x * w)) over w: x times the gradient f passes back for c; one float32
    # product (and a halving, exact) per element: equal to numpy's float32 product
    want = X * gradient(c.asnumpy())
    np.testing.assert_array_equal(grad.asnumpy(), want)
    recorded = list(records)

    _pynative_executor.set_grad_flag(True)  # what enable_mindspore_backward_compat() turns on
    try:
        records.clear()
        total, _, _ = loss()
        run_backward((total,), (ops.ones_like(total),), False, False, (), allow_unreachable=True,
                     accumulate_grad=True)
    finally:
        _pynative_executor.set_grad_flag(False)
    np.testing.assert_array_equal(w._grad.asnumpy(), want)
    assert records == recorded  # the same backward traffic, under the forward's cause
    assert all(row[-1] == "the forward's cause" for row in records)
