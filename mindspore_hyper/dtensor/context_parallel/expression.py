"""Attention written as ops, recognised under context parallelism.

With a context-parallel axis declared, a batched matmul `a @ b` (a: [..., t, d], b: [..., d, s])
is not computed at once: its result is a *deferred* DTensor that remembers `q = a`, `k^T = b`
and the element-wise steps applied to it next (scaling by a number, adding a mask, filling
masked positions). A softmax over the last dimension marks it as attention probabilities, and
when those meet V in a second matmul the whole attention runs by the strategy's method (ring or
Ulysses) on sequence-sharded q/k/v; no device forms the full score matrix. Any other op that
reads deferred scores gets them computed the ordinary way (the matmul and steps replayed by
their own sharding rules), so nothing else changes meaning.
"""
from __future__ import annotations

from typing import Any, Optional

from mindspore_hyper.dtensor import dispatch
from mindspore_hyper.dtensor.context_parallel.attend import attend
from mindspore_hyper.dtensor.context_parallel.scores import AttentionScores, Step, ordinary, suspended
from mindspore_hyper.dtensor.dtensor import DTensor, is_float

__all__ = ["intercept"]

MATMULS = ("MatMul", "MatMulExt", "BatchMatMul", "BatchMatMulExt", "Bmm", "BmmExt")
SCALES = {"Mul": "mul", "Muls": "mul", "Div": "div", "Divs": "div", "RealDiv": "div"}
ADDS = ("Add", "AddExt")
FILLS = ("MaskedFill",)
SOFTMAXES = ("Softmax", "SoftmaxExt")


# -- recognising the ops -------------------------------------------------------------------------

def intercept(execution, call) -> Optional[Any]:
    """The result of `call` if it belongs to attention under context parallelism (a deferred
    DTensor or the attention output), else None (the op runs as usual)."""
    if suspended() or execution.context_parallel is None or call.kwargs and _tensor_kwargs(call):
        return None
    deferred = [getattr(t, "_attention", None) for t in call.tensors]
    if not any(deferred):
        return _defer(execution, call, _new_scores(execution, call)) if call.name in MATMULS else None
    position = next(i for i, d in enumerate(deferred) if d is not None)
    scores = deferred[position]
    if sum(d is not None for d in deferred) > 1:
        return None
    if scores.softmax:
        if call.name in MATMULS and position == 0 and len(call.tensors) == 2 and not _transposed(call):
            value = call.tensors[1]
            if _fits_value(scores, value):
                return attend(execution, scores, value)
        return None
    step = _step(call, position, scores)
    if step is False:
        return None
    if step == "softmax":
        return _defer(execution, call, scores.then(softmax=True))
    return _defer(execution, call, scores.then(step))


def _tensor_kwargs(call) -> bool:
    return any(isinstance(v, DTensor) for v in call.kwargs.values())


def _transposed(call) -> bool:
    if call.name not in ("MatMul", "BatchMatMul"):
        return False
    inputs = call.inputs
    ta = bool(inputs[2]) if len(inputs) > 2 else bool(call.attrs.get("transpose_a", False))
    tb = bool(inputs[3]) if len(inputs) > 3 else bool(call.attrs.get("transpose_b", False))
    return ta or tb


def _new_scores(execution, call) -> Optional[AttentionScores]:
    """`a @ b` as the start of attention scores, if it can be (batched, same batch shape, the
    sequence lengths divisible by the cp size, the cp axis free elsewhere)."""
    if len(call.tensors) != 2 or _transposed(call):
        return None
    a, b = call.tensors
    if a.ndim < 3 or a.ndim != b.ndim or tuple(a.shape[:-2]) != tuple(b.shape[:-2]) or a.shape[-1] != b.shape[-2]:
        return None
    if not (is_float(a.dtype) and is_float(b.dtype)) or a.layout.is_partial or b.layout.is_partial:
        return None
    axis = execution.mesh.axis_index(execution.context_parallel.axis)
    n = execution.mesh.device_matrix[axis]
    if a.shape[-2] % n or b.shape[-1] % n:
        return None
    if any(axis in e for d, e in enumerate(a.layout.dims) if d != a.ndim - 2) or \
            any(axis in e for d, e in enumerate(b.layout.dims) if d != b.ndim - 1):
        return None
    return AttentionScores(a, b)


def _fits_value(scores: AttentionScores, value: DTensor) -> bool:
    q, kt = scores.q, scores.key_t
    return (value.ndim == q.ndim and tuple(value.shape[:-2]) == tuple(q.shape[:-2])
            and value.shape[-2] == kt.shape[-1] and is_float(value.dtype) and not value.layout.is_partial)


def _number(value) -> Optional[float]:
    """A Python number, or the value of a 0-d replicated DTensor; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, DTensor) and value.ndim == 0 and not value.layout.is_partial:
        return float(next(iter(value.shards.values())).asnumpy())
    return None


def _broadcasts(mask: DTensor, scores: AttentionScores) -> bool:
    shape = tuple(scores.q.shape[:-1]) + (scores.key_t.shape[-1],)
    if mask.ndim > len(shape) or mask.layout.is_partial:
        return False
    return all(m in (1, s) for m, s in zip(reversed(tuple(mask.shape)), reversed(shape)))


def _step(call, position: int, scores: AttentionScores):
    """The step `call` applies to the deferred operand at `position`: a Step, "softmax", or
    False when the op is not one of attention's."""
    import mindspore as ms

    name, inputs = call.name, call.inputs
    ndim = scores.q.ndim
    if name in SCALES:
        kind = SCALES[name]
        if position != 0 and kind == "div":
            return False
        other = inputs[1 - position] if len(inputs) >= 2 else None
        value = _number(other)
        return False if value is None else Step(kind, value)
    if name in ADDS:
        if name == "AddExt" and len(inputs) > 2 and _number(inputs[2]) != 1.0:
            return False
        other = inputs[1 - position]
        if not isinstance(other, DTensor) or not is_float(other.dtype) or not _broadcasts(other, scores):
            return False
        return Step("add", mask=other)
    if name in FILLS:
        mask, value = inputs[1], _number(inputs[2]) if len(inputs) > 2 else None
        if position != 0 or value is None or not isinstance(mask, DTensor) or mask.dtype != ms.bool_ \
                or not _broadcasts(mask, scores):
            return False
        return Step("fill", value, mask)
    if name in SOFTMAXES and position == 0:
        axis = inputs[1] if len(inputs) > 1 else call.attrs.get("axis", -1)
        if isinstance(axis, (tuple, list)):
            axis = axis[0] if len(axis) == 1 else None
        if name == "SoftmaxExt" and len(inputs) > 2 and inputs[2] is not None:
            return False
        return "softmax" if isinstance(axis, int) and axis % ndim == ndim - 1 else False
    return False


def _defer(execution, call, scores: Optional[AttentionScores]):
    """A DTensor standing for `call`'s result: it carries `scores` and, if anything else reads
    it, computes its shards by `call`'s own rule."""
    if scores is None:
        return None
    with ordinary():
        decision = dispatch._decide(execution, call, call.name)
    outputs = decision.outputs
    layout = outputs[0] if isinstance(outputs, (list, tuple)) else outputs
    if layout is None:
        from mindspore_hyper.shard.tensor_layout import TensorLayout

        layout = TensorLayout.replicated(execution.mesh, scores.q.ndim)
    shape = tuple(scores.q.shape[:-1]) + (scores.key_t.shape[-1],)
    dtype = scores.q.dtype

    def compute():
        with ordinary():
            result = dispatch.execute(execution, call, decision)
        result = result[0] if isinstance(result, (tuple, list)) else result
        return result.redistribute(layout).shards

    with execution.uncounted():  # counted when (if) computed
        deferred = DTensor._lazy(layout, compute, shape, dtype, execution)
    deferred._attention = scores
    return deferred
