"""Batched shard execution: an op's distinct shards run as ONE kernel on stacked shards.

In simulation one process holds every device, so an op split over mesh axes `axes` has one
shard per coordinate on them (64 for data 8 x tensor 8). Launching one kernel per shard makes
the step's cost grow with the device count. Here the shards of each operand are stacked along
new leading "batch" dimensions, one per mesh axis the op runs over (size 1 where the operand is
replicated, so broadcasting reads it once), and the op runs once. A result stays stacked
(`DTensor._stacked`): the next batched op reads it without restacking, and its per-shard
tensors are only cut out (one Unstack) when a per-shard path reads them.

Only ops listed in `BATCHED` run batched, each with an adapter that shifts its axis arguments
past the batch dimensions, and ops whose rule gives a `Decision.batch_fn` (the batched form of
its per-shard `local_fn`, e.g. the vocabulary-parallel embedding). Forward values equal the per-shard kernels' bitwise for elementwise
ops, softmax, LayerNorm over trailing axes, max/min and copies (tested); matmuls and sums agree
to float rounding only: MindSpore's CPU GEMM picks its kernel by matrix size (an 8-row MatMul
rounds differently from the same rows inside a larger or batched one) and a longer sum adds in
another order. Gradients flow through the stacking (autograd sums a replicated operand's
gradient over the batch, as `_fan_out` would), possibly in another summation order. Everything
else runs per shard (random ops draw once for the global shape: dtensor/random.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from mindspore import Parameter, Tensor, ops
from mindspore._c_expression.typing import type_id_to_type

from mindspore_hyper import bfloat16_emulation
from mindspore_hyper.dtensor.dtensor import DTensor, significant_axes
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["BATCHED", "run_batched", "stacked_shards"]


@dataclass
class Batch:
    """One op call over stacked shards.

    Attributes:
        axes: the mesh axes the op runs over, ascending.
        sizes: the batch dimensions (mesh size of each axis the op runs over, ascending axes).
        stacked: per tensor operand, its shards stacked to `sizes` (1 where it is replicated)
            followed by its local shape.
        raw: per tensor operand, its single shard if it is the same on every device of the op,
            else None.
        local_ranks: per tensor operand, the rank of its local shard.
    """

    axes: Tuple[int, ...]
    sizes: Tuple[int, ...]
    stacked: List[Tensor]
    raw: List[Optional[Tensor]]
    local_ranks: List[int]

    @property
    def nb(self) -> int:
        return len(self.sizes)

    def sizes_of(self, i: int) -> Tuple[int, ...]:
        """Operand i's batch dimensions (1 where it is replicated)."""
        return tuple(self.stacked[i].shape[:self.nb])

    def full(self, i: int) -> Tensor:
        """Operand i tiled to the full batch dimensions (a copy where it is replicated)."""
        own = self.sizes_of(i)
        if own == self.sizes:
            return self.stacked[i]
        reps = tuple(n // m for n, m in zip(self.sizes, own)) + (1,) * self.local_ranks[i]
        return ops.tile(self.stacked[i], reps)

    def stacked_shape(self, i: int, rank: int) -> Tuple[int, ...]:
        """Operand i's stacked shape with its local shape left-padded with 1s to `rank`."""
        shape = tuple(self.stacked[i].shape)
        return shape[:self.nb] + (1,) * (rank - self.local_ranks[i]) + shape[self.nb:]


def _shift(axis, nb: int):
    """An axis argument (int or tuple) moved past `nb` leading batch dimensions."""
    if isinstance(axis, (tuple, list)):
        return type(axis)(_shift(a, nb) for a in axis)
    return axis + nb if axis >= 0 else axis


def _is_axis(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, (tuple, list)) and bool(value) and all(isinstance(v, int) and not isinstance(v, bool)
                                                                    for v in value)


def _elementwise(call, inputs: List[Any], batch: Batch):
    """Broadcasting ops: every tensor operand padded to the largest local rank after its batch
    dimensions (so broadcasting aligns local dimensions as on one shard)."""
    rank = max(batch.local_ranks)
    operands = []
    for i, (t, r) in enumerate(zip(batch.stacked, batch.local_ranks)):
        if batch.raw[i] is not None:  # the same on every device: broadcasts as it is
            operands.append(batch.raw[i])
        elif call.name in SCALAR_LAST and i == len(batch.stacked) - 1 and r == 0:
            return None  # a per-device fill value must stay 0-dimensional
        else:
            operands.append(t.reshape(batch.stacked_shape(i, rank)) if r < rank else t)
    return call.run(_put(inputs, iter(operands)), call.kwargs)


# Elementwise ops whose last operand must be a 0-dimensional tensor.
SCALAR_LAST = ("MaskedFill",)


def _with_axes(positions: Sequence[int]):
    """Ops with one operand whose axis arguments sit at `positions` of the call's inputs."""
    def adapter(call, inputs, batch: Batch):
        if any(batch.sizes_of(i) != batch.sizes for i in range(len(batch.stacked))):
            return None  # these ops do not broadcast
        args = list(inputs)
        for p in positions:
            if p >= len(args) or not _is_axis(args[p]):
                return None  # a default axis (often: all of them) is not moved past the batch
            args[p] = _shift(args[p], batch.nb)
        return call.run(_put(args, iter(batch.stacked)), call.kwargs)
    return adapter


def _reduce(call, inputs, batch: Batch):
    """Reductions (x, axis=None, keepdim, ...): a missing, None or empty axis means every
    local dimension, never the batch ones."""
    args = list(inputs)
    rank = batch.local_ranks[0]
    if len(args) == 1 or args[1] is None or args[1] == ():
        axis = tuple(range(batch.nb, batch.nb + rank))
    elif _is_axis(args[1]):
        axis = _shift(args[1], batch.nb)
    else:
        return None
    if rank == 0:
        return None
    return call.run([batch.stacked[0], axis] + args[2:], call.kwargs)


def _sum_keyword(call, inputs, batch: Batch):
    """Tensor.sum(axis=..., keepdims=...) (the axis passed by keyword)."""
    axis = call.kwargs.get("axis")
    if len(inputs) != 1 or not _is_axis(axis):
        return None
    kwargs = dict(call.kwargs, axis=_shift(axis, batch.nb))
    return call.run([batch.stacked[0]], kwargs)


def _reshape(call, inputs, batch: Batch):
    shape = inputs[1]
    if not isinstance(shape, (tuple, list)) or any(not isinstance(s, int) or s < 0 for s in shape):
        return None
    return call.run([batch.stacked[0], tuple(batch.sizes) + tuple(shape)], call.kwargs)


def _transpose(call, inputs, batch: Batch):
    perm = inputs[1] if len(inputs) == 2 and isinstance(inputs[1], (tuple, list)) else tuple(inputs[1:])
    rank = batch.local_ranks[0]
    if not _is_axis(tuple(perm)) or len(perm) != rank:
        return None
    shifted = tuple(range(batch.nb)) + tuple(p % rank + batch.nb for p in perm)
    return call.run([batch.stacked[0], shifted] if len(inputs) == 2 else [batch.stacked[0], *shifted], call.kwargs)


def _matmul(call, inputs, batch: Batch):
    """matmul (MatMulExt) on operands of equal rank: one BatchMatMul over the batch and local
    batch dimensions (MindSpore's CPU matmul is several times slower when it broadcasts, so an
    operand replicated along some batch dimensions is tiled first)."""
    ranks = batch.local_ranks
    if len(ranks) != 2 or ranks[0] != ranks[1] or ranks[0] < 2 or len(inputs) != 2:
        return None
    a, b = batch.full(0), batch.full(1)
    if tuple(a.shape[:-2]) != tuple(b.shape[:-2]):
        return None  # broadcasting local batch dimensions: per shard
    return _bmm(a, b, False, False)


def _batch_matmul(call, inputs, batch: Batch):
    """bmm: 3-D operands split alike."""
    if batch.local_ranks != [3, 3] or len(inputs) != 2:
        return None
    return _matmul(call, inputs, batch)


def _matmul_2d(call, inputs, batch: Batch):
    """MatMul (2-D, transpose flags as arguments): BatchMatMul with the same flags."""
    if batch.local_ranks != [2, 2] or len(inputs) != 4:
        return None
    return _bmm(batch.full(0), batch.full(1), bool(inputs[2]), bool(inputs[3]))


def _bmm(a: Tensor, b: Tensor, transpose_a: bool, transpose_b: bool) -> Tensor:
    """BatchMatMul over every leading dimension of equally batched `a` and `b`."""
    lead = tuple(a.shape[:-2])
    out = ops.BatchMatMul(transpose_a, transpose_b)(a.reshape((-1,) + tuple(a.shape[-2:])),
                                                    b.reshape((-1,) + tuple(b.shape[-2:])))
    return out.reshape(lead + tuple(out.shape[-2:]))


def _bias_add(call, inputs, batch: Batch):
    """BiasAdd on a 2-D shard (channel last): an addition with the bias broadcast over rows."""
    if batch.local_ranks != [2, 1]:
        return None
    bias = batch.stacked[1].reshape(batch.sizes_of(1) + (1,) + tuple(batch.stacked[1].shape[-1:]))
    return batch.stacked[0] + bias


def _layer_norm(call, inputs, batch: Batch):
    """LayerNorm with gamma and beta the same on every device of the op (the usual case)."""
    if len(inputs) != 6 or batch.raw[1] is None or batch.raw[2] is None:
        return None
    _, _, _, begin_norm, begin_params, eps = inputs
    args = [batch.stacked[0], batch.raw[1], batch.raw[2], _shift(begin_norm, batch.nb),
            _shift(begin_params, batch.nb), eps]
    return call.run(args, call.kwargs)


ELEMENTWISE = (
    "Add", "AddExt", "Sub", "SubExt", "Mul", "Muls", "Div", "Divs", "RealDiv", "Neg", "Cast", "ToDtype",
    "OnesLike", "ZerosLike", "ReLU", "GeLU", "FastGeLU", "SiLU", "Tanh", "Sigmoid", "Erf", "Exp", "Log", "Sqrt",
    "Rsqrt", "Abs", "Square", "Reciprocal", "Pow", "Maximum", "Minimum", "Equal", "NotEqual", "Less",
    "LessEqual", "Greater", "GreaterEqual", "LogicalAnd", "LogicalOr", "LogicalNot", "MaskedFill", "Select",
    "Where",
)

# op name -> adapter(call, local inputs, Batch) -> batched result, or None to run per shard.
BATCHED: Dict[str, Callable] = {name: _elementwise for name in ELEMENTWISE}
BATCHED.update({
    "Reshape": _reshape, "View": _reshape,
    "Transpose": _transpose, "DeprecatedTranspose": _transpose, "Permute": _transpose,
    "MatMulExt": _matmul, "BatchMatMulExt": _batch_matmul, "BmmExt": _batch_matmul, "MatMul": _matmul_2d,
    "BiasAdd": _bias_add,
    "LayerNorm": _layer_norm,
    "Softmax": _with_axes([1]), "LogSoftmax": _with_axes([1]),
    "ReduceMax": _reduce, "ReduceMin": _reduce, "SumExt": _reduce, "ReduceSum": _reduce,
    "DeprecatedSum": _sum_keyword,
    "Split": _with_axes([1]), "ExpandDims": _with_axes([1]), "Squeeze": _with_axes([1]),
    "GatherD": _with_axes([1]),
})

# An op batches only while every operand's shard has fewer elements than this: batching pays
# where per-kernel overhead dominates (small shards); on larger shards MindSpore's 2-D CPU
# kernels beat the batched ones plus the stacking copies (benchmark GPT, hidden 768, 384 devices:
# 1.36x single device per shard vs 1.84x all batched; docs/benchmarks.md).
BATCH_BELOW_ELEMENTS = 1 << 15

# Ops whose rule's `local_args` give every shard the same arguments (a local shape or axes).
SAME_ARGS_ON_EVERY_SHARD = ("Reshape", "View", "Squeeze")


def _put(values, supply):
    """`values` with each DTensor (also inside lists) replaced by the next of `supply`."""
    out = []
    for v in values:
        if isinstance(v, DTensor):
            out.append(next(supply))
        elif isinstance(v, (list, tuple)) and any(isinstance(x, DTensor) for x in v):
            out.append(type(v)(_put(v, supply)))
        else:
            out.append(v)
    return out


def stacked_shards(execution, t: DTensor) -> Tensor:
    """`t`'s distinct shards stacked along a new leading dimension, in the order of
    `execution.keys(significant_axes(t.layout))` (reuses the stack `t` was made as)."""
    if t._stacked is not None:
        return t._stacked
    axes = significant_axes(t.layout)
    shards = [_not_ref(t.shards[key]) for key in execution.keys(axes)]
    with bfloat16_emulation.outside_cells():  # a copy keeps its dtype (a running Cell's type would cast it)
        return ops.stack(shards)


def _not_ref(shard: Tensor) -> Tensor:
    """A Parameter's storage (a Ref) does not stack with plain tensors: a view of it does. A
    Ref is not always a `Parameter` object: a plain `Tensor` carrying a Parameter's
    `param_info` (as a bias reaches the op of nn.GRU's cell) is one too."""
    if isinstance(shard, Parameter) or shard.param_info is not None:
        return shard.reshape(shard.shape)
    return shard


def _cast_target(call) -> List[Any]:
    """[the dtype a Cast makes] (MindSpore passes it as its TypeId), [] for other ops: a Cast to
    bfloat16 batched would unstack bfloat16 outputs, whose backward is a bfloat16 Stack."""
    if call.name not in ("Cast", "ToDtype") or len(call.inputs) < 2:
        return []
    dtype = call.inputs[1]
    return [type_id_to_type(dtype) if isinstance(dtype, int) and not isinstance(dtype, bool) else dtype]


def run_batched(execution, call, decision, axes: Sequence[int], keys: Sequence[tuple]):
    """Run `call` once over all `keys` (the op's distinct shard coordinates on `axes`) if its
    op batches; returns its outputs as DTensors, or None to run it per shard."""
    adapter = decision.batch_fn if decision.local_fn is not None else BATCHED.get(call.name)
    if (adapter is None or len(keys) < 2 or not execution.holds_all_ranks
            or any(isinstance(v, DTensor) for v in call.kwargs.values()) or any(t._uneven for t in call.tensors)):
        return None  # uneven shards (torch.chunk pieces) differ in shape: they do not stack
    if bfloat16_emulation.touches_bfloat16([t.dtype for t in call.tensors] + _cast_target(call)):
        return None  # Stack and Tile have no bfloat16 CPU kernel: bfloat16 shards (in or out) run one by one
    if decision.local_args is not None and call.name not in SAME_ARGS_ON_EVERY_SHARD:
        return None
    if any(math.prod(layout.local_shape(t.global_shape)) >= BATCH_BELOW_ELEMENTS
           for t, layout in zip(call.tensors, decision.inputs)):
        return None
    mesh = execution.mesh
    sizes = tuple(mesh.device_matrix[a] for a in axes)
    stacked, raw, ranks = [], [], []
    for t in call.tensors:
        t_axes = significant_axes(t.layout)
        local = tuple(t.layout.local_shape(t.global_shape))
        shape = tuple(size if a in t_axes else 1 for a, size in zip(axes, sizes)) + local
        if t_axes:
            stacked.append(stacked_shards(execution, t).reshape(shape))
            raw.append(None)
        else:
            shard = t.shards[()]
            stacked.append(shard.reshape(shape))
            raw.append(shard)
        ranks.append(len(local))
    batch = Batch(tuple(axes), sizes, stacked, raw, ranks)
    inputs = list(call.inputs)
    if decision.local_args is not None:
        inputs = decision.local_args(inputs, dict(zip(axes, keys[0])))
    result = adapter(call, inputs, batch)
    if result is None:
        return None
    return _outputs(execution, result, axes, sizes, decision, call)


def _outputs(execution, result, axes, sizes, decision, call):
    """DTensors of the batched results (each kept stacked for the next batched op)."""
    mesh = execution.mesh
    flat = list(result) if isinstance(result, (tuple, list)) else [result]
    layouts = decision.outputs
    outputs = []
    for i, value in enumerate(flat):
        if not isinstance(value, Tensor):
            return None  # a non-tensor result per shard: let the per-shard path build it
        if tuple(value.shape[:len(axes)]) != sizes:
            raise AssertionError(f"{call.name}: batched result has batch dimensions {tuple(value.shape)[:len(axes)]}, "
                                 f"expected {sizes}")
        local = tuple(value.shape[len(axes):])
        if layouts is None:
            layout = TensorLayout.replicated(mesh, len(local))
        elif callable(layouts):  # a layout by output rank (rank-local results)
            layout = layouts(len(local))
        else:
            layout = layouts[i] if isinstance(layouts, (list, tuple)) else layouts
        out_axes = significant_axes(layout)
        if not set(out_axes) <= set(axes):
            raise AssertionError(f"sharding rule bug: output axes {out_axes} not among input axes {axes}")
        if tuple(out_axes) != tuple(axes):  # replicas along the other axes: keep coordinate 0
            value = value[tuple(slice(None) if a in out_axes else 0 for a in axes)]
        stacked = value.reshape((math.prod(mesh.device_matrix[a] for a in out_axes),) + local)
        global_shape = tuple(n * layout.shard_count(d) for d, n in enumerate(local))
        outputs.append(DTensor._from_stack(layout, stacked, execution.keys(out_axes), global_shape, value.dtype,
                                           execution))
    if isinstance(result, (tuple, list)):
        return type(result)(outputs)
    return outputs[0]
