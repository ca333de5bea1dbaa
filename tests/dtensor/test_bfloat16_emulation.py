"""The bfloat16 emulation (`cpu_bfloat16="emulate"`, mindspore_hyper/bfloat16_emulation.py): its table
is MindSpore's CPU kernels' gaps, an emulated op is the float32 kernel rounded once to bfloat16
(bitwise: the same kernel on the same values), and the flag is validated.

The per-op references are MindSpore's own float32 kernels on one device with the same inputs, on
replicated DTensors (every device runs the op on the whole tensor, so the kernel sees the shapes
one device sees); the rounding is checked against a numpy round-to-nearest-even.
"""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops
from mindspore.graph.api import _pynative_executor

from mindspore_hyper import bfloat16_emulation
from mindspore_hyper.dtensor import distribute_tensor
from mindspore_hyper.dtensor.dispatch import DTensorOpError
from mindspore_hyper.shard import Layout
from mindspore_hyper.shard.tensor_layout import TensorLayout

RNG = np.random.default_rng(0)
A = RNG.standard_normal((4, 8)).astype(np.float32)
IDX = np.array([0, 2, 1, 3], np.int32)


def _t(x, dtype):
    return Tensor(x).astype(dtype)


# one call per op name of NO_BFLOAT16_CPU_KERNEL (it reaches the dispatcher under that name)
PROBES = {
    "MatMul": lambda d: ops.MatMul()(_t(A, d), _t(A.T, d)),
    "MatMulExt": lambda d: ops.matmul(_t(A, d), _t(A.T, d)),
    "BatchMatMul": lambda d: ops.BatchMatMul()(_t(A[None], d), _t(A.T[None], d)),
    "BatchMatMulExt": lambda d: ops.bmm(_t(A[None], d), _t(A.T[None], d)),
    "Dense": lambda d: ops.dense(_t(A, d), _t(A, d)),
    "BiasAdd": lambda d: ops.bias_add(_t(A, d), _t(A[0], d)),
    "Conv2D": lambda d: ops.conv2d(_t(A.reshape(1, 2, 4, 4), d), _t(A[:2].reshape(2, 2, 2, 2), d)),
    "Softmax": lambda d: ops.softmax(_t(A, d), -1),
    "LogSoftmax": lambda d: ops.log_softmax(_t(A, d), -1),
    "LayerNorm": lambda d: ops.LayerNorm(1, 1)(_t(A, d), _t(np.ones(8, np.float32), d), _t(np.zeros(8, np.float32), d)),
    "GeLU": lambda d: ops.GeLU()(_t(A, d)),
    "FastGeLU": lambda d: ops.fast_gelu(_t(A, d)),
    "ReLU": lambda d: ops.relu(_t(A, d)),
    "SiLU": lambda d: ops.silu(_t(A, d)),
    "Sigmoid": lambda d: ops.sigmoid(_t(A, d)),
    "Tanh": lambda d: ops.tanh(_t(A, d)),
    "Exp": lambda d: ops.exp(_t(A, d)),
    "Log": lambda d: ops.log(_t(np.abs(A) + 1, d)),
    "Abs": lambda d: ops.abs(_t(A, d)),
    "Sqrt": lambda d: ops.sqrt(_t(np.abs(A), d)),
    "Rsqrt": lambda d: ops.rsqrt(_t(np.abs(A) + 1, d)),
    "Erf": lambda d: ops.erf(_t(A, d)),
    "Pow": lambda d: ops.pow(_t(A, d), 3.0),
    "PowTensorScalar": lambda d: _t(A, d) ** 2,
    "Square": lambda d: ops.square(_t(A, d)),
    "Maximum": lambda d: ops.maximum(_t(A, d), _t(A * 0.5, d)),
    "Minimum": lambda d: ops.minimum(_t(A, d), _t(A * 0.5, d)),
    "Sin": lambda d: ops.sin(_t(A, d)),
    "Cos": lambda d: ops.cos(_t(A, d)),
    "Floor": lambda d: ops.floor(_t(A, d)),
    "ClampScalar": lambda d: ops.clamp(_t(A, d), -1.0, 1.0),
    "OnesLike": lambda d: ops.ones_like(_t(A, d)),
    "SumExt": lambda d: _t(A, d).sum(-1),
    "DeprecatedSum": lambda d: ops.ReduceSum()(_t(A, d), -1),
    "MeanExt": lambda d: ops.mean(_t(A, d), -1),
    "DeprecatedMean": lambda d: _t(A, d).mean(-1, keep_dims=True),
    "ReduceSum": lambda d: ops.ReduceSum(keep_dims=True)(_t(A, d), -1),
    "ReduceMean": lambda d: ops.ReduceMean(keep_dims=True)(_t(A, d), -1),
    "ReduceMax": lambda d: ops.ReduceMax()(_t(A, d), -1),
    "ReduceMin": lambda d: ops.ReduceMin()(_t(A, d), -1),
    "MaxDim": lambda d: _t(A, d).max(-1),
    "MinDim": lambda d: _t(A, d).min(-1),
    "CumSum": lambda d: ops.cumsum(_t(A, d), 1),
    "Argmax": lambda d: ops.argmax(_t(A, d), -1),
    "TopK": lambda d: ops.topk(_t(A, d), 2),
    "Greater": lambda d: _t(A, d) > _t(A * 0.5, d),
    "GreaterScalar": lambda d: _t(A, d) > 0.5,
    "Less": lambda d: _t(A, d) < _t(A * 0.5, d),
    "LessScalar": lambda d: _t(A, d) < 0.5,
    "Equal": lambda d: _t(A, d) == _t(A, d),
    "Select": lambda d: ops.select(Tensor(A > 0), _t(A, d), _t(A * 2, d)),
    "MaskedFill": lambda d: ops.masked_fill(_t(A, d), Tensor(A > 0), Tensor(0.0, d)),
    "Gather": lambda d: ops.gather(_t(A, d), Tensor(IDX), 0),
    "GatherD": lambda d: ops.gather_elements(_t(A, d), 1, Tensor(np.zeros((4, 8), np.int32))),
    "Tile": lambda d: ops.tile(_t(A, d), (1, 2)),
    "Stack": lambda d: ops.stack((_t(A, d), _t(A, d))),
    "Identity": lambda d: ops.deepcopy(_t(A, d)),
    "OneHot": lambda d: ops.one_hot(Tensor(IDX), 8, Tensor(1.0, d), Tensor(0.0, d)),
    "SparseSoftmaxCrossEntropyWithLogits": lambda d: ops.SparseSoftmaxCrossEntropyWithLogits()(_t(A, d), Tensor(IDX)),
    "SoftmaxCrossEntropyWithLogits": lambda d: ops.SoftmaxCrossEntropyWithLogits()(
        _t(A, d), _t(np.full((4, 8), 0.125, np.float32), d)),
}

# ops whose bfloat16 CPU kernel exists (docs/training.md lists them): not emulated
SUPPORTED = {
    "AddExt": lambda d: _t(A, d) + _t(A, d), "SubExt": lambda d: _t(A, d) - _t(A, d),
    "Mul": lambda d: _t(A, d) * _t(A, d), "Div": lambda d: _t(A, d) / _t(A + 5, d), "Neg": lambda d: -_t(A, d),
    "AddScalar": lambda d: _t(A, d) + 1.0, "Muls": lambda d: _t(A, d) * 0.5, "Divs": lambda d: _t(A, d) / 3.0,
    "AddN": lambda d: ops.addn([_t(A, d), _t(A, d)]), "Cast": lambda d: ops.cast(_t(A, d), ms.float32),
    "Reshape": lambda d: _t(A, d).reshape(8, 4), "Transpose": lambda d: _t(A, d).T,
    "Concat": lambda d: ops.concat((_t(A, d), _t(A, d))), "StridedSlice": lambda d: _t(A, d)[:, 1:3],
    "Split": lambda d: ops.split(_t(A, d), 4, 1)[0],
    "BroadcastTo": lambda d: ops.broadcast_to(_t(A[None], d), (2, 4, 8)),
    "ZerosLike": lambda d: ops.zeros_like(_t(A, d)),
}


def _runs(probe, dtype) -> bool:
    try:
        out = probe(dtype)
        for value in out if isinstance(out, (tuple, list)) else (out,):
            value.asnumpy()
        return True
    except (TypeError, RuntimeError, ValueError):
        try:  # MindSpore re-raises an asynchronous kernel failure until its pipeline is synchronised
            _pynative_executor.sync()
        except (TypeError, RuntimeError, ValueError):
            pass
        return False


def test_the_table_is_mindspores_cpu_kernel_gaps():
    """Every op of the table runs in float32 and fails in bfloat16 on one CPU device; the ops
    outside it that the docs name as bfloat16-capable run."""
    assert set(PROBES) == set(bfloat16_emulation.NO_BFLOAT16_CPU_KERNEL)
    wrong = [name for name, probe in PROBES.items() if not _runs(probe, ms.float32) or _runs(probe, ms.bfloat16)]
    assert not wrong, f"these ops have a bfloat16 CPU kernel in MindSpore {ms.__version__} (or no float32 one): {wrong}"
    missing = [name for name, probe in SUPPORTED.items() if not _runs(probe, ms.bfloat16)]
    assert not missing, f"no bfloat16 CPU kernel in MindSpore {ms.__version__}: {missing}"


def _round_to_nearest_even(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest bfloat16 (ties to the even significand), as float32: on the bits."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return rounded.astype(np.uint32).view(np.float32)


def _replicated(x: np.ndarray, dtype):
    mesh = Layout((2, 2), ("data", "tensor"))
    return distribute_tensor(Tensor(x).astype(dtype), TensorLayout.replicated(mesh, x.ndim))


CASES = {  # name: (op on DTensors or plain tensors, float32 inputs)
    "MatMulExt": (lambda x, w: ops.matmul(x, w), (A, RNG.standard_normal((8, 6)).astype(np.float32))),
    "Softmax": (lambda x: ops.softmax(x, -1), (A,)),
    "TopK": (lambda x: ops.topk(x, 3), (A,)),
    "Argmax": (lambda x: ops.argmax(x, -1), (A,)),
    "Greater": (lambda x, y: x > y, (A, A[::-1].copy())),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_emulated_op_is_the_float32_kernel_rounded_once(clean_context, name):
    clean_context.set_context(cpu_bfloat16="emulate")
    op, inputs = CASES[name]
    bf16_inputs = [_round_to_nearest_even(x) for x in inputs]  # exact in bfloat16 and in float32
    got = op(*[_replicated(x, ms.bfloat16) for x in bf16_inputs])
    want = op(*[Tensor(x) for x in bf16_inputs])  # MindSpore's float32 kernel, one device
    got, want = (v if isinstance(v, tuple) else (v,) for v in (got, want))
    for g, w in zip(got, want):
        w = w.asnumpy()
        if w.dtype == np.float32:
            assert g.dtype == ms.bfloat16, f"{name}: a floating output is bfloat16"
            np.testing.assert_array_equal(g.full_tensor().astype(ms.float32).asnumpy(), _round_to_nearest_even(w))
        else:
            assert g.full_tensor().asnumpy().dtype == w.dtype, f"{name}: integer and boolean outputs keep their dtype"
            np.testing.assert_array_equal(g.full_tensor().asnumpy(), w)


def test_mindspores_cast_rounds_to_nearest_even():
    """What the emulation's outputs rely on; ties included (1 + 2^-8 is halfway between 1 and 1 + 2^-7)."""
    x = np.concatenate([RNG.standard_normal(4096).astype(np.float32),
                        np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 2 ** -130], np.float32)])
    got = ops.cast(ops.cast(Tensor(x), ms.bfloat16), ms.float32).asnumpy()
    np.testing.assert_array_equal(got, _round_to_nearest_even(x))


def test_a_bfloat16_cell_rounds_float32_inputs_first(clean_context):
    """In a Cell of mixed-precision type BF16 the float32 weight reaches the kernel as bfloat16 (its
    kernel launch casts it): the emulation rounds it too, then computes in float32; a float32 Cell
    inside it runs its ops in float32 (not emulated, float32 outputs)."""
    clean_context.set_context(cpu_bfloat16="emulate")
    dense = nn.Dense(8, 6, has_bias=False).to_float(ms.bfloat16)
    x = _round_to_nearest_even(A)
    out = dense(_replicated(x, ms.float32))
    w = _round_to_nearest_even(dense.weight.asnumpy())
    want = ops.matmul(Tensor(x), Tensor(w).T).asnumpy()
    assert out.dtype == ms.bfloat16
    np.testing.assert_array_equal(out.full_tensor().astype(ms.float32).asnumpy(), _round_to_nearest_even(want))

    class Outer(nn.Cell):
        def __init__(self):
            super().__init__()
            self.inner = nn.Softmax().to_float(ms.float32)

        def construct(self, x):
            return self.inner(x)

    soft = Outer().to_float(ms.bfloat16)
    soft.inner.to_float(ms.float32)
    y = soft(_replicated(x, ms.bfloat16))
    assert y.full_tensor().dtype == ms.float32, "a float32 Cell's kernel gets float32: no emulation"


def test_flag_is_validated(clean_context, monkeypatch):
    with pytest.raises(ValueError, match="cpu_bfloat16='yes': expected one of 'mindspore', 'emulate'"):
        clean_context.set_context(cpu_bfloat16="yes")
    assert clean_context.get_context("cpu_bfloat16") == "mindspore"
    monkeypatch.setenv("MS_HYPER_CPU_BFLOAT16", "emulate")
    assert clean_context.get_context("cpu_bfloat16") == "emulate"


def test_flag_refused_off_the_cpu(clean_context, monkeypatch):
    """On a device whose kernels take bfloat16 there is nothing to emulate: refused, naming the flag."""
    clean_context.set_context(cpu_bfloat16="emulate")
    real = ms.get_context
    monkeypatch.setattr(ms, "get_context", lambda key: "Ascend" if key == "device_target" else real(key))
    with pytest.raises(ValueError, match="cpu_bfloat16='emulate'.*'Ascend'"):
        ops.matmul(_replicated(A, ms.bfloat16), _replicated(A.T.copy(), ms.bfloat16))


def test_an_op_outside_the_table_is_refused_naming_it(clean_context):
    """With the flag on, a bfloat16 failure of an op the table lacks says so (here Sign)."""
    clean_context.set_context(cpu_bfloat16="emulate")
    with pytest.raises((DTensorOpError, TypeError), match="not among the emulated ones"):
        ops.sign(_replicated(A, ms.bfloat16)).full_tensor().asnumpy()


class _Raises(nn.Cell):
    def construct(self, x):
        raise ValueError("a forward that fails")


class _Nested(nn.Cell):
    """A Cell whose child raises; `grad_inside`: the child runs under MindSpore's grad, whose failure
    resets MindSpore's stack of types as a whole inside the forward."""

    def __init__(self, grad_inside: bool):
        super().__init__()
        self.inner, self.grad_inside = _Raises(), grad_inside

    def construct(self, x):
        return ms.grad(lambda a: self.inner(a).sum())(x) if self.grad_inside else self.inner(x)


@pytest.mark.parametrize("case", ["kernel", "python", "under grad", "grad inside"])
def test_a_failed_bfloat16_forward_leaves_no_type_casting(clean_context, case):
    """A forward that raises inside BF16 Cells (MindSpore's kernel refusal, a Python error, either
    under value_and_grad, or a grad inside the forward that resets MindSpore's stack) pops the types
    its Cells pushed, no more: later float32, float16 and bfloat16 kernels get their own dtypes
    and the emulation rounds only bfloat16 (no caller clean-up)."""
    clean_context.set_context(cpu_bfloat16="emulate")
    at = A.T.copy()
    plain = ops.matmul(Tensor(A), Tensor(at)).asnumpy()
    net = nn.Dense(8, 6).to_float(ms.bfloat16) if case == "kernel" else \
        _Nested(case == "grad inside").to_float(ms.bfloat16)
    with pytest.raises((TypeError, ValueError), match="Unsupported data type|a forward that fails"):
        if case == "under grad":
            ms.value_and_grad(lambda a: net(a).sum())(Tensor(A))
        else:
            net(Tensor(A)).asnumpy()  # one device: MindSpore's bfloat16 MatMul does not exist on CPU
    assert not bfloat16_emulation._STACK, "the mirror holds no type"
    for dtype in (ms.float32, ms.float16, ms.bfloat16):  # a pop too many makes MindSpore cast to float16
        assert ops.add(Tensor([1.0]).astype(dtype), Tensor([1.0]).astype(dtype)).dtype == dtype
    got = ops.matmul(_replicated(A, ms.float32), _replicated(at, ms.float32)).full_tensor()
    assert got.dtype == ms.float32
    np.testing.assert_array_equal(got.asnumpy(), plain)
