"""The forward of a training step that a script drives itself (HyperParallel API), as the step's
memory series reads it.

A `ParallelModel` holds its forward's activations while it records gradients, so its accounting
has the per-op held sizes that `runtime/step_memory.py` walks back through. A script that calls
the gradient function and the optimizer itself has no such forward: its DTensors are freed when
Python drops them. A `StepWindow` attached to an `Accounting` (its `window`) notes, without
changing the live bytes or the peak, the sizes of every DTensor made while it is open, by the op
that made them (those made before its first op: the step's inputs); `StepWindow.record` turns it
into a `StepRecord`, the fields of an Accounting that `step_memory` reads, as if the forward had
held them (each op's activations kept until its backward: the series' model).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

__all__ = ["StepWindow", "StepRecord"]


@dataclass
class StepRecord:
    """One script-driven step's forward, read by `runtime.step_memory.step_memory` like an Accounting.

    Attributes:
        timeline: per forward op: (op name, live bytes when it started).
        held_sizes: per op: the sizes (bytes -> count) of the DTensors it made.
        held_before: sizes made before the first op of the last micro-batch (its inputs).
        parameter_reads: parameter id -> (index in `timeline` of the last op that read it, bytes
            of its shard on one device).
        micro_batch_start: index in `timeline` of the last micro-batch's first op (0: one forward
            per step; more: the script ran several forwards and backwards before the update).
    """

    timeline: List[Tuple[str, int]]
    held_sizes: List[Counter]
    held_before: Counter
    parameter_reads: Dict[int, Tuple[int, int]]
    micro_batch_start: int = 0

    def then(self, later: "StepRecord") -> "StepRecord":
        """This record followed by `later`, a later micro-batch of the same step: `later`'s ops
        appended (its reads shifted), the last micro-batch starting at its first op."""
        offset = len(self.timeline)
        reads = dict(self.parameter_reads)
        reads.update({pid: (index + offset, nbytes) for pid, (index, nbytes) in later.parameter_reads.items()})
        return StepRecord(self.timeline + later.timeline, self.held_sizes + later.held_sizes, later.held_before,
                          reads, offset + later.micro_batch_start)


@dataclass
class StepWindow:
    """The DTensors made since the window opened, by op (see module docstring).

    Attributes:
        start: index in the accounting's timeline of the window's first op.
        before: sizes made before that op.
        made: op index (in the timeline) -> sizes made during it.
    """

    start: int
    before: Counter = field(default_factory=Counter)
    made: Dict[int, Counter] = field(default_factory=dict)

    def note(self, nbytes: int, ops_so_far: int) -> None:
        """A DTensor of `nbytes` per device made when the timeline holds `ops_so_far` ops."""
        if ops_so_far > self.start:
            self.made.setdefault(ops_so_far - 1, Counter())[nbytes] += 1
        else:
            self.before[nbytes] += 1

    def record(self, accounting) -> StepRecord:
        """The window's ops of `accounting` as a StepRecord (indices from the window's start;
        parameters last read before it are left out: this forward did not read them)."""
        ops = accounting.timeline[self.start:]
        sizes = [Counter(self.made.get(self.start + i, ())) for i in range(len(ops))]
        reads = {pid: (index - self.start, nbytes) for pid, (index, nbytes) in accounting.parameter_reads.items()
                 if index >= self.start}
        return StepRecord(list(ops), sizes, Counter(self.before), reads)
