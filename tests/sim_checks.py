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
    the first step's gradients, every step's loss and the final parameters equal. Returns the
    simulated model."""
    reference = build()
    ref_forward = reference(*inputs).asnumpy()
    ref_opt = nn.Momentum(reference.trainable_params(), 0.05, 0.9)
    ref_losses, ref_grads = [], None
    for _ in range(steps):
        loss, grads = ms.value_and_grad(reference, None, ref_opt.parameters)(*inputs, *labels)
        ref_grads = ref_grads or [g.asnumpy() for g in grads]
        ref_opt(grads)
        ref_losses.append(float(loss))

    net = build()
    mh.set_context(mode="simulation", device_num=strategy.mesh.size)
    parallel = mh.auto_parallelize(net, strategy)
    forward = parallel(*inputs).asnumpy()
    np.testing.assert_allclose(forward, ref_forward, rtol=1e-5, atol=1e-5 * np.abs(ref_forward).max())
    optimizer = nn.Momentum(parallel.optimizer_parameters(), 0.05, 0.9)
    for step in range(steps):
        loss = float(parallel.train_step(optimizer, *inputs, *labels))
        assert loss == pytest.approx(ref_losses[step], rel=1e-5), f"step {step}"
        if step == 0:
            scale = max(np.abs(g).max() for g in ref_grads)
            for param, grad in zip(ref_opt.parameters, ref_grads):
                np.testing.assert_allclose(parallel.last_gradients[param.name], grad, rtol=1e-5, atol=1e-5 * scale,
                                           err_msg=param.name)
    for (name, ref_param), (_, param) in zip(reference.parameters_and_names(), net.parameters_and_names()):
        np.testing.assert_allclose(param.asnumpy(), ref_param.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    return parallel
