"""Gradient accumulation: train_step(accumulation_steps=k) equals the single-device step on the
whole batch (mean loss), with the data-parallel gradient reduction recorded once per step."""
import numpy as np
import pytest
from mindspore import nn

from tolerances import U32, assert_within, gradient_tolerance, reduction_length, training_rtol
from train_helpers import BATCH, batch, exact_norm, parallel, reference_grads, strategy, twins

LR = 0.1


def batch_axis_traffic(report, axes=("data",)):
    """The report's backward collectives over the batch axes (the gradient reductions)."""
    return {(kind, axis): dict(v) for kind, by_axis in report.comm_backward.items()
            for axis, v in by_axis.items() if axis in axes}


@pytest.mark.parametrize("kind,steps", [("dp", 4), ("dxt", 2), ("zero", 4)])
def test_accumulated_step_equals_the_whole_batch_step(kind, steps):
    ref, net = twins()
    x, y = batch()
    ref_loss, ref_grads = reference_grads(ref, x, y)
    ref_arrays = [g.asnumpy() for g in ref_grads]
    reduction = reduction_length(ref.trainable_params(), BATCH)
    tolerance = gradient_tolerance(ref_arrays, reduction)
    nn.SGD(ref.trainable_params(), LR)(tuple(ref_grads))

    _, other = twins()
    plain = parallel(other, kind)
    plain_opt = nn.SGD(plain.optimizer_parameters(), LR)
    plain.train_step(plain_opt, x, y)  # k = 1: what one reduction per step looks like
    single = batch_axis_traffic(plain.report(plain_opt))

    par = parallel(net, kind)
    opt = nn.SGD(par.optimizer_parameters(), LR)
    loss = float(par.train_step(opt, x, y, accumulation_steps=steps))
    assert loss == pytest.approx(ref_loss, rel=training_rtol(reduction, 1))
    for p, want, tol in zip(ref.trainable_params(), ref_arrays, tolerance):
        assert_within(par.last_gradients[p.name], want, tol, p.name)
        moved = LR * tol + 2 * U32 * np.abs(p.asnumpy())
        assert_within(net.parameters_dict()[p.name].asnumpy(), p.asnumpy(), moved, p.name)
    assert par.last_grad_norm == pytest.approx(exact_norm(ref_grads), rel=training_rtol(reduction, 1))
    report = par.report(opt)
    assert single and batch_axis_traffic(report) == single  # one reduction per step, not `steps`
    forward = sum(v["count"] for by_axis in report.comm.values() for v in by_axis.values())
    assert forward >= steps  # every micro-batch ran its forward (the loss's mean over the batch at least)


def test_accumulation_with_clipping_and_zero():
    """accumulation_steps and max_grad_norm together: the clipped mean gradient of the whole batch."""
    ref, net = twins()
    x, y = batch(seed=5)
    _, ref_grads = reference_grads(ref, x, y)
    reduction = reduction_length(ref.trainable_params(), BATCH)
    par = parallel(net, "zero")
    opt = nn.SGD(par.optimizer_parameters(), LR)
    start = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    par.train_step(opt, x, y, accumulation_steps=2, max_grad_norm=0.05)
    norm = exact_norm(ref_grads)
    assert norm > 0.05 and par.last_grad_norm == pytest.approx(norm, rel=training_rtol(reduction, 1))
    for p, g in zip(ref.trainable_params(), ref_grads):
        moved = start[p.name] - net.parameters_dict()[p.name].asnumpy()
        want = LR * g.asnumpy() * 0.05 / norm
        rtol = training_rtol(reduction, 1)
        assert np.linalg.norm(moved - want) <= 2 * rtol * np.linalg.norm(want) + 4 * U32 * np.abs(start[p.name]).max()


def test_accumulation_refuses_bad_arguments():
    _, net = twins()
    par = parallel(net, "dp")
    opt = nn.SGD(par.optimizer_parameters(), LR)
    x, y = batch(size=12)
    with pytest.raises(ValueError, match=r"accumulation_steps=8: input 0 \(shape \(12, 16\)\) has batch size 12 on "
                                         r"dim 0, not divisible by 8"):
        par.train_step(opt, x, y, accumulation_steps=8)
    for bad in (0, -2, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"accumulation_steps=.*expected an int >= 1"):
            par.train_step(opt, x, y, accumulation_steps=bad)
    # micro-batches of 12 / 2 = 6 do not split over the 4 data devices: the message says it is a micro-batch
    with pytest.raises(ValueError, match=r"\(a micro-batch: the global batch cut into accumulation_steps=2\) cannot "
                                         r"be split as declared"):
        par.train_step(opt, x, y, accumulation_steps=2)
    assert strategy("dp").mesh.size == 4
