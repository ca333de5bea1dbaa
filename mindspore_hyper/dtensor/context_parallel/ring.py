"""Ring attention over the context-parallel axis, in simulation (every member in this process)
and under msrun (one member per process): the DTensor side. The ring itself (forward and its
hand-written backward) is `ring_core.RingAttention`, the same math in both modes; the transports
(`ring_transports.py`) move its tensors: directly between the members this process holds, or over
the process collectives (`ring_shift_async`, `permute_chunks`).

Each of the cp devices holds a sequence chunk of q, k and v. In cp steps every device meets
every K/V chunk (online softmax); a device holds one K/V block of scores at a time, never the
[t, s] matrix.

Masks are sliced per block with the block's global offsets. A block every entry of which the
mask steps push to `MASKED_BELOW` or lower (-1e9, -inf) has softmax weight exactly 0 and is
skipped, forward and backward. When the mask leaves blocks empty (a causal mask) and the sequence
divides by 2*cp, the sequence is cut in 2*cp chunks and device r works on chunks r and 2*cp-1-r
(the zigzag order): every device then computes the same number of blocks. The chunk exchange
that zigzag needs is a p2p transfer on the axis, as are the ring's K/V blocks; both are recorded,
forward and backward, as what a device sends (the busiest one in simulation).

A dry run (shape-only shards) has no mask values: `ring_shapes` finds the skipped blocks from the
structure of a causal (diagonal) constant mask and makes the ring's moves on shapes; any other
mask is refused there.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import ops

from mindspore_hyper import bfloat16_emulation
from mindspore_hyper.dtensor.context_parallel import ring_shapes
from mindspore_hyper.dtensor.context_parallel.ring_core import RingAttention, RingPlan, span
from mindspore_hyper.dtensor.context_parallel.ring_transports import LocalRing, ProcessRing
from mindspore_hyper.dtensor.context_parallel.scores import MASKED_BELOW, AttentionScores
from mindspore_hyper.dtensor.dtensor import DTensor, is_float, key_of, significant_axes
from mindspore_hyper.dtensor.rules.common import make

__all__ = ["attention"]


def attention(execution, scores: AttentionScores, value: DTensor) -> DTensor:
    """Ring attention of `scores` (softmax pending) with `value` (see module docstring).

    Raises:
        ValueError: a process holding some but not all members of the cp axis, or a query chunk
            whose every key is masked out.
    """
    mode = None if execution.shape_only else \
        bfloat16_emulation.emulated_kernel([scores.q.dtype, scores.key_t.dtype, value.dtype])
    if mode is not None:
        return _in_float32(execution, scores, value, mode)
    return _attention(execution, scores, value)


def _in_float32(execution, scores: AttentionScores, value: DTensor, mode: str) -> DTensor:
    """Ring attention whose kernels would get bfloat16 on the CPU, with `cpu_bfloat16="emulate"`
    (`mode`: `bfloat16_emulation.emulated_kernel`'s). The ring runs MindSpore's kernels on the
    shards itself, outside the dispatcher, so it is emulated as one fused kernel (Ascend's
    FlashAttentionScore: bfloat16 in and out, float32 inside): q, k, v and float masks (rounded to
    bfloat16 first where a BF16 Cell casts) are cast to float32, the ring runs in float32 (the
    type FP32 pushed: no Cell casts its kernels), and its output is rounded once to bfloat16.
    The backward follows the casts: the ring's float32 gradients, rounded once. The report counts
    what the fused kernel moves and keeps on a device, as a dry run does: its moves and held bytes
    at bfloat16's 2 bytes an element, and the float32 copies and output (the kernel's inside) not
    at all."""

    def up(t):
        if t is None or not is_float(t.dtype):
            return t
        if mode == "cell" and t.dtype != ms.bfloat16:
            t = ops.cast(t, ms.bfloat16)  # the Cell's cast
        with execution.uncounted():
            return ops.cast(t, ms.float32)

    with bfloat16_emulation.float32_kernels():
        steps = tuple(dataclasses.replace(step, mask=up(step.mask)) for step in scores.steps)
        fused = AttentionScores(up(scores.q), up(scores.key_t), steps, scores.softmax)
        return ops.cast(_attention(execution, fused, up(value), travels=ms.bfloat16), ms.bfloat16)


def _attention(execution, scores: AttentionScores, value: DTensor, travels=None) -> DTensor:
    """`attention` in the dtype of its operands; where `travels` is given (the emulated ring: its
    operands float32 here, bfloat16 on a device), every tensor the ring moves has q's dtype and
    its bytes are counted at `travels`'s size an element."""
    cp_name = execution.context_parallel.axis
    axis = execution.mesh.axis_index(cp_name)
    n = execution.mesh.device_matrix[axis]
    q_layout, kt_layout, v_layout = _layouts(scores, value, axis)
    q = scores.q.redistribute(q_layout)
    kt = scores.key_t.redistribute(kt_layout)
    v = value.redistribute(v_layout)
    masks = [(step, None if step.mask is None else step.mask.redistribute(_mask_layout(step.mask, q_layout)))
             for step in scores.steps]
    t, s = q.shape[-2], kt.shape[-1]

    def record(nbytes: int, backward: bool) -> None:
        if travels is not None:
            nbytes = nbytes // q.dtype.itemsize * travels.itemsize
        execution.accounting.record_comm("P2P", cp_name, nbytes, nbytes, backward=backward,
                                         cause="ring attention K/V shifts (context parallel)")

    if execution.shape_only:
        return _shape_only(execution, (q, kt, v), scores.steps, axis, record)
    per_rank = 2 if t == s and t % (2 * n) == 0 and _has_empty_block(masks, 2 * n, t, s) else 1
    tensors = (q, kt, v, masks)
    ring = _simulated(execution, tensors, axis, record) if execution.holds_all_ranks else \
        _in_process(execution, tensors, axis, cp_name, record)
    skip = _empty_blocks(ring.members[0][3], masks, per_rank * n, t, s)
    plan = RingPlan(n, ring.ranks, per_rank, tuple(step for step, _ in masks), skip, (t, s))
    core = RingAttention(plan, ring.transport, [m[3] for m in ring.members])
    outs = core(*[x for member in ring.members for x in member[:3]], *core.graded_masks())
    out_shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    with execution.uncounted() if travels is not None else contextlib.nullcontext():
        out = DTensor._create(v_layout, ring.shards(outs, v_layout), out_shape, q.dtype, execution)
    _hold(execution, ring.device, per_rank, travels)
    return out


def _shape_only(execution, tensors, steps, axis: int, record) -> DTensor:
    """A dry run's ring (`ring_shapes`): the skipped blocks from the masks' structure, the moves
    on shapes, the representative device's output shard and held bytes."""
    q, kt, v = tensors
    cp_name = execution.context_parallel.axis
    n = execution.mesh.device_matrix[axis]
    t, s = q.shape[-2], kt.shape[-1]
    structures = ring_shapes.mask_structures(steps, (t, s), cp_name)
    coords = dict(enumerate(execution.mesh.coords(execution.local_ranks[0])))
    pick = lambda x: x.shards[key_of(coords, significant_axes(x.layout))]  # noqa: E731
    device = (pick(q), pick(kt), pick(v))
    ring_shapes.check_dtypes(*device, steps, cp_name)
    empty = lambda chunks: ring_shapes.empty_blocks(structures, steps, chunks, t, s)  # noqa: E731
    per_rank = 2 if t == s and t % (2 * n) == 0 and empty(2 * n).any() else 1
    plan = RingPlan(n, tuple(range(n)), per_rank, tuple(steps), empty(per_rank * n), (t, s))
    backward = execution.holds_activations and any(getattr(x, "grad_path", False) for x in device)
    shard = ring_shapes.run(plan, LocalRing(record), *device, backward=backward)
    out = DTensor._create(v.layout, {key_of(coords, significant_axes(v.layout)): shard},
                          tuple(q.shape[:-1]) + (v.shape[-1],), q.dtype, execution)
    _hold(execution, device, per_rank)
    return out


@dataclass
class _Members:
    """The ring's members this process holds.

    Attributes:
        members: per member (q, k^T, v, masks): its shards (stacked over rings when `stacked`).
        ranks: each member's cp rank.
        device: one device's (q, k^T, v) shards, for per-device bytes.
        transport: how the members' tensors move (`LocalRing` / `ProcessRing`).
        coords: per member, the mesh coordinates of its output shards (one per stacked ring).
        stacked: the members' tensors stack several rings along a new leading dimension.
    """

    members: list
    ranks: Tuple[int, ...]
    device: tuple
    transport: object
    coords: List[List[Dict[int, int]]]
    stacked: bool = False

    def shards(self, outs, v_layout) -> Dict:
        """The output DTensor's shards from the members' outputs."""
        shards = {}
        for member, out in enumerate(outs):
            parts = ops.unstack(out, 0) if self.stacked else [out]
            for coords, part in zip(self.coords[member], parts):
                shards[key_of(coords, significant_axes(v_layout))] = part
        return shards


def _simulated(execution, tensors, axis: int, record):
    """Every member in this process: one ring per coordinate off the cp axis, stacked along a new
    leading dimension."""
    q, kt, v, masks = tensors
    n = execution.mesh.device_matrix[axis]
    layouts = (q.layout, kt.layout, v.layout)
    others = sorted(set().union(*(significant_axes(layout) for layout in layouts)) - {axis})
    groups = execution.keys(others)  # the rings (one per coordinate off the cp axis) run stacked
    per_group = [[_locals(dict(zip(others, g)), axis, r, q, kt, v, masks) for r in range(n)] for g in groups]
    members = [_stacked([per_group[g][r] for g in range(len(groups))], q.ndim) for r in range(n)]
    keys = [[{**dict(zip(others, g)), axis: r} for g in groups] for r in range(n)]
    return _Members(members, tuple(range(n)), per_group[0][0][:3], LocalRing(record, len(groups)), keys,
                    stacked=len(groups) > 1)


def _in_process(execution, tensors, axis: int, cp_name: str, record):
    """One member in this process (msrun): its shards, the transport over the process collectives."""
    q, kt, v, masks = tensors
    if len(execution.local_ranks) != 1:
        raise ValueError(f"context_method='ring': a process holds {len(execution.local_ranks)} ranks but not every "
                         f"member of the context-parallel axis {cp_name!r}; hold all of them or one")
    collectives = execution.collectives
    if not all(hasattr(collectives, name) for name in ("ring_shift_async", "permute_chunks")):
        raise ValueError(f"context_method='ring' with one member of {cp_name!r} per process needs collectives with "
                         f"ring_shift_async and permute_chunks (ProcessCollectives); got {type(collectives).__name__}")
    coords = dict(enumerate(execution.mesh.coords(execution.local_ranks[0])))
    group = execution.group([axis], {a: c for a, c in coords.items() if a != axis})
    pick = lambda t: t.shards[key_of(coords, significant_axes(t.layout))]  # noqa: E731
    member = (pick(q), pick(kt), pick(v), [None if m is None else pick(m) for _, m in masks])
    return _Members([member], (coords[axis],), member[:3], ProcessRing(collectives, group, record), [[coords]])


def _hold(execution, device, per_rank: int, travels=None) -> None:
    """What the ring keeps for its backward beyond its inputs and output (DTensors, counted as
    such), per device: the rows' log-sum-exp, and in zigzag order its q/k^T/v chunks (copies beside
    the contiguous inputs); at `travels`'s size an element where given (`_attention`)."""
    q, kt, v = device
    size = lambda x: x.dtype.itemsize if travels is None else travels.itemsize  # noqa: E731
    nbytes = lambda x: math.prod(x.shape) * size(x)  # noqa: E731
    held = math.prod(q.shape[:-1]) * size(q) + (nbytes(q) + nbytes(kt) + nbytes(v) if per_rank == 2 else 0)
    accounting = execution.accounting
    if execution.holds_activations:
        accounting.hold(held)
    else:
        accounting.allocate(held)
        accounting.free(held)


def _layouts(scores: AttentionScores, value: DTensor, axis: int):
    """q: sequence (dim -2) on the cp axis, batch dims as they are; k^T: sequence (dim -1) on
    it; v like q; contraction and head dimensions whole."""
    q = scores.q
    mesh = q.layout.mesh
    batch = [tuple(a for a in e if a != axis) for e in q.layout.dims[:-2]]
    q_dims = batch + [(axis,), ()]
    kt_dims = batch + [(), (axis,)]
    return make(mesh, q_dims), make(mesh, kt_dims), make(mesh, batch + [(axis,), ()])


def _mask_layout(mask: DTensor, q_layout):
    """A mask's batch dimensions follow q's (where not broadcast); its last two stay whole."""
    offset = q_layout.ndim - mask.ndim
    dims = []
    for d in range(mask.ndim):
        j = d + offset
        dims.append(q_layout.dims[j] if j < q_layout.ndim - 2 and mask.shape[d] > 1 else ())
    return make(q_layout.mesh, dims)


def _locals(fixed: Dict[int, int], axis: int, rank: int, q, kt, v, masks):
    coords = dict(fixed)
    coords[axis] = rank
    pick = lambda t: t.shards[key_of(coords, significant_axes(t.layout))]  # noqa: E731
    return pick(q), pick(kt), pick(v), [None if m is None else pick(m) for _, m in masks]


def _stacked(members, ndim: int):
    """One rank's (q, k^T, v, masks) of every ring stacked along a new leading dimension (as
    is when there is one ring); a mask the rings share stays unstacked (it broadcasts), one that
    differs is stacked with size-1 dimensions up to the scores' rank."""
    if len(members) == 1:
        return members[0]
    q, kt, v = (ops.stack([m[i] for m in members], 0) for i in range(3))
    masks = []
    for i, first in enumerate(members[0][3]):
        if first is None or all(m[3][i] is first for m in members):
            masks.append(first)
        else:
            stacked = ops.stack([m[3][i] for m in members], 0)
            masks.append(stacked.reshape((len(members),) + (1,) * (ndim - first.ndim) + tuple(first.shape)))
    return q, kt, v, masks


def _mask_block_numpy(mask: Optional[np.ndarray], rows: Tuple[int, int], cols: Tuple[int, int]):
    """`ring_core.mask_block` of a NumPy copy."""
    if mask is None:
        return None
    index = [slice(None)] * mask.ndim
    if mask.ndim >= 1 and mask.shape[-1] > 1:
        index[-1] = slice(*cols)
    if mask.ndim >= 2 and mask.shape[-2] > 1:
        index[-2] = slice(*rows)
    return mask[tuple(index)]


def _has_empty_block(masks, chunks: int, t: int, s: int) -> bool:
    """Whether some block of the chunks x chunks grid is masked out everywhere (first shards)."""
    if not any(m is not None for _, m in masks):
        return False
    local = [None if m is None else next(iter(m.shards.values())) for _, m in masks]
    return bool(_empty_blocks(local, masks, chunks, t, s).any())


def _empty_blocks(local_masks: Sequence, masks, chunks: int, t: int, s: int) -> np.ndarray:
    """[chunks, chunks] bools: block (i, j) of the scores is masked out everywhere (the steps
    applied to zero scores leave every entry at or below MASKED_BELOW)."""
    empty = np.zeros((chunks, chunks), bool)
    if not any(m is not None for m in local_masks):
        return empty
    arrays = [None if m is None else m.asnumpy() for m in local_masks]
    for i in range(chunks):
        for j in range(chunks):
            rows, cols = span(i, chunks, t), span(j, chunks, s)
            x = np.zeros((), np.float32)
            for (step, _), array in zip(masks, arrays):
                x = step.apply_numpy(x, _mask_block_numpy(array, rows, cols))
            empty[i, j] = bool(np.all(x <= MASKED_BELOW))
    return empty


