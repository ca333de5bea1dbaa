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
push and pop it (`_pynative_executor.set_mixed_precision_type`, called by `Cell.__call__` only),
and pops the types of Cells whose forward raised (MindSpore pops a Cell's type only when its
forward returns: `_call_restoring_type`). Where the mirror holds a type, one or two one-element
Adds ask MindSpore which type casts now (only for a listed op with the flag on). The emulation
casts the float inputs to bfloat16 where the Cell's type would, then runs the op with the type
FP32 pushed, so the kernel launch casts them (and the float32 weights) to float32.

Beyond the table: a broadcasting Add, Sub, Mul or Div on bfloat16 (`BROADCAST_GRADIENT_OPS`: its
forward kernel exists, its MindSpore backward sums the gradient with a ReduceSum that has none)
runs on float32 copies too, bitwise equal to the bfloat16 kernel forward; random ops draw as the
float32 run does (`emulated_kernel`; Dropout in `dtensor/random.py`: the float32 mask, the scale
rounded once).

The package's own kernels follow: its gradient anchors (Identity) are emulated like the
dispatcher's ops (`identity`), bfloat16 shards are neither batched nor moved stacked (Stack and
Tile have no bfloat16 kernel), and stacked float32 shards are cut out `outside_cells`.

Not emulated: ops that never reach the dispatcher: on plain tensors (a plain single-device Cell:
the package sees none of its ops; one holding bfloat16 parameters is refused when called with the
flag on, naming the one-device simulation, `Layout((1,), ("data",))`, that emulates it:
`check_plain_cell`), and MindSpore's backward
kernels of ops the dispatcher ran with MindSpore's own bfloat16 kernel. Ring attention runs its own
kernels on the shards: it is emulated as one fused kernel, float32 inside, its output rounded once
(`dtensor/context_parallel/ring.py`); Ulysses runs by the dispatcher's rules, emulated op by op.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops
from mindspore._c_expression import MixedPrecisionType
from mindspore.graph.api import _no_grad, _pynative_executor

from mindspore_hyper.context import get_context

__all__ = ["NO_BFLOAT16_CPU_KERNEL", "BROADCAST_GRADIENT_OPS", "EMULATED", "FLAG", "install", "touches_bfloat16",
           "cell_cast_dtype", "outside_cells", "float32_kernels", "emulation", "emulated_kernel", "bfloat16_kernel",
           "run_in_float32", "identity", "refusal_hint", "check_plain_cell"]

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

# Ops with bfloat16 CPU kernels whose MindSpore backward, when the operands' shapes differ (a
# broadcast: a bias add, a scale), sums the gradient over the broadcast dimensions with ReduceSum,
# which has no bfloat16 CPU kernel: emulated only then (`emulation`). Their forward on float32
# copies rounded once equals the bfloat16 kernel's (float32's 24 bits >= 2 * 8 + 2: rounding twice
# is innocuous for +, -, *, /), and the backward reduces in float32, rounded once.
BROADCAST_GRADIENT_OPS = frozenset(("Add", "AddExt", "Sub", "SubExt", "Mul", "Div", "RealDiv"))
EMULATED = NO_BFLOAT16_CPU_KERNEL | BROADCAST_GRADIENT_OPS  # what `emulation` may emulate (one set lookup)

_FLOATS = (ms.float16, ms.float32, ms.float64)
_BF16 = ms.bfloat16  # MindSpore's dtypes are singletons: `is` (50 ns) where `==` costs about 2 us
_STACK: List[Any] = []  # the mixed-precision types of the running Cells, innermost last
_PROBES: Dict[Any, Tensor] = {}  # dtype -> a one-element tensor (`_cell_cast`)
_ORIGINAL = _pynative_executor.set_mixed_precision_type
_ORIGINAL_CALL = nn.Cell._complex_call
_ORIGINAL_CELL_CALL = nn.Cell.__call__
_DEPTH = [0]  # Cell calls running (`_call_refusing_plain`), over all threads: 0 outside any Cell
_LAYS_OUT: List[Callable[[Any], bool]] = []  # (Parameter) -> whether a model the package runs lays it out


def _tracked(mixed_precision_type, is_push: bool = True):
    """MindSpore's `set_mixed_precision_type`, mirrored into `_STACK`."""
    result = _ORIGINAL(mixed_precision_type, is_push)
    if is_push:
        _STACK.append(mixed_precision_type)
    elif _STACK:
        _STACK.pop()
    return result


def _call_restoring_type(cell: nn.Cell, *args, **kwargs):
    """MindSpore's `Cell._complex_call` (the call of a Cell with a mixed-precision type), which pops
    the type it pushed only when the forward returns: where the forward raises, the types pushed
    since (this Cell's and its children's) are popped here before the error goes on, so later
    kernels are not cast by a Cell no longer running (`_unwind`)."""
    if cell.mixed_precision_type is None:
        return _ORIGINAL_CALL(cell, *args, **kwargs)
    depth = len(_STACK)
    try:
        return _ORIGINAL_CALL(cell, *args, **kwargs)
    except BaseException:
        if len(_STACK) > depth:
            _unwind(depth)
        raise


_CAST_OF = {MixedPrecisionType.BF16: ms.bfloat16, MixedPrecisionType.FP16: ms.float16,
            MixedPrecisionType.FP32: ms.float32}  # the dtype each Cell type casts kernel inputs to


def _unwind(depth: int) -> None:
    """Pop the types above `depth` of the mirror from MindSpore's stack, each only while MindSpore
    still casts by it: a grad function that failed inside the forward resets MindSpore's stack as
    a whole, and a pop of an empty stack leaves MindSpore casting by whatever lies past it (float16
    when checked), so where MindSpore no longer casts by the mirror's type the mirror is cut
    instead. An asynchronous kernel failure is synchronised first (the probes would raise it)."""
    try:
        _pynative_executor.sync()
    except Exception:  # pylint: disable=broad-except  # the failure being raised: the caller's
        pass
    while len(_STACK) > depth:
        if _cell_cast() is not _CAST_OF.get(_STACK[-1]):
            del _STACK[depth:]
            return
        _pynative_executor.set_mixed_precision_type(MixedPrecisionType.NOTSET, False)


def _call_refusing_plain(cell: nn.Cell, *args, **kwargs):
    """MindSpore's `Cell.__call__`, a call outside any other Cell first checked by `check_plain_cell`
    (one counter for all threads: a Cell another thread calls while one runs goes unchecked)."""
    if not _DEPTH[0]:
        check_plain_cell(cell)
    _DEPTH[0] += 1
    try:
        return _ORIGINAL_CELL_CALL(cell, *args, **kwargs)
    finally:
        _DEPTH[0] -= 1


def check_plain_cell(cell: nn.Cell) -> None:
    """Refuse a Cell holding bfloat16 parameters that runs outside the package with the flag on
    "emulate" on the CPU: the emulation sees only the ops on the package's DTensors, so MindSpore's
    kernels would fail on it (at its first MatMul, or in the backward of a broadcasting Add, whose
    ReduceSum has no bfloat16 CPU kernel, asynchronously, where no caller can name the fix).

    Raises:
        TypeError: no Parameter of `cell` is laid out by a model the package runs (`install`'s
            `lays_out`) and one of them is bfloat16; the message names the one-device simulation.
    """
    if get_context(FLAG) != "emulate":
        return
    params = list(cell.get_parameters())
    bfloat16 = [p.name for p in params if p.dtype is _BF16]
    if not bfloat16 or any(lays_out(p) for lays_out in _LAYS_OUT for p in params):
        return
    if ms.get_context("device_target") != "CPU":
        return  # the device's kernels take bfloat16
    raise TypeError(f"{type(cell).__name__} holds bfloat16 parameters ({', '.join(bfloat16[:3])}"
                    f"{', ...' if len(bfloat16) > 3 else ''}) and is called outside the package (no mesh): "
                    f"{FLAG}='emulate' emulates MindSpore's missing bfloat16 CPU kernels only for the ops the package "
                    "runs, and MindSpore's own kernels fail on it (MatMul, BiasAdd, a broadcasting Add's backward "
                    "ReduceSum, ...). Run it as a one-device simulation: mindspore_hyper.set_context(device_num=1); "
                    "model = mindspore_hyper.auto_parallelize(cell, Layout((1,), (\"data\",))(tensor_map=())); or "
                    f"set {FLAG}='mindspore' to run MindSpore's kernels as they are")


def install(lays_out: Optional[Callable[[Any], bool]] = None) -> None:
    """Mirror the running Cells' mixed-precision types, restore them where a Cell's forward
    raises (`_call_restoring_type`), and, while the flag is "emulate", check every Cell called
    outside other Cells (`check_plain_cell`, with `lays_out(parameter)`: whether a model the
    package runs lays it out; without the flag no Cell call pays for the check); idempotent."""
    _pynative_executor.set_mixed_precision_type = _tracked
    nn.Cell._complex_call = _call_restoring_type
    if get_context(FLAG) == "emulate":
        nn.Cell.__call__ = _call_refusing_plain
    if lays_out is not None:
        _LAYS_OUT[:] = [lays_out]


def _probe(dtype):
    """The dtype MindSpore's kernel launch gives an Add of two `dtype` tensors now."""
    if dtype not in _PROBES:
        _PROBES[dtype] = Tensor(np.zeros((1,), np.float32)).astype(dtype)
    with _no_grad():
        return ops.add(_PROBES[dtype], _PROBES[dtype]).dtype


def _cell_cast():
    """The dtype a running Cell's mixed-precision type casts kernel inputs to (bfloat16, float16,
    float32), or None outside such Cells. The mirror says whether one may run; MindSpore may have
    reset its stack since (a grad function that failed), so where one may, one or two one-element
    Adds say which: a bfloat16 Add gives float32 or float16 under those types, bfloat16 under
    BF16 or none; then a float32 Add gives bfloat16 under BF16 only."""
    if not _STACK:
        return None
    got = _probe(_BF16)
    if got is not _BF16:
        return got
    return _BF16 if _probe(ms.float32) is _BF16 else None


def cell_cast_dtype():
    """The dtype the innermost running Cell's mixed-precision type casts every float kernel input
    to (bfloat16, float16 or float32), or None outside such Cells, by the mirror alone (no probe
    kernel: a dry run asks it for every op): what a dry run's shape rules apply to their float
    inputs, as MindSpore's kernel launch does in the simulation."""
    return _CAST_OF.get(_STACK[-1]) if _STACK else None


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


def emulation(name: str, dtypes: Sequence[Any], shapes: Iterable[Sequence[int]] = ()) -> Optional[str]:
    """How op `name` with inputs of `dtypes` (tensor operands' shapes `shapes`) runs: None
    (MindSpore's kernel, as is), or emulated (`bfloat16_kernel`'s "cell" or "inputs") when the op is
    in `NO_BFLOAT16_CPU_KERNEL`, or in `BROADCAST_GRADIENT_OPS` with operands of different shapes
    (all of its float operands bfloat16, or a BF16 Cell's cast), and its kernel would get bfloat16
    with the flag on. For any other op one set lookup; for a listed op outside mixed-precision
    Cells one dtype test per input.

    Raises:
        ValueError: the flag says "emulate" and MindSpore targets a device other than the CPU
            (whose kernels take bfloat16: nothing to emulate).
    """
    if name not in EMULATED or not _STACK and not any(d is _BF16 for d in dtypes):
        return None
    broadcast_op = name in BROADCAST_GRADIENT_OPS
    if broadcast_op and len({tuple(s) for s in shapes}) < 2:
        return None  # no broadcast: MindSpore's bfloat16 kernels, forward and backward
    mode = emulated_kernel(dtypes)
    if broadcast_op and mode == "inputs" and any(d in _FLOATS for d in dtypes):
        return None  # with a wider float MindSpore promotes (casts first): its kernels are float32
    return mode


def emulated_kernel(dtypes: Sequence[Any]) -> Optional[str]:
    """`bfloat16_kernel(dtypes)` where the flag says "emulate", else None: how any op on inputs of
    `dtypes` is emulated (random ops use it: the float32 run's draw, rounded).

    Raises:
        ValueError: the flag says "emulate" and MindSpore targets a device other than the CPU.
    """
    if not _STACK and not any(d is _BF16 for d in dtypes):
        return None
    if get_context(FLAG) != "emulate":
        return None
    mode = bfloat16_kernel(dtypes)
    if mode is None:
        return None
    target = ms.get_context("device_target")
    if target != "CPU":
        raise ValueError(f"{FLAG}='emulate': emulates the bfloat16 kernels MindSpore's CPU backend lacks; the "
                         f"device target is {target!r}, whose kernels take bfloat16: set {FLAG}='mindspore'")
    return mode


def bfloat16_kernel(dtypes: Sequence[Any]) -> Optional[str]:
    """Whether a kernel on inputs of `dtypes` gets bfloat16 now, whatever the flag: "cell" (a Cell
    of mixed-precision type BF16 runs: MindSpore's kernel launch casts the float inputs to
    bfloat16), "inputs" (outside such Cells, an input is bfloat16), or None (a Cell's type
    float32 or float16, or no bfloat16 input: the kernel gets that)."""
    bf16_input = any(d is _BF16 for d in dtypes)
    if not _STACK and not bf16_input:
        return None
    cast = _cell_cast()
    if cast is _BF16:
        return "cell"
    return "inputs" if cast is None and bf16_input else None


@contextlib.contextmanager
def float32_kernels():
    """Inside the block kernels get float32 where a running Cell's mixed-precision type would cast
    their float inputs (the type FP32 pushed; bfloat16 inputs are cast up, exactly)."""
    _pynative_executor.set_mixed_precision_type(MixedPrecisionType.FP32)
    try:
        yield
    finally:
        _pynative_executor.set_mixed_precision_type(MixedPrecisionType.NOTSET, False)


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
    with float32_kernels():
        result = run(inputs, kwargs)
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
