"""The training step's memory over forward, backward and the optimizer update, per device.

Built from a step's `Accounting` (the same in simulation and in a dry run, so both give the same
series byte for byte). The forward is what the accounting recorded: each op's activations held for
the backward. The backward and the update are modelled, in the forward's ops in reverse:

- while op i's backward runs, the activations of ops 0..i are still held (op i's own included:
  its backward reads them) and the gradient flowing into it is alive, counted as the sizes op i
  held (its outputs); when it ends, op i's activations and that gradient are freed;
- a parameter's gradient appears in the backward of the last forward op that read it and stays
  until the update (with gradient accumulation, every parameter's gradient exists from the first
  micro-batch's backward on, so through the last micro-batch's forward too; the series covers the
  last micro-batch);
- the update ("optimizer" phase): no activation left, every gradient alive.

Parameters, optimizer states and mixed precision's working weights are alive throughout; each
device's step peak adds them (`StepReport.step_memory`). The model is an upper bound of a real
backward's working set in one respect (each op's activations are all kept until its backward) and
omits kernel workspaces and the temporaries inside an op's backward. `activations_peak` (the
forward's) is unchanged by it.

With the allocator's rounding (`alignment` bytes, MindSpore's memory pool: every block rounded up
to a multiple of 512, an empty one to 512; the hardware preset's `allocator` field) every block
(activation, gradient, parameter, optimizer state) is rounded before it is added.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Collection, Dict, List, Optional, Tuple

__all__ = ["StepMemoryPoint", "StepMemory", "step_memory", "round_block", "PHASES"]

PHASES = ("forward", "backward", "optimizer")


def round_block(nbytes: int, alignment: int) -> int:
    """`nbytes` as the allocator hands it out: rounded up to a multiple of `alignment`, an empty
    block taking one unit (MindSpore's `DynamicMemPool::AlignMemorySize`); alignment 1: unchanged."""
    if alignment == 1:
        return nbytes
    return max(1, -(-nbytes // alignment)) * alignment


def _rounded(sizes: Counter, alignment: int) -> int:
    return sum(round_block(size, alignment) * count for size, count in sizes.items())


@dataclass(frozen=True)
class StepMemoryPoint:
    """The bytes one device holds while one op (of a phase) runs, besides the model states.

    Attributes:
        phase: "forward", "backward" or "optimizer".
        op: the forward op's MindSpore name ("update" for the optimizer phase).
        activations: bytes of held activations and, in the backward, the incoming gradient.
        gradients: bytes of parameter gradients alive.
    """

    phase: str
    op: str
    activations: int
    gradients: int

    @property
    def total(self) -> int:
        return self.activations + self.gradients


@dataclass(frozen=True)
class StepMemory:
    """One device's series over the step (see module docstring), at one allocator rounding.

    Attributes:
        points: forward ops in order, their backwards in reverse order, then the update.
        alignment: the bytes every block was rounded up to (1: none).
    """

    points: Tuple[StepMemoryPoint, ...]
    alignment: int = 1

    @property
    def peak(self) -> StepMemoryPoint:
        """The first point with the most bytes."""
        return max(self.points, key=lambda p: p.total)

    def to_rows(self) -> List[list]:
        """[phase, op, activation bytes, gradient bytes] per point (the JSON's timeline)."""
        return [[p.phase, p.op, p.activations, p.gradients] for p in self.points]


def step_memory(accounting, alignment: int = 1, trainable: Optional[Collection[int]] = None) -> StepMemory:
    """The series of the last training step recorded by `accounting` (see module docstring).

    Args:
        accounting: the `dtensor.accounting.Accounting` of a step whose forward held its
            activations (a training step).
        alignment: round every block up to a multiple of this many bytes (1: exact bytes).
        trainable: ids of the Parameters that get gradients (None: every parameter read).

    Returns:
        The StepMemory (empty points when the accounting recorded no op).

    Raises:
        ValueError: alignment not an int >= 1.
    """
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment < 1:
        raise ValueError(f"alignment={alignment!r}: expected an int >= 1 (bytes)")
    start = accounting.micro_batch_start
    ops = [name for name, _ in accounting.timeline[start:]]
    held = [_rounded(sizes, alignment) for sizes in accounting.held_sizes[start:]]
    if not ops:
        return StepMemory((), alignment)
    before = _rounded(accounting.held_before, alignment)
    grads_at: Dict[int, int] = {}  # op index (from `start`) -> gradient bytes appearing in its backward
    for pid, (index, nbytes) in accounting.parameter_reads.items():
        if trainable is not None and pid not in trainable:
            continue
        at = max(index - start, 0)
        grads_at[at] = grads_at.get(at, 0) + round_block(nbytes, alignment)
    all_grads = sum(grads_at.values())
    accumulated = start > 0  # an earlier micro-batch's backward made every gradient
    points: List[StepMemoryPoint] = []
    cumulative = [before]
    for i, name in enumerate(ops):
        cumulative.append(cumulative[-1] + held[i])
        points.append(StepMemoryPoint("forward", name, cumulative[-1], all_grads if accumulated else 0))
    grads = all_grads if accumulated else 0
    for i in range(len(ops) - 1, -1, -1):
        if not accumulated:
            grads += grads_at.get(i, 0)
        points.append(StepMemoryPoint("backward", ops[i], cumulative[i + 1] + held[i], grads))
    points.append(StepMemoryPoint("optimizer", "update", 0, all_grads))
    return StepMemory(tuple(points), alignment)
