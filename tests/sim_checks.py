"""Checks shared by simulation tests: a simulated model equals the single-device model."""
import numpy as np
import mindspore as ms
from mindspore import Tensor

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
