"""Checks shared by simulation tests: a simulated model equals the single-device model."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn

import mindspore_hyper as mh
from mindspore_hyper.shard import Layout
from mindspore_hyper.runtime.simulation import simulate


def assert_same_as_single_device(model, strategy, *inputs, rtol=1e-5):
    """Forward equal, and gradients of sum(output) w.r.t. every parameter equal (relative to the
    largest gradient). Returns the simulated model."""
    mh.set_context(device_num=strategy.mesh.size)
    params = model.trainable_params()
    ref = model(*inputs).asnumpy()
    ref_grads = [g.asnumpy() for g in ms.grad(lambda *a: model(*a).sum(), None, params)(*inputs)]
    sim = simulate(model, strategy)
    out = sim(*inputs)
    assert type(out) is Tensor
    np.testing.assert_allclose(out.asnumpy(), ref, rtol=rtol, atol=rtol * np.abs(ref).max())
    grads = [g.asnumpy() for g in ms.grad(lambda *a: sim(*a).sum(), None, params)(*inputs)]
    scale = max(np.abs(g).max() for g in ref_grads)
    for p, g, r in zip(params, grads, ref_grads):
        np.testing.assert_allclose(g, r, rtol=rtol, atol=rtol * scale, err_msg=p.name)
    return sim


def tp_strategy(mesh, input_map=None):
    """Megatron-style: q/k/v/up column parallel, proj/down row parallel over 'tensor'."""
    s = mesh(tensor_map=(), input_map=input_map)
    for name in ("attn.q", "attn.k", "attn.v", "mlp.up"):
        s.override(f"*{name}.*", "tensor")
    for name in ("attn.proj", "mlp.down"):
        s.override(f"*{name}.weight", None, "tensor")
    return s


MESHES = {
    "8": Layout((8,), ("data",)),
    "2x4": Layout((2, 4), ("data", "tensor")),
    "2x2x2": Layout((2, 2, 2), ("data", "tensor", "seq")),
}


def trains_like_single_device(build, inputs, labels, strategy, steps=5):
    """`build()`'s model on one device and simulated under `strategy` (momentum SGD): the forward,
    the first step's gradients, every step's loss and the final parameters equal up to float32
    rounding in any order (tests/tolerances.py). Returns the simulated model."""
    from tolerances import U32, assert_within, gradient_tolerance, reduction_length, training_rtol

    lr, momentum = 0.05, 0.9
    reference = build()
    ref_forward = reference(*inputs).asnumpy()
    ref_opt = nn.Momentum(reference.trainable_params(), lr, momentum)
    tokens = max(int(np.prod(x.shape if x.dtype in (ms.int32, ms.int64) else x.shape[:-1])) for x in inputs)
    reduction = reduction_length(ref_opt.parameters, tokens)
    ref_losses, ref_grads, grad_tols, grad_max = [], None, [], None
    for _ in range(steps):
        loss, grads = ms.value_and_grad(reference, None, ref_opt.parameters)(*inputs, *labels)
        grads = [g.asnumpy() for g in grads]
        ref_grads = ref_grads or grads
        grad_tols.append(gradient_tolerance(grads, reduction))
        grad_max = [np.abs(g) if m is None else np.maximum(m, np.abs(g)) for g, m in zip(grads, grad_max or [None] * len(grads))]
        ref_opt(tuple(Tensor(g) for g in grads))
        ref_losses.append(float(loss))

    net = build()
    mh.set_context(mode="simulation", device_num=strategy.mesh.size)
    parallel = mh.auto_parallelize(net, strategy)
    forward = parallel(*inputs).asnumpy()
    rtol = training_rtol(reduction, 1)
    np.testing.assert_allclose(forward, ref_forward, rtol=rtol, atol=rtol * np.abs(ref_forward).max())
    optimizer = nn.Momentum(parallel.optimizer_parameters(), lr, momentum)
    for step in range(steps):
        loss = float(parallel.train_step(optimizer, *inputs, *labels))
        assert loss == pytest.approx(ref_losses[step], rel=training_rtol(reduction, step + 1)), f"step {step}"
        if step == 0:
            for param, grad, tol in zip(ref_opt.parameters, ref_grads, grad_tols[0]):
                assert_within(parallel.last_gradients[param.name], grad, tol, param.name)
    # Momentum is linear in the gradients: step t moves a parameter by lr * sum_{s<=t} momentum^(t-s) g_s,
    # so gradients within tol_s of the reference's move it by at most lr * sum_t sum_{s<=t} momentum^(t-s)
    # tol_s (to first order: the parameters' own difference changes later gradients by as little),
    # plus the roundings of each step's update (the momentum at most |g| / (1 - momentum)).
    for i, param in enumerate(ref_opt.parameters):
        moved = sum(lr * momentum ** (t - s) * grad_tols[s][i] for t in range(steps) for s in range(t + 1))
        want = param.asnumpy()
        bound = moved + 2 * U32 * steps * (np.abs(want) + lr * grad_max[i] / (1 - momentum))
        assert_within(net.parameters_dict()[param.name].asnumpy(), want, bound, param.name)
    trained = {p.name for p in ref_opt.parameters}
    for name, buffer in reference.parameters_and_names():  # buffers written in the forward, if any
        if buffer.name not in trained:
            want = buffer.asnumpy()
            bound = training_rtol(reduction, steps) * (np.abs(want) + np.abs(want).max())
            assert_within(net.parameters_dict()[buffer.name].asnumpy(), want, bound, name)
    return parallel
