"""bfloat16 on CPU: the ops MindSpore 2.10 has no bfloat16 CPU kernel for, run on float32 copies.

MindSpore's CPU kernels take bfloat16 only for Add, Sub, Mul, Div, Neg, Cast, the scalar forms
and the copies (Reshape, Transpose, Concat, StridedSlice, ...): a bfloat16 model fails at its first
MatMul on one CPU device, in the simulation and under msrun alike. With the context flag
`cpu_bfloat16="emulate"`, the DTensor dispatcher runs each op of `NO_BFLOAT16_CPU_KERNEL` whose kernel
would get bfloat16 as Ascend's cube unit runs a MatMul: on float32 copies of its inputs (exact:
every bfloat16 value is a float32), its floating outputs rounded to bfloat16 once (MindSpore's
Cast: round to nearest, ties to even). Integer and boolean outputs (indices, comparisons) stay
as they are. The backward follows the casts: float32 kernels, gradients rounded to bfloat16 where
the forward's outputs were.

A kernel gets bfloat16 when a Cell with MindSpore's mixed-precision type BF16 (`to_float`, amp
O2/O3) is running (MindSpore's kernel launch casts every float input to it: the float32 weights
too) or, outside mixed-precision Cells, when an input is bfloat16. MindSpore keeps the running
Cells' types on a stack in C++ without a getter; `install()` mirrors it from the calls that
push and pop it (`_pynative_executor.set_mixed_precision_type`, called by `Cell.__call__` only).
A forward that raises leaves the mirror, and sometimes MindSpore's stack, with the types pushed
(`reset_cell_types`): where the mirror holds a type, one or two one-element Adds ask MindSpore
which type casts now (only for a table op with the flag on). The emulation casts the float inputs
to bfloat16 where the Cell's type would, then runs the op with the type FP32 pushed, so the kernel
launch casts them (and the float32 weights) to float32.

The package's own kernels follow: its gradient anchors (Identity) are emulated like the
dispatcher's ops (`identity`), bfloat16 shards are neither batched nor moved stacked (Stack and
Tile have no bfloat16 kernel), and stacked float32 shards are cut out `outside_cells`.

Not emulated: ops that never reach the dispatcher (on plain tensors, or in MindSpore's backward:
a broadcasting bfloat16 Add or Mul sums its gradient with ReduceSum, which has no bfloat16 CPU
kernel either), random ops (Dropout's draw) and the context-parallel attention path. They fail
as on one device.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np
import mindspore as ms
from mindspore import Tensor, ops
from mindspore._c_expression import MixedPrecisionType
from mindspore.graph.api import _no_grad, _pynative_executor

from mindspore_hyper.context import get_context

__all__ = ["NO_BFLOAT16_CPU_KERNEL", "FLAG", "install", "reset_cell_types", "touches_bfloat16", "outside_cells",
           "emulation", "run_in_float32", "identity", "refusal_hint"]

FLAG = "cpu_bfloat16"  # the context flag: "mindspore" (MindSpore's kernels, as is) or "emulate"

# The ops (as the dispatcher names them) whose MindSpore 2.10 CPU kernel refuses bfloat16 (checked
# op by op: tests/dtensor/test_bfloat16_emulation.py probes each in float32 and bfloat16).
NO_BFLOAT16_CPU_KERNEL = frozenset((
    # contractions
    "MatMul", "MatMulExt", "BatchMatMul", "BatchMatMulExt", "Dense", "BiasAdd", "Conv2D",
    # normalisations and activations
    "Softmax", "LogSoftmax", "LayerNorm", "GeLU", "FastGeLU", "ReLU", "SiLU", "Sigmoid", "Tanh",
    # elementwise maths
    "Exp", "Log", "Abs", "Sqrt", "Rsqrt", "Erf", "Pow", "PowTensorScalar", "Square", "Maximum", "Minimum",
    "Sin", "Cos", "Floor", "ClampScalar", "OnesLike",
    # reductions and scans
    "SumExt", "DeprecatedSum", "MeanExt", "DeprecatedMean", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
    "MaxDim", "MinDim", "CumSum", "Argmax", "TopK",
    # comparisons and selections
    "Greater", "GreaterScalar", "Less", "LessScalar", "Equal", "Select", "MaskedFill",
    # gathers, copies, one-hot, losses
    "Gather", "GatherD", "Tile", "Stack", "Identity", "OneHot",
    "SparseSoftmaxCrossEntropyWithLogits", "SoftmaxCrossEntropyWithLogits",
))

_FLOATS = (ms.float16, ms.float32, ms.float64)
_BF16 = ms.bfloat16  # MindSpore's dtypes are singletons: `is` (50 ns) where `==` costs about 2 us
_STACK: List[Any] = []  # the mixed-precision types of the running Cells, innermost last
_PROBES: Dict[Any, Tensor] = {}  # dtype -> a one-element tensor (`_cell_cast`)
_ORIGINAL = _pynative_executor.set_mixed_precision_type


def _tracked(mixed_precision_type, is_push: bool = True):
    """MindSpore's `set_mixed_precision_type`, mirrored into `_STACK`."""
    result = _ORIGINAL(mixed_precision_type, is_push)
    if is_push:
        _STACK.append(mixed_precision_type)
    elif _STACK:
        _STACK.pop()
    return result


def install() -> None:
    """Mirror the running Cells' mixed-precision types (idempotent)."""
    _pynative_executor.set_mixed_precision_type = _tracked


def _probe(dtype):
    """The dtype MindSpore's kernel launch gives an Add of two `dtype` tensors now."""
    if dtype not in _PROBES:
        _PROBES[dtype] = Tensor(np.zeros((1,), np.float32)).astype(dtype)
    with _no_grad():
        return ops.add(_PROBES[dtype], _PROBES[dtype]).dtype


def _cell_cast():
    """The dtype a running Cell's mixed-precision type casts kernel inputs to (bfloat16, float16,
    float32), or None outside such Cells. The mirror says whether one may run; MindSpore drops or
    keeps a type pushed by a Cell whose forward raised, so where it may, one or two one-element
    Adds say which: a bfloat16 Add gives float32 or float16 under those types, bfloat16 under
    BF16 or none; then a float32 Add gives bfloat16 under BF16 only."""
    if not _STACK:
        return None
    got = _probe(_BF16)
    if got is not _BF16:
        return got
    return _BF16 if _probe(ms.float32) is _BF16 else None


def reset_cell_types() -> bool:
    """After a forward raised inside Cells with mixed-precision types (MindSpore's `Cell.__call__`
    pops its type only when the forward returns), stop the type that may be left from casting
    later kernels: the type NOTSET is pushed over it (MindSpore's stack has no safe way to be
    emptied) and the mirror forgotten. Returns whether a type was still casting."""
    active = _cell_cast() is not None
    if active:
        _ORIGINAL(MixedPrecisionType.NOTSET, True)
    _STACK.clear()
    return active


def touches_bfloat16(dtypes: Iterable[Any]) -> bool:
    """Whether kernels on tensors of `dtypes` may get bfloat16: one is bfloat16, or a Cell of
    mixed-precision type BF16 may be running (the mirror's word: no kernel run to ask)."""
    return (bool(_STACK) and _STACK[-1] == MixedPrecisionType.BF16) or any(d is _BF16 for d in dtypes)


@contextlib.contextmanager
def outside_cells():
    """Inside the block MindSpore casts no kernel's inputs to a running Cell's mixed-precision type
    (the package's own bookkeeping ops keep their tensors' dtypes)."""
    if not _STACK:
        yield
        return
    _pynative_executor.set_mixed_precision_type(MixedPrecisionType.NOTSET)
    try:
        yield
    finally:
        _pynative_executor.set_mixed_precision_type(MixedPrecisionType.NOTSET, False)


def emulation(name: str, dtypes: Iterable[Any]) -> Optional[str]:
    """How op `name` with inputs of `dtypes` runs: None (MindSpore's kernel, as is), or emulated
    when it is in `NO_BFLOAT16_CPU_KERNEL`, its kernel would get bfloat16 (module docstring) and
    the flag says "emulate" (read here, so a flag set at any time acts at the next op): "cell"
    (a BF16 Cell runs: its cast of the float inputs comes first) or "inputs" (bfloat16 inputs).
    For any other op one set lookup; for a table op outside mixed-precision Cells one dtype test
    per input.

    Raises:
        ValueError: the flag says "emulate" and MindSpore targets a device other than the CPU
            (whose kernels take bfloat16: nothing to emulate).
    """
    if name not in NO_BFLOAT16_CPU_KERNEL:
        return None
    bf16_input = any(d is _BF16 for d in dtypes)
    if not _STACK and not bf16_input:
        return None
    if get_context(FLAG) != "emulate":
        return None
    cast = _cell_cast()
    if cast is _BF16:
        mode = "cell"
    elif cast is None and bf16_input:
        mode = "inputs"
    else:
        return None  # a Cell's type float32 or float16: the kernel gets that
    target = ms.get_context("device_target")
    if target != "CPU":
        raise ValueError(f"{FLAG}='emulate': emulates the bfloat16 kernels MindSpore's CPU backend lacks; the "
                         f"device target is {target!r}, whose kernels take bfloat16: set {FLAG}='mindspore'")
    return mode


def _round_to_bfloat16(values: Sequence[Any]) -> List[Any]:
    """Float tensors (also inside list operands) cast to bfloat16, as a BF16 Cell's kernel launch does."""
    out = []
    for v in values:
        if isinstance(v, Tensor) and v.dtype in _FLOATS:
            out.append(ops.cast(v, ms.bfloat16))
        elif isinstance(v, (list, tuple)) and any(isinstance(x, Tensor) for x in v):
            out.append(type(v)(_round_to_bfloat16(v)))
        else:
            out.append(v)
    return out


def _outputs_to_bfloat16(result):
    if isinstance(result, Tensor):
        return ops.cast(result, ms.bfloat16) if result.dtype in _FLOATS else result
    if isinstance(result, (tuple, list)):
        return type(result)(_outputs_to_bfloat16(r) for r in result)
    return result


def run_in_float32(run: Callable[[List[Any], Dict[str, Any]], Any], inputs: List[Any], kwargs: Dict[str, Any],
                   mode: str):
    """Run one shard's op emulated (`mode` from `emulation`): `run(inputs, kwargs)` on float32
    copies of the inputs that would reach the kernel in bfloat16; its floating outputs rounded to
    bfloat16."""
    if mode == "cell":
        inputs = _round_to_bfloat16(inputs)
        kwargs = dict(zip(kwargs, _round_to_bfloat16(list(kwargs.values()))))
    _pynative_executor.set_mixed_precision_type(MixedPrecisionType.FP32)
    try:
        result = run(inputs, kwargs)
    finally:
        _pynative_executor.set_mixed_precision_type(MixedPrecisionType.NOTSET, False)
    return _outputs_to_bfloat16(result)


def identity(op: Callable[[Tensor], Tensor], tensor: Tensor) -> Tensor:
    """`op(tensor)` for the package's own Identity kernels (a gradient hook's anchor): emulated
    where its kernel would get bfloat16, as the dispatcher's ops are."""
    mode = emulation("Identity", (tensor.dtype,))
    if mode is not None:
        return run_in_float32(lambda inputs, kwargs: op(*inputs), [tensor], {}, mode)
    try:
        return op(tensor)
    except TypeError as error:  # MindSpore's kernel selection refused the dtype
        text = str(error).split("C++ Call Stack")[0].strip(" -\n")
        hint = refusal_hint(text)
        if not hint:
            raise
        raise TypeError(f"Identity (the package's gradient anchor of an op's input): {text}{hint}") from error


def refusal_hint(message: str) -> str:
    """What to add to a failed op's message when MindSpore refused bfloat16 ("" otherwise)."""
    if "BFloat16" not in message:
        return ""
    if get_context(FLAG) == "emulate":
        return (" (MindSpore's CPU kernels lack bfloat16 here and this op is not among the emulated ones, "
                "mindspore_hyper.bfloat16_emulation.NO_BFLOAT16_CPU_KERNEL)")
    return (f" (MindSpore's CPU kernels lack bfloat16 for this op: mindspore_hyper.set_context({FLAG}='emulate') "
            f"runs such ops on float32 copies with bfloat16 outputs; docs/training.md, \"CPU kernels and dtypes\")")
