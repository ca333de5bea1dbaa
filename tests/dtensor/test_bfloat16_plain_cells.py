"""A Cell holding bfloat16 parameters called outside the package (no mesh) with
`cpu_bfloat16="emulate"`: the emulation never sees its ops (they run on plain tensors), and
MindSpore's CPU kernels fail on it, in the forward (MatMul) or asynchronously in the backward (a
broadcasting Add's ReduceSum). It is refused at the call, naming the one-device simulation that
emulates it; that fix computes what numpy computes with the emulation's roundings.

Tolerance of the fix (one device, no split reduction): numpy's float32 products and sums may
differ from MindSpore's float32 kernels in the last float32 bits (gamma_4 for a 4-term dot), which
can move a rounding to bfloat16 by one bfloat16 ulp (2u relative, u = 2**-8); the forward rounds
twice (MatMul, BiasAdd), a gradient once, so the outputs are within 2 * 2u of the reference
normwise (relative to the sizes |x| |W|^T + |b| that bound each rounding) and the gradients within 2u.
"""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, nn

import mindspore_hyper as mh
from mindspore_hyper.shard import Layout

U = 2.0 ** -8  # unit roundoff of bfloat16 (8 significant bits)
RNG = np.random.default_rng(11)
FIX = r'Layout\(\(1,\), \("data",\)\)'


def _round(x) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to the even significand), as float32: on the bits."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)


class BiasOnly(nn.Cell):
    """x + b with b [3] broadcast over x [2, 3]: a forward MindSpore runs in bfloat16, a backward
    (ReduceSum of the gradient over the batch) it cannot."""

    def __init__(self):
        super().__init__()
        self.b = Parameter(Tensor(np.ones(3, np.float32)).astype(ms.bfloat16), name="b")

    def construct(self, x):
        return x + self.b


def _dense():
    ms.set_seed(3)
    return nn.Dense(4, 3, dtype=ms.bfloat16)


def _x():
    return Tensor(_round(RNG.standard_normal((2, 4)).astype(np.float32))).astype(ms.bfloat16)


def test_a_plain_bfloat16_cell_is_refused_naming_the_one_device_simulation(clean_context):
    clean_context.set_context(cpu_bfloat16="emulate")
    with pytest.raises(TypeError, match=r"Dense holds bfloat16 parameters \(weight, bias\) .*" + FIX):
        _dense()(_x())
    # the forward alone would pass (Add has a bfloat16 kernel); refused before its backward fails
    net, x = BiasOnly(), Tensor(np.ones((2, 3), np.float32)).astype(ms.bfloat16)
    with pytest.raises(TypeError, match=r"BiasOnly holds bfloat16 parameters \(b\) .*cpu_bfloat16='mindspore'"):
        ms.grad(lambda a: net(a).astype(ms.float32).sum(), None, net.trainable_params())(x)
    # a float32 Cell, and a bfloat16 one inside the package, run
    assert nn.Dense(4, 3)(Tensor(np.ones((2, 4), np.float32))).shape == (2, 3)


def test_without_the_flag_mindspore_runs_its_kernels_as_they_are(clean_context):
    with pytest.raises(TypeError, match="Unsupported data type") as failed:
        _dense()(_x())
    assert "outside the package" not in str(failed.value)


def test_the_named_fix_runs_it_emulated(clean_context):
    """The message's one-device simulation: the forward and the gradients of (y * g).sum() equal
    numpy's float32 computation rounded where the emulation rounds (module docstring)."""
    clean_context.set_context(cpu_bfloat16="emulate", device_num=1)
    net, x = _dense(), _x()
    weight, bias = (p.astype(ms.float32).asnumpy() for p in (net.weight, net.bias))
    model = mh.auto_parallelize(net, Layout((1,), ("data",))(tensor_map=()))
    outer = _round(RNG.standard_normal((2, 3)).astype(np.float32))
    y = model(x)
    grads = ms.grad(lambda a: (model(a).astype(ms.float32) * Tensor(outer)).sum(), None,
                    model.trainable_params())(x)
    xs = x.astype(ms.float32).asnumpy()
    want = _round(_round(xs @ weight.T) + bias)
    scale = np.abs(xs) @ np.abs(weight).T + np.abs(bias)
    assert y.dtype == ms.bfloat16
    got = y.astype(ms.float32).asnumpy()
    assert np.linalg.norm(got - want) <= 2 * 2 * U * np.linalg.norm(scale)
    assert not np.array_equal(_round(xs @ weight.T) + bias, want), "the roundings act"
    dy = _round(outer)  # the cast's backward rounds the float32 gradient to the output's bfloat16
    for got_grad, want_grad in zip(grads, (_round(dy.T @ xs), _round(dy.sum(0)))):
        assert got_grad.dtype == ms.bfloat16
        got_grad = got_grad.astype(ms.float32).asnumpy()
        assert np.linalg.norm(got_grad - want_grad) <= 2 * U * np.linalg.norm(want_grad)
