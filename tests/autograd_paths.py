"""The two ways a loss is differentiated in PyNative: `mindspore.value_and_grad` and MindSpore's
`run_backward` (what torch-style `loss.backward()` runs, `hyper_parallel/autograd_compat.py`)."""
import mindspore as ms
from mindspore import ops
from mindspore._c_expression import run_backward
from mindspore.graph.api import _pynative_executor


def both_ways(loss, params):
    """(value_and_grad's gradients, run_backward's accumulated ones) of `loss()` over `params`,
    as numpy arrays."""
    _, grads = ms.value_and_grad(loss, None, params)()
    _pynative_executor.set_grad_flag(True)  # what enable_mindspore_backward_compat() turns on
    try:
        total = loss()
        run_backward((total,), (ops.ones_like(total),), False, False, (), allow_unreachable=True,
                     accumulate_grad=True)
    finally:
        _pynative_executor.set_grad_flag(False)
    return [g.asnumpy() for g in grads], [p._grad.asnumpy() for p in params]  # pylint: disable=protected-access
