"""Ring attention over the context-parallel axis: in simulation (every member in this process)
and under msrun (one member per process: `_process_ring`).

Each of the cp devices holds a sequence chunk of q, k and v. In cp steps every device meets
every K/V chunk: at step i device r works on the chunk of device (r - i) mod cp, received from
its ring neighbour, and folds the block's scores into an online softmax (running row maximum m,
sum l, and unnormalised output acc; out = acc / l at the end). A device holds one K/V block of
scores at a time, never the [t, s] matrix.

Masks are sliced per block with the block's global offsets. A block every entry of which the
mask steps push to `MASKED_BELOW` or lower (-1e9, -inf) has softmax weight exactly 0 and is
skipped. When the mask leaves blocks empty (a causal mask) and the sequence divides by 2*cp, the
sequence is cut in 2*cp chunks and device r works on chunks r and 2*cp-1-r (the zigzag order):
every device then computes the same number of blocks. The chunk exchange that zigzag needs is a
p2p transfer on the axis, as are the ring's K/V blocks; both are recorded (forward, and their
gradients' way back in backward).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mindspore import mint, ops

from mindspore_hyper.comm.collectives import on_gradient
from mindspore_hyper.dtensor.context.scores import MASKED_BELOW, AttentionScores, Step
from mindspore_hyper.dtensor.dtensor import DTensor, key_of, significant_axes
from mindspore_hyper.dtensor.rules.common import make

__all__ = ["attention", "zigzag_chunks", "ROW_FLOOR"]

ROW_FLOOR = -1e30  # lower bound of the online softmax's running row maximum (finite: -inf - -inf is NaN)


def zigzag_chunks(rank: int, size: int) -> Tuple[int, int]:
    """The two of 2*size sequence chunks device `rank` works on in the balanced causal order."""
    return rank, 2 * size - 1 - rank


def attention(execution, scores: AttentionScores, value: DTensor) -> DTensor:
    """Ring attention of `scores` (softmax pending) with `value` (see module docstring).

    Raises:
        ValueError: a process holding some but not all members of the cp axis, or a query chunk
            whose every key is masked out.
    """
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
    if not execution.holds_all_ranks:
        return _process_ring(execution, (q, kt, v, masks), (q_layout, kt_layout, v_layout), axis, cp_name)
    per_rank = 2 if t == s and t % (2 * n) == 0 and _has_empty_block(masks, 2 * n, t, s) else 1
    chunks = per_rank * n
    holdings = [zigzag_chunks(r, n) if per_rank == 2 else (r,) for r in range(n)]
    others = sorted((set(significant_axes(q_layout)) | set(significant_axes(kt_layout)) |
                     set(significant_axes(v_layout))) - {axis})
    groups = execution.keys(others)  # the rings (one per coordinate off the cp axis) run stacked
    per_group = [[_locals(dict(zip(others, g)), axis, r, q, kt, v, masks) for r in range(n)] for g in groups]
    local = [_stacked([per_group[g][r] for g in range(len(groups))], q.ndim) for r in range(n)]
    skip = _empty_blocks(local[0][3], masks, chunks, t, s)
    outs, processed = _ring(local, [step for step, _ in masks], holdings, skip, chunks, t, s)
    out_shards = {}
    for r in range(n):
        parts = ops.unstack(outs[r], 0) if len(groups) > 1 else [outs[r]]
        for g, part in zip(groups, parts):
            coords = dict(zip(others, g))
            coords[axis] = r
            out_shards[key_of(coords, significant_axes(v_layout))] = part
    out_shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    out = DTensor._create(v_layout, out_shards, out_shape, q.dtype, execution)
    _account(execution, cp_name, per_group[0], processed, holdings, per_rank, n, chunks)
    return out


def _process_ring(execution, tensors, layouts, axis: int, cp_name: str) -> DTensor:
    """The ring with one cp member per process (msrun): this process's chunk of q stays, the
    K/V chunks move one step around the ring per block over the comm library, contiguous chunks,
    no block skipped. With collectives that have `ring_shift_async` the next step's K/V shift is
    posted before the current block is computed and waited for after it (the transfer overlaps
    the block's compute); else each shift is a blocking `ring_shift` after the block."""
    q, kt, v, masks = tensors
    q_layout, kt_layout, v_layout = layouts
    n = execution.mesh.device_matrix[axis]
    if len(execution.local_ranks) != 1:
        raise ValueError(f"context_method='ring': a process holds {len(execution.local_ranks)} ranks but not every "
                         f"member of the context-parallel axis {cp_name!r}; hold all of them or one")
    coords = dict(enumerate(execution.mesh.coords(execution.local_ranks[0])))
    rank = coords[axis]
    group = execution.group([axis], {a: c for a, c in coords.items() if a != axis})
    pick = lambda t: t.shards[key_of(coords, significant_axes(t.layout))]  # noqa: E731
    q_local, k_cur, v_cur = pick(q), pick(kt), pick(v)
    local_masks = [None if m is None else pick(m) for _, m in masks]
    steps = [step for step, _ in masks]
    t, s = q.shape[-2], kt.shape[-1]
    accounting = execution.accounting
    shift_async = getattr(execution.collectives, "ring_shift_async", None)
    state, processed = None, 0
    for step in range(n):
        # every block is computed (a masked-out one adds exactly 0): each received K/V chunk must
        # take part in the loss, or its gradient's way back (the shift's backward) would not run
        # on this process while its ring neighbour waits for it
        handle = None
        if step < n - 1:
            for current in (k_cur, v_cur):
                nbytes = math.prod(current.shape) * current.dtype.itemsize
                if group.records:
                    accounting.record_comm("P2P", cp_name, nbytes, nbytes)
            if shift_async is not None:
                handle = shift_async([k_cur, v_cur], group)
        source = (rank - step) % n
        block = _scores(q_local, k_cur, steps, local_masks, (rank, source), n, (t, s))
        state = _fold(state, block, v_cur)
        processed += 1
        if handle is not None:
            k_cur, v_cur = handle.wait()
        elif step < n - 1:
            k_cur = execution.collectives.ring_shift([k_cur], group)[0]
            v_cur = execution.collectives.ring_shift([v_cur], group)[0]
    out = state[2] / state[1]
    block = math.prod(q_local.shape[:-1]) * k_cur.shape[-1] * q_local.dtype.itemsize
    held = 2 * block * processed + (n - 1) * (math.prod(k_cur.shape) + math.prod(v_cur.shape)) * q.dtype.itemsize
    if execution.holds_activations:
        accounting.hold(held)
    out_shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    return DTensor._create(v_layout, {key_of(coords, significant_axes(v_layout)): out}, out_shape, q.dtype, execution)


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


def _span(index: int, chunks: int, length: int) -> Tuple[int, int]:
    size = length // chunks
    return index * size, (index + 1) * size


def _mask_block(mask, rows: Tuple[int, int], cols: Tuple[int, int]):
    """The block of a (broadcasting) mask at global rows/cols."""
    if mask is None:
        return None
    if mask.ndim >= 1 and mask.shape[-1] > 1:
        mask = mint.narrow(mask, mask.ndim - 1, cols[0], cols[1] - cols[0])
    if mask.ndim >= 2 and mask.shape[-2] > 1:
        mask = mint.narrow(mask, mask.ndim - 2, rows[0], rows[1] - rows[0])
    return mask


def _mask_block_numpy(mask: Optional[np.ndarray], rows: Tuple[int, int], cols: Tuple[int, int]):
    """`_mask_block` of a NumPy copy."""
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
            rows, cols = _span(i, chunks, t), _span(j, chunks, s)
            x = np.zeros((), np.float32)
            for (step, _), array in zip(masks, arrays):
                x = step.apply_numpy(x, _mask_block_numpy(array, rows, cols))
            empty[i, j] = bool(np.all(x <= MASKED_BELOW))
    return empty


def _ring(local, steps: Sequence[Step], holdings, skip: np.ndarray, chunks: int, t: int, s: int):
    """Outputs per cp rank (its contiguous shard) and the blocks each rank computed."""
    n = len(local)
    per_rank = chunks // n
    q_chunk, k_chunk, v_chunk = {}, {}, {}
    for r, (q, kt, v, _) in enumerate(local):  # chunk c lives on contiguous rank c // per_rank
        size_q, size_k = q.shape[-2] // per_rank, kt.shape[-1] // per_rank
        for j in range(per_rank):
            c = r * per_rank + j
            q_chunk[c] = mint.narrow(q, q.ndim - 2, j * size_q, size_q)
            k_chunk[c] = mint.narrow(kt, kt.ndim - 1, j * size_k, size_k)
            v_chunk[c] = mint.narrow(v, v.ndim - 2, j * size_k, size_k)
    out_chunk = {}
    processed = [0] * n
    for r in range(n):
        masks = local[r][3]
        for qi in holdings[r]:
            state = None
            for step in range(n):  # K/V of device (r - step) mod n arrive at step `step`
                for kj in holdings[(r - step) % n]:
                    if skip[qi, kj]:
                        continue
                    block = _scores(q_chunk[qi], k_chunk[kj], steps, masks, (qi, kj), chunks, (t, s))
                    state = _fold(state, block, v_chunk[kj])
                    processed[r] += 1
            if state is None:
                raise ValueError(f"ring attention: every key of query chunk {qi} is masked out (a fully masked row)")
            out_chunk[qi] = state[2] / state[1]
    outs = [ops.concat([out_chunk[r * per_rank + j] for j in range(per_rank)], -2) if per_rank > 1
            else out_chunk[r] for r in range(n)]
    return outs, processed


def _scores(q, kt, steps: Sequence[Step], masks, block: Tuple[int, int], chunks: int, lengths: Tuple[int, int]):
    """Block (query chunk, key chunk) of the scores: q @ k^T and the steps with their mask blocks."""
    scores = ops.matmul(q, kt)
    rows, cols = _span(block[0], chunks, lengths[0]), _span(block[1], chunks, lengths[1])
    for step, mask in zip(steps, masks):
        scores = step.apply(scores, _mask_block(mask, rows, cols))
    return scores


def _fold(state, block, v):
    """One online-softmax update: (m, l, acc) with `block`'s scores and its V chunk. The
    running maximum is floored at ROW_FLOOR so a row whose keys in this block are all -inf
    (padding) contributes exp(-inf) = 0 instead of NaN."""
    block_max = ops.stop_gradient(ops.clamp(block.max(axis=-1, keepdims=True), min=ROW_FLOOR))
    if state is None:
        p = ops.exp(block - block_max)
        return block_max, p.sum(axis=-1, keepdims=True), ops.matmul(p, v)
    m, l, acc = state
    m_new = ops.maximum(m, block_max)
    correction = ops.exp(m - m_new)
    p = ops.exp(block - m_new)
    return m_new, l * correction + p.sum(axis=-1, keepdims=True), acc * correction + ops.matmul(p, v)


def _account(execution, axis_name: str, local, processed: List[int], holdings, per_rank: int, n: int,
             chunks: int) -> None:
    """Per-device p2p bytes (forward; backward when the K/V gradients pass) and the blocks'
    activation bytes of the busiest device."""
    q, kt, v, _ = local[0]
    nbytes = lambda x: math.prod(x.shape) * x.dtype.itemsize  # noqa: E731
    kv_bytes = nbytes(kt) + nbytes(v)
    accounting = execution.accounting
    moves = [kv_bytes] * (n - 1)
    if per_rank == 2:  # zigzag: rank 0 gives away chunk 1 of q/k/v and gets its output back
        leaving = [c for c in range(per_rank) if c not in holdings[0]]
        chunk = (nbytes(q) + kv_bytes) // per_rank
        out_chunk = nbytes(q) // per_rank * v.shape[-1] // max(q.shape[-1], 1)
        moves.append(len(leaving) * (chunk + out_chunk))
    for sent in moves:
        accounting.record_comm("P2P", axis_name, sent, sent)
    block_rows = q.shape[-2] // per_rank
    block_cols = kt.shape[-1] // per_rank
    block = math.prod(q.shape[:-2]) * block_rows * block_cols * q.dtype.itemsize
    held = 2 * block * max(processed) + (n - 1) * kv_bytes  # scores and weights per block, received K/V
    if execution.holds_activations:
        accounting.hold(held)
    else:
        accounting.allocate(held)
        accounting.free(held)

    def backward(_grad):
        for sent in moves:
            accounting.record_comm("P2P", axis_name, sent, sent, backward=True)

    on_gradient(kt, backward)
