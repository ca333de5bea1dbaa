"""`LibraryCollectives` (simulation through the C++ library's in-process transport) differentiate
the same through `mindspore.value_and_grad` and through MindSpore's `run_backward` (torch-style
`loss.backward()`), which could not run their former custom-bprop Cells.

Two members in this process, member i's tensor a_i = x_i * w_i and the loss sum_i sum(c_i * out_i):
each collective's forward and the gradient it passes back are written in numpy below."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, ops
from mindspore._c_expression import run_backward
from mindspore.graph.api import _pynative_executor

from mindspore_hyper.comm.collective_cause import set_cause
from mindspore_hyper.comm.collectives import AxisGroup
from mindspore_hyper.comm.library_collectives import LibraryCollectives

RNG = np.random.default_rng(5)
X = [RNG.standard_normal((4, 6)).astype(np.float32) for _ in range(2)]
W = [RNG.standard_normal((4, 6)).astype(np.float32) for _ in range(2)]


def _halves(a, dim):
    return np.array_split(a, 2, axis=dim)


def _winners(a, op):
    """Per member, where it holds the max/min (ties split evenly)."""
    pick = np.maximum if op == "max" else np.minimum
    hits = [(x == pick(*a)).astype(np.float32) for x in a]
    return [h / (hits[0] + hits[1]) for h in hits]


# name -> (the collective on the members' tensors, their outputs in numpy, the gradients they pass
# back for the outputs' gradients c, in numpy)
CASES = {
    "all_reduce sum": (lambda lc, g, a: lc.all_reduce(a, "sum", g), lambda a: [a[0] + a[1]] * 2,
                       lambda a, c: [c[0] + c[1]] * 2),
    "all_reduce avg": (lambda lc, g, a: lc.all_reduce(a, "avg", g), lambda a: [(a[0] + a[1]) / 2] * 2,
                       lambda a, c: [(c[0] + c[1]) / 2] * 2),
    "all_reduce max": (lambda lc, g, a: lc.all_reduce(a, "max", g), lambda a: [np.maximum(*a)] * 2,
                       lambda a, c: [(c[0] + c[1]) * h for h in _winners(a, "max")]),
    "all_gather, gradient partial": (lambda lc, g, a: lc.all_gather(a, 0, g, grad_partial=True),
                                     lambda a: [np.concatenate(a, 0)] * 2, lambda a, c: _halves(c[0] + c[1], 0)),
    "reduce_scatter sum": (lambda lc, g, a: lc.reduce_scatter(a, 1, "sum", g), lambda a: _halves(a[0] + a[1], 1),
                           lambda a, c: [np.concatenate(c, 1)] * 2),
    "reduce_scatter avg": (lambda lc, g, a: lc.reduce_scatter(a, 0, "avg", g),
                           lambda a: _halves((a[0] + a[1]) / 2, 0), lambda a, c: [np.concatenate(c, 0) / 2] * 2),
    "all_to_all": (lambda lc, g, a: lc.all_to_all(a, 0, 1, g),
                   lambda a: [np.concatenate([_halves(x, 0)[j] for x in a], 1) for j in range(2)],
                   lambda a, c: [np.concatenate([_halves(cj, 1)[i] for cj in c], 0) for i in range(2)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_value_and_grad_and_run_backward_give_the_closed_form(name):
    collective, value, gradient = CASES[name]
    records = []
    lc = LibraryCollectives(recorder=lambda *row: records.append(row))
    group = AxisGroup.whole(2, "dp")
    ws = [Parameter(Tensor(w), name=f"w{i}") for i, w in enumerate(W)]
    a = [x * w for x, w in zip(X, W)]
    outs = value(a)
    c = [np.linspace(-1, 1, o.size, dtype=np.float32).reshape(o.shape) for o in outs]

    def loss():
        previous = set_cause("the forward's cause")
        try:
            got = collective(lc, group, [Tensor(x) * w for x, w in zip(X, ws)])
        finally:
            set_cause(previous)
        for g, o in zip(got, outs):  # exact but for avg's halving of a sum (the same float32 ops as numpy's)
            np.testing.assert_allclose(g.asnumpy(), o, rtol=1e-7, atol=0)
        return sum((g * Tensor(ci)).sum() for g, ci in zip(got, c))

    _, grads = ms.value_and_grad(loss, None, ws)()
    # grad of sum_i sum(c_i * out_i) over w_i: x_i times the gradient passed back to a_i; a product
    # of float32 terms each (sums of two, halvings): within 2 ulps of numpy's float32 arithmetic
    want = [x * g for x, g in zip(X, gradient(a, c))]
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g.asnumpy(), w, rtol=2.5e-7, atol=0)
    recorded = list(records)

    _pynative_executor.set_grad_flag(True)  # what enable_mindspore_backward_compat() turns on
    try:
        records.clear()
        total = loss()
        run_backward((total,), (ops.ones_like(total),), False, False, (), allow_unreachable=True,
                     accumulate_grad=True)
    finally:
        _pynative_executor.set_grad_flag(False)
    for w, g in zip(ws, grads):
        np.testing.assert_array_equal(w._grad.asnumpy(), g.asnumpy())
    assert records == recorded  # the same backward traffic, under the forward's cause
    assert all(row[-1] == "the forward's cause" for row in records)
