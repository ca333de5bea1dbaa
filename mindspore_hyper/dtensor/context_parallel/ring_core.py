"""Ring attention's forward and backward passes over the members of one ring: the math both the
simulation (every cp member in this process) and msrun (one per process) run.

`RingAttention` is one node of MindSpore's PyNative autograd graph (MindSpore's custom autograd
function `mindspore.common._Function`, torch's `autograd.Function`): its `forward` is the forward
ring, its `backward` the backward ring (a hand-written, flash-attention style backward, instead of
MindSpore's autodiff of the forward). Both `mindspore.value_and_grad` and `run_backward` (torch-style
`loss.backward()`, `hyper_parallel/autograd_compat.py`) differentiate it, where `run_backward`
cannot run a Cell's custom `bprop`. It sees the ring through a transport (`ring_transports.py`)
that moves each local member's tensors one step around the ring (`shift`, member r's to member
r+1, answered by a handle whose `wait()` gives member r-1's) and moves chunks between members
(`permute`, for the zigzag order).

Chunks: the sequence is cut in `plan.chunks` chunks, `per_rank` per member: 1 (member r holds
chunk r of q, k^T and v) or 2 (zigzag: member r holds chunks r and 2n-1-r; the contiguous shards
are permuted to that order first and the outputs back). Block (query chunk i, key chunk j) is
skipped, forward and backward, when `plan.skip[i, j]` (its mask leaves every score at or below
MASKED_BELOW: softmax weight exactly 0).

Forward: at step i member r works with the K/V chunks of member (r - i) mod n; the shift that
brings the next step's K/V is posted before the step's blocks are computed and waited for after
them. Each block's scores fold into an online softmax (running row maximum m floored at
ROW_FLOOR, sum l, unnormalised output acc; out = acc / l). Kept for the backward: the member's
q/k^T/v chunks (its own inputs in contiguous order) and the per-row log-sum-exp lse = m + log(l)
([..., t_chunk, 1]); no block's scores or weights, no received K/V.

Backward: with delta = rowsum(dout * out), a second ring pass in which K/V travel again, each
with its gradient accumulators dk^T and dv. At step i member r recomputes its blocks' weights
p = exp(s - lse) with the K/V of member (r - i) mod n, adds ds @ k to dq (ds = p * (dout v^T -
delta), through the score steps backward) and computes its contributions q^T ds and p^T dout to
that K/V's accumulators. The accumulators arrive from member r-1, which added its own in step i-1;
member r adds its contributions and posts them onwards at the start of step i+1, together with
the next K/V, before computing that step (posted before the compute, waited for after it, as in
the forward). After the last step one more shift brings every accumulator home. Per member: n-1
K/V shifts and n accumulator shifts, all posted before compute but the last.

Masks: a mask that MindSpore's autodiff tracks (an additive float mask computed from parameters,
such as a learned position bias, or from the model's inputs) is an input of the cell and gets
its gradient: each block's score gradient at its "add" step, summed over the dimensions the mask
broadcasts, added at the block's rows and columns. Untracked masks (constant buffers such as a
causal mask) and boolean fill masks are constants of the attention and cost nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor, mint, ops
from mindspore.common import _Function

from mindspore_hyper.dtensor.context_parallel.scores import Step

__all__ = ["RingAttention", "RingPlan", "zigzag_chunks", "span", "mask_block", "ROW_FLOOR"]

ROW_FLOOR = -1e30  # lower bound of the online softmax's running row maximum (finite: -inf - -inf is NaN)


def zigzag_chunks(rank: int, size: int) -> Tuple[int, int]:
    """The two of 2*size sequence chunks device `rank` works on in the balanced causal order."""
    return rank, 2 * size - 1 - rank


def span(index: int, chunks: int, length: int) -> Tuple[int, int]:
    """[start, end) of chunk `index` of `chunks` equal chunks of `length` positions."""
    size = length // chunks
    return index * size, (index + 1) * size


def mask_block(mask, rows: Tuple[int, int], cols: Tuple[int, int]):
    """The block of a (broadcasting) mask at global rows/cols."""
    if mask is None:
        return None
    if mask.ndim >= 1 and mask.shape[-1] > 1:
        mask = mint.narrow(mask, mask.ndim - 1, cols[0], cols[1] - cols[0])
    if mask.ndim >= 2 and mask.shape[-2] > 1:
        mask = mint.narrow(mask, mask.ndim - 2, rows[0], rows[1] - rows[0])
    return mask


@dataclass(frozen=True)
class RingPlan:
    """What one ring attention computes.

    Attributes:
        size: n, the members of the ring (the cp axis size).
        ranks: the cp rank of each member this process holds, in member order (all n in
            simulation, one under msrun).
        per_rank: chunks per member: 1 (contiguous) or 2 (zigzag order).
        steps: the element-wise steps applied to q @ k^T, in order.
        skip: [chunks, chunks] bools: block (query chunk, key chunk) is not computed.
        lengths: (t, s), the global query and key sequence lengths.

    Raises:
        ValueError: a query chunk whose every block is skipped (every key masked out).
    """

    size: int
    ranks: Tuple[int, ...]
    per_rank: int
    steps: Tuple[Step, ...]
    skip: np.ndarray
    lengths: Tuple[int, int]

    def __post_init__(self):
        empty = [i for i in range(self.chunks) if self.skip[i].all()]
        if empty:
            raise ValueError(f"ring attention: every key of query chunk {empty[0]} (of {self.chunks}) is masked "
                             f"out (a fully masked row)")

    @property
    def chunks(self) -> int:
        return self.size * self.per_rank

    def holdings(self, rank: int) -> Tuple[int, ...]:
        """The chunks member `rank` works on."""
        return zigzag_chunks(rank, self.size) if self.per_rank == 2 else (rank,)

    def sources(self) -> List[int]:
        """The zigzag permutation: position k of the member-ordered chunks gets chunk sources[k]."""
        return [c for r in range(self.size) for c in self.holdings(r)]


@dataclass
class _Saved:
    """What the forward keeps for the backward, per member: q, k^T, v chunks and lse chunks."""

    q: list
    kt: list
    v: list
    lse: list


class RingAttention:
    """softmax(steps(q @ k^T)) @ v over a ring (see module docstring).

    Called with each local member's contiguous (q [..., t/n, d], k^T [..., d, s/n], v [..., s/n,
    dv]) in member order, flattened (q0, kt0, v0, q1, ...), followed by the masks `graded` names
    (`graded_masks()`); returns one output [..., t/n, dv] per member. `computed` counts the blocks
    each member computed, per pass ("forward", "backward").

    Args:
        plan: the ring's sizes, members, chunk order, steps and skipped blocks.
        transport: moves members' tensors (`LocalRing` or `ProcessRing`).
        masks: per member, each step's mask tensor (None for mul/div), last two dims whole.
    """

    def __init__(self, plan: RingPlan, transport, masks: Sequence[Sequence]):
        self.plan, self.transport, self.masks = plan, transport, [list(m) for m in masks]
        self.computed = {"forward": [0] * len(plan.ranks), "backward": [0] * len(plan.ranks)}
        self.saved: Optional[_Saved] = None
        # (member, step) of the additive float masks autodiff tracks: inputs of the cell, given gradients
        self.graded = [(m, k) for m, member in enumerate(self.masks) for k, (step, mask) in
                       enumerate(zip(plan.steps, member)) if step.kind == "add" and _tracked(mask)]
        self._mask_grads: Dict[Tuple[int, int], np.ndarray] = {}

    def graded_masks(self) -> List:
        """The masks to pass after q/k^T/v, in `graded` order."""
        return [self.masks[m][k] for m, k in self.graded]

    def __call__(self, *tensors) -> tuple:
        """Each member's output (the autograd node `_RingNode` over this ring)."""
        return _RingNode.apply(self, *tensors)

    def forward(self, *tensors) -> tuple:
        """The forward ring: each member's output; keeps what the backward needs in `saved`."""
        tensors = tensors[:3 * len(self.plan.ranks)]
        q, kt, v = (self._to_chunks(list(tensors[i::3]), dim, "forward") for i, dim in ((0, -2), (1, -1), (2, -2)))
        outs, lse = self._forward(q, kt, v)
        self.saved = _Saved(q, kt, v, lse)
        return tuple(self._from_chunks(outs, -2, "forward"))

    def backward(self, out: Sequence, dout: Sequence) -> tuple:
        """The backward ring: from the members' outputs and their gradients, the gradients of
        the inputs (each member's q, k^T, v, then the graded masks)."""
        dout = list(dout)
        saved, self.saved = self.saved, None
        delta = [(d * o).sum(-1, keepdims=True) for d, o in zip(dout, out)]
        dout, delta = self._to_chunks(dout, -2, "backward"), self._to_chunks(delta, -2, "backward")
        self._mask_grads = {key: np.zeros(self.masks[key[0]][key[1]].shape, np.float32) for key in self.graded}
        dq, dkt, dv = self._backward(saved, dout, delta)
        dq, dkt, dv = (self._from_chunks(g, dim, "backward") for g, dim in ((dq, -2), (dkt, -1), (dv, -2)))
        masks = [Tensor(self._mask_grads.pop(key), self.masks[key[0]][key[1]].dtype) for key in self.graded]
        return tuple(g for m in range(len(dq)) for g in (dq[m], dkt[m], dv[m])) + tuple(masks)

    # -- chunk order ---------------------------------------------------------------------------
    def _to_chunks(self, members: List, dim: int, phase: str) -> List[List]:
        """Each member's contiguous tensor -> the chunks it works on (zigzag: a permutation)."""
        if self.plan.per_rank == 1:
            return [[x] for x in members]
        halves = [list(ops.split(x, x.shape[dim] // 2, dim)) for x in members]
        return self.transport.permute(halves, self.plan.sources(), phase)

    def _from_chunks(self, chunks: List[List], dim: int, phase: str) -> List:
        """`_to_chunks` undone: each member's contiguous tensor."""
        if self.plan.per_rank == 1:
            return [c[0] for c in chunks]
        sources = self.plan.sources()
        inverse = [sources.index(c) for c in range(len(sources))]
        return [ops.concat(c, dim) for c in self.transport.permute(chunks, inverse, phase)]

    # -- the two passes ------------------------------------------------------------------------
    def _blocks(self, member: int, step: int):
        """(query slot, key slot, query chunk, key chunk) of the blocks `member` computes at `step`."""
        plan = self.plan
        rank = plan.ranks[member]
        source = (rank - step) % plan.size
        for a, i in enumerate(plan.holdings(rank)):
            for b, j in enumerate(plan.holdings(source)):
                if not plan.skip[i, j]:
                    yield a, b, i, j

    def _forward(self, q, kt, v):
        """The forward ring on the members' chunks: their output and lse chunks."""
        plan, members, p = self.plan, range(len(q)), self.plan.per_rank
        states = [[None] * p for _ in members]
        for step in range(plan.size):
            handle = self.transport.shift([kt[m] + v[m] for m in members], "forward") if step < plan.size - 1 \
                else None
            for m in members:
                for a, b, i, j in self._blocks(m, step):
                    states[m][a] = _fold(states[m][a], self._scores(m, q[m][a], kt[m][b], i, j), v[m][b])
                    self.computed["forward"][m] += 1
            if handle is not None:
                received = handle.wait()
                kt, v = [r[:p] for r in received], [r[p:] for r in received]
        outs = [[acc / l for _, l, acc in states[m]] for m in members]
        lse = [[top + ops.log(l) for top, l, _ in states[m]] for m in members]
        return outs, lse

    def _backward(self, saved: _Saved, dout, delta):
        """The backward ring on the members' chunks: their dq, dk^T and dv chunks."""
        plan, members, p = self.plan, range(len(saved.q)), self.plan.per_rank
        q, kt, v, lse = saved.q, saved.kt, saved.v, saved.lse
        dq = [[None] * p for _ in members]
        carried = None  # per member: the accumulators (dk^T chunks, dv chunks) of the K/V it worked with last
        for step in range(plan.size):
            posts = [(kt[m] + v[m] if step < plan.size - 1 else []) + (carried[m] if step > 0 else [])
                     for m in members]
            handle = self.transport.shift(posts, "backward") if plan.size > 1 else None
            mine = [[None] * (2 * p) for _ in members]
            for m in members:
                for a, b, i, j in self._blocks(m, step):
                    gq, gkt, gv = self._block_grads(m, (q[m][a], kt[m][b], v[m][b]), lse[m][a],
                                                    dout[m][a], delta[m][a], (i, j))
                    dq[m][a] = _add(dq[m][a], gq)
                    mine[m][b] = _add(mine[m][b], gkt)
                    mine[m][p + b] = _add(mine[m][p + b], gv)
                    self.computed["backward"][m] += 1
            received = handle.wait() if handle is not None else None
            incoming = [r[-2 * p:] for r in received] if step > 0 else [[None] * (2 * p) for _ in members]
            carried = [[_add(mine[m][c], incoming[m][c]) for c in range(2 * p)] for m in members]
            carried = [[g if g is not None else ops.zeros_like(like) for g, like in zip(carried[m], kt[m] + v[m])]
                       for m in members]
            if step < plan.size - 1:
                kt, v = [r[:p] for r in received], [r[p:2 * p] for r in received]
        if plan.size > 1:
            carried = self.transport.shift(carried, "backward").wait()
        dq = [[g if g is not None else ops.zeros_like(x) for g, x in zip(dq[m], q[m])] for m in members]
        return dq, [c[:p] for c in carried], [c[p:] for c in carried]

    # -- one block -----------------------------------------------------------------------------
    def _scores(self, member: int, q, kt, i: int, j: int):
        """Block (query chunk i, key chunk j) of the scores: q @ k^T and the steps with their mask blocks."""
        plan = self.plan
        rows, cols = span(i, plan.chunks, plan.lengths[0]), span(j, plan.chunks, plan.lengths[1])
        scores = ops.matmul(q, kt)
        for step, mask in zip(plan.steps, self.masks[member]):
            scores = step.apply(scores, mask_block(mask, rows, cols))
        return scores

    def _block_grads(self, member: int, qkv, lse, dout, delta, block: Tuple[int, int]):
        """One block's (dq, dk^T, dv) from the recomputed weights p = exp(s - lse)."""
        q, kt, v = qkv
        plan = self.plan
        weights = ops.exp(self._scores(member, q, kt, *block) - lse)
        dv = ops.matmul(weights.swapaxes(-1, -2), dout)
        ds = weights * (ops.matmul(dout, v.swapaxes(-1, -2)) - delta)
        rows, cols = span(block[0], plan.chunks, plan.lengths[0]), span(block[1], plan.chunks, plan.lengths[1])
        for k in reversed(range(len(plan.steps))):
            mask = self.masks[member][k]
            if (member, k) in self._mask_grads:  # ds is the gradient of this "add" step's output
                _add_block(self._mask_grads[(member, k)], ds, rows, cols)
            ds = plan.steps[k].grad(ds, mask_block(mask, rows, cols))
        return ops.matmul(ds, kt.swapaxes(-1, -2)), ops.matmul(q.swapaxes(-1, -2), ds), dv


class _RingNode(_Function):
    """A ring attention as one autograd node: `RingAttention.forward` and `.backward`."""

    @staticmethod
    def forward(ctx, ring, *tensors):  # pylint: disable=arguments-differ
        out = ring.forward(*tensors)
        ctx.ring = ring
        ctx.save_for_backward(*out)
        return out

    @staticmethod
    def backward(ctx, *dout):  # pylint: disable=arguments-differ
        return (None,) + ctx.ring.backward(ctx.saved_tensors, dout)


def _tracked(mask) -> bool:
    """Whether autodiff tracks `mask` (a float tensor computed from parameters or inputs)."""
    return mask is not None and mask.dtype in (ms.float16, ms.float32, ms.float64, ms.bfloat16) and \
        bool(getattr(mask, "_requires_grad", False))


def _add_block(total: np.ndarray, grad, rows: Tuple[int, int], cols: Tuple[int, int]) -> None:
    """Add a block's score gradient `grad` [..., rows, cols] to a mask's gradient `total` (the
    mask's shape, last two dims whole or 1): summed over the dimensions the mask broadcasts."""
    block = grad.asnumpy().astype(np.float32)
    block = block.sum(axis=tuple(range(block.ndim - total.ndim))) if block.ndim > total.ndim else block
    block = block.sum(axis=tuple(d for d in range(total.ndim) if total.shape[d] == 1 and block.shape[d] > 1),
                      keepdims=True)
    index = [slice(None)] * total.ndim
    if total.shape[-2] > 1:
        index[-2] = slice(*rows)
    if total.shape[-1] > 1:
        index[-1] = slice(*cols)
    total[tuple(index)] += block


def _add(total, term):
    """total + term, where None is zero."""
    if total is None:
        return term
    return total if term is None else total + term


def _fold(state, block, v):
    """One online-softmax update: (m, l, acc) with `block`'s scores and its V chunk. The
    running maximum is floored at ROW_FLOOR so a row whose keys in this block are all -inf
    (padding) contributes exp(-inf) = 0 instead of NaN."""
    block_max = ops.clamp(block.max(axis=-1, keepdims=True), min=ROW_FLOOR)
    if state is None:
        p = ops.exp(block - block_max)
        return block_max, p.sum(axis=-1, keepdims=True), ops.matmul(p, v)
    m, l, acc = state
    m_new = ops.maximum(m, block_max)
    correction = ops.exp(m - m_new)
    p = ops.exp(block - m_new)
    return m_new, l * correction + p.sum(axis=-1, keepdims=True), acc * correction + ops.matmul(p, v)
