"""Ring attention in a dry run: `ring_core.RingAttention`'s plan and moves on shapes, no values.

The blocks the ring skips (and so whether it takes the zigzag order) come from the masks'
structure instead of their values: each mask must be a diagonal constant (`diagonal_mask`: a
causal mask built by the model code on the host), whose value at every position of a block
follows from col - row. Within a block col - row takes every integer from its smallest to its
largest value, and a diagonal mask changes only across its diagonal, so the steps applied at
those two ends and on both sides of each mask's diagonal meet every value the block holds: the
block is empty exactly when the simulation (reading every entry) finds it so.

The moves are RingAttention's, in its order, made over a `LocalRing` of the n members holding
stand-ins of the chunks' shapes, so each move's bytes are what the simulation records (the
busiest device's): forward the zigzag permutes of q, k^T, v and the output and the n-1 K/V
shifts; backward (when a training backward follows) the permutes of dout and its row sums, the
n K/V-and-accumulator shifts with the last one home, and the permutes of dq, dk^T, dv.
"""
from __future__ import annotations

from collections import namedtuple
from typing import List, Optional, Sequence, Tuple

import numpy as np

from mindspore_hyper.dtensor.context_parallel.diagonal_mask import DiagonalMask, diagonal_of
from mindspore_hyper.dtensor.context_parallel.ring_core import RingPlan, span
from mindspore_hyper.dtensor.context_parallel.scores import MASKED_BELOW
from mindspore_hyper.dtensor.meta import MetaTensor, meta

__all__ = ["mask_structures", "empty_blocks", "check_dtypes", "run"]

_Chunk = namedtuple("_Chunk", "shape dtype")  # what a move's bytes are computed from


def _refusal(cp_name: str, why: str) -> ValueError:
    return ValueError(
        f"dry run: context_parallel={cp_name!r} with context_method='ring' (the default) is not modelled: ring "
        f"attention reads the attention mask's values to skip masked-out blocks and choose the zigzag order, and a "
        f"dry run has none; it knows them from positions only for a mask the model code builds as a constant with "
        f"one diagonal (a causal mask, e.g. np.triu(np.full((t, s), -1e9), 1)); {why}. Dry-run it with "
        f"context_method='ulysses' (equal to the simulation) or run the ring in simulation")


def mask_structures(steps, lengths: Tuple[int, int], cp_name: str) -> List[Optional[DiagonalMask]]:
    """Each step's mask as a DiagonalMask (None for a step without one).

    Args:
        steps: the attention's score steps (`scores.Step`; masks are DTensors of shape-only shards).
        lengths: (t, s), the scores' last two dimensions.
        cp_name: the context-parallel axis (named in errors).

    Raises:
        ValueError: a mask whose last two dimensions are not (t, s), that is computed by the run
            (from inputs or parameters) rather than a constant, or that is not diagonal.
    """
    found = []
    for number, step in enumerate(steps):
        if step.mask is None:
            found.append(None)
            continue
        what = f"the mask of score step {number} ({step.kind}, shape {tuple(step.mask.shape)})"
        if step.mask.ndim < 2 or tuple(step.mask.shape[-2:]) != tuple(lengths):
            raise _refusal(cp_name, f"{what} does not span the whole {lengths[0]} x {lengths[1]} scores")
        shards = list(step.mask.shards.values())
        constant = getattr(shards[0], "constant", None) if len(shards) == 1 else None
        if constant is None:
            raise _refusal(cp_name, f"{what} is computed by the run (from inputs or parameters), not a constant")
        structure = diagonal_of(constant)
        if structure is None:
            raise _refusal(cp_name, f"{what} is a constant without one diagonal structure")
        found.append(structure)
    return found


def check_dtypes(q, kt, v, steps, cp_name: str) -> None:
    """The backward ring sends gradients of k^T and v at their dtypes only when q, k^T, v and
    every additive mask share one dtype (otherwise MindSpore's type promotion decides them).

    Raises:
        ValueError: the dtypes differ (named).
    """
    dtypes = {str(x.dtype) for x in (q, kt, v)} | {str(s.mask.dtype) for s in steps if s.kind == "add"}
    if len(dtypes) > 1:
        raise ValueError(f"dry run: ring attention over {cp_name!r} with q, k, v and additive masks of dtypes "
                         f"{sorted(dtypes)}: the backward ring's gradient dtypes then follow MindSpore's type "
                         "promotion, which the dry run does not model; give them one dtype, or use "
                         "context_method='ulysses'")


def empty_blocks(structures: Sequence[Optional[DiagonalMask]], steps, chunks: int, t: int, s: int) -> np.ndarray:
    """[chunks, chunks] bools: block (i, j) of the scores is masked out everywhere (the steps
    applied to zero scores leave every entry at or below MASKED_BELOW), from positions alone
    (see module docstring; `ring._empty_blocks` reads the values instead)."""
    empty = np.zeros((chunks, chunks), bool)
    if not any(m is not None for m in structures):
        return empty
    offsets = [m.offset for m in structures if m is not None]
    for i in range(chunks):
        rows = span(i, chunks, t)
        for j in range(chunks):
            cols = span(j, chunks, s)
            low, high = cols[0] - (rows[1] - 1), (cols[1] - 1) - rows[0]  # col - row over the block
            distances = np.clip(np.array([[low, high] + offsets + [o + 1 for o in offsets]]), low, high)
            x = np.zeros((), np.float32)
            for step, structure in zip(steps, structures):
                x = step.apply_numpy(x, None if structure is None else structure.at(distances))
            empty[i, j] = bool(np.all(x <= MASKED_BELOW))
    return empty


def _chunk(x, dim: int, parts: int) -> _Chunk:
    shape = list(x.shape)
    shape[dim] //= parts
    return _Chunk(tuple(shape), x.dtype)


def run(plan: RingPlan, transport, q, kt, v, backward: bool) -> MetaTensor:
    """RingAttention's moves for one device's (q, k^T, v) shards on `transport` (a LocalRing of
    `plan.size` members), the backward's when `backward` (see module docstring).

    Returns:
        The device's output shard [..., t/n, dv] (shape and dtype only).
    """
    n, p = plan.size, plan.per_rank
    qc, ktc, vc = _chunk(q, -2, p), _chunk(kt, -1, p), _chunk(v, -2, p)
    out = meta(tuple(q.shape[:-1]) + (v.shape[-1],), q.dtype,
               grad_path=any(getattr(x, "grad_path", False) for x in (q, kt, v)))
    oc = _chunk(out, -2, p)
    sources = plan.sources()
    inverse = [sources.index(c) for c in range(len(sources))]

    def permute(chunk: _Chunk, order, phase: str) -> None:
        if p == 2:
            transport.permute([[chunk] * p for _ in range(n)], order, phase)

    kv = [ktc] * p + [vc] * p
    for chunk in (qc, ktc, vc):
        permute(chunk, sources, "forward")
    for _ in range(n - 1):
        transport.shift([kv for _ in range(n)], "forward")
    permute(oc, inverse, "forward")
    if not backward:
        return out
    permute(oc, sources, "backward")  # dout
    permute(_Chunk(oc.shape[:-1] + (1,), oc.dtype), sources, "backward")  # its row sums with the output
    if n > 1:
        for step in range(n):  # K/V onwards but at the last step, the accumulators (kv's shapes) from step 1 on
            transport.shift([(kv if step < n - 1 else []) + (kv if step > 0 else []) for _ in range(n)], "backward")
        transport.shift([kv for _ in range(n)], "backward")  # the accumulators home
    for chunk in (qc, ktc, vc):  # dq, dk^T, dv back to contiguous order
        permute(chunk, inverse, "backward")
    return out
