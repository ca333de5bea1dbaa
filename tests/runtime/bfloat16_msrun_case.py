"""An msrun case (dist_worker.py's "bf16", in the `mindspore` transport's launch): one SGD step of
test_mixed_precision.py's Block in bfloat16 (every Cell of mixed-precision type BF16 by `to_float`, float32 master weights) with
`cpu_bfloat16="emulate"`, data 2 x tensor 2 with ZeRO-1 (`_strategy`; the row-parallel `down`'s
bfloat16 partial sums reduced across processes), against the same step in a one-device simulation
emulated the same way (`Layout((1,), ("data",))`).

Tolerance (`check`; the derivation of test_mixed_precision_bfloat16.py, u = 2**-8): both sides
round to bfloat16 at the same ops; they differ where the processes split a contraction. The
row-parallel `down` sums P = TP bfloat16 partial results where one device rounds the whole sum
once: at most (P + 1) u relative, plus gamma_K of the float32 kernels (K = 64, the longest fan-in).
The loss passes that contraction once and is rounded once more: (P + 2) u + gamma_K. The
gradients pass a reduction three times (forward, two backward products) and the data-parallel
all-reduce once: 4 ((P + 1) u + gamma_K) normwise. SGD moves each float32 master weight by lr
times its gradient (one float32 rounding on each side, 2**-24 relative): the weights after the step
differ by at most lr times the gradients' difference plus the two roundings. Under ZeRO-1 a process
gets the gradient of its optimizer slice: both are compared on that slice.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/runtime/

import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402

import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper.runtime.simulation import simulate  # noqa: E402
from mindspore_hyper.shard import Layout  # noqa: E402

from tolerances import gamma  # noqa: E402
import test_mixed_precision as T  # noqa: E402

U = 2.0 ** -8  # unit roundoff of bfloat16 (8 significant bits)
K = 64  # longest fan-in of a float32 kernel accumulation (down: 64 inputs; the head's softmax: 64 classes)
LR = 0.1  # SGD's learning rate: the step moves the weights visibly


def _block():
    ms.set_seed(1)
    return T.Block().to_float(ms.bfloat16)


def run_case(case: str):
    """The distributed step (this rank), then (reference, finish) as msrun_cases.py asks: the
    reference is the one-device simulation's loss, gradients and parameters after the step,
    finish gives this rank's loss and, per parameter, the distances of its gradient (its ZeRO-1
    slice, or all it holds) and of the weight on that region from the reference's."""
    start = time.perf_counter()
    mh.set_context(cpu_bfloat16="emulate")
    net = _block()
    par = mh.auto_parallelize(net, T._strategy())
    loss = float(par.train_step(nn.SGD(par.optimizer_parameters(), learning_rate=LR), *T.BATCH[0]).asnumpy())
    held = {}
    for name, p in net.parameters_and_names():
        grad = par.last_gradients[name].astype(np.float64)  # with ZeRO-1 the slice this process updates
        grad_region = par.held_region(name, optimizer=True)
        if grad.shape != tuple(r.stop - r.start for r in grad_region):
            grad_region = par.held_region(name)
        value = p.asnumpy()[tuple(slice(r.start - h.start, r.stop - h.start)
                                  for r, h in zip(grad_region, par.held_region(name)))]
        held[name] = (grad_region, grad, value.astype(np.float64))  # the weight where this gradient moved it
    working = set(par.report().memory_by_dtype[par.local_ranks[0]].get("working_weights", {}))
    seconds = time.perf_counter() - start  # what the case adds to a launch (reported, not asserted)

    def reference() -> dict:
        devices = mh.get_context("device_num")
        mh.set_context(device_num=1)
        try:
            one = _block()
            sim = simulate(one, Layout((1,), ("data",))(tensor_map=()))
            ref_loss = sim.train_step(nn.SGD(sim.optimizer_parameters(), learning_rate=LR), *T.BATCH[0])
            return {"loss": float(ref_loss.asnumpy()), "grads": dict(sim.last_gradients),
                    "params": {n: p.asnumpy() for n, p in one.parameters_and_names()}}
        finally:
            mh.set_context(device_num=devices)

    def finish(expected: dict) -> dict:
        params = {}
        for name, (region, grad, value) in held.items():
            want_grad = expected["grads"][name][region].astype(np.float64)
            want = expected["params"][name][region].astype(np.float64)
            params[name] = [float(np.linalg.norm(grad - want_grad)), float(np.linalg.norm(want_grad)),
                            float(np.linalg.norm(value - want)), float(np.linalg.norm(want))]
        return {"loss": loss, "ref_loss": expected["loss"], "params": params, "working_weights": sorted(working),
                "seconds": seconds}

    return reference, finish


def check(result: dict, what: str) -> None:
    """Assert one rank's `finish` result is within the derived bounds (module docstring)."""
    loss, want = result["loss"], result["ref_loss"]
    assert abs(loss - want) <= ((T.TP + 2) * U + gamma(K)) * abs(want), (what, loss, want)
    rtol = 4 * ((T.TP + 1) * U + gamma(K))
    for name, (grad_diff, grad_norm, diff, norm) in result["params"].items():
        assert grad_diff <= rtol * grad_norm, (what, name, "gradient", grad_diff, grad_norm)
        assert diff <= LR * rtol * grad_norm + 2 * 2.0 ** -24 * norm, (what, name, "weight", diff, norm)
    assert result["working_weights"] == ["bfloat16"], (what, result["working_weights"])
