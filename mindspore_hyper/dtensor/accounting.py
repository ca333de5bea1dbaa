"""Per-device bookkeeping of a parallel run: live activation bytes and their peak, collectives
by kind and mesh axis with what caused them, the ops dispatched with their FLOPs and bytes, the live bytes as each op
started (the memory timeline) and the op at the peak, and ops that fell back to replicated
execution; for the step's memory over forward and backward (`runtime/step_memory.py`), the sizes of
the activations each op made that the step holds and the last op that read each parameter.

All byte figures are per device. A DTensor's shards all have the same size, so a live tensor
adds the same bytes to each device of its mesh (uneven torch.chunk pieces: the largest,
device 0's). A DTensor made while a training step records gradients is held until the step
ends (its backward needs most such activations; an upper bound
for ops that save none); otherwise it is freed when it is garbage. Forward collectives are recorded as the
redistribution planner's steps run; backward collectives by the collectives backend when a
gradient actually passes through them (see mindspore_hyper.comm.collectives).
"""
from __future__ import annotations

import contextlib
import math
from collections import Counter, defaultdict
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from mindspore_hyper.comm.collective_cause import current_cause

__all__ = ["Accounting", "active_accounting", "use_accounting"]


class Accounting:
    """Counters for one simulated run; `reset_step()` starts a new step's counters."""

    def __init__(self, device_num: int):
        self.device_num = device_num
        self.live_bytes = 0
        self.peak_bytes = 0
        self.held_bytes = 0  # forward activations held until the step ends
        # (kind, axis) -> [count, bytes sent per device, input bytes per device], per phase
        self.comm: Dict[Tuple[str, str], list] = defaultdict(lambda: [0, 0, 0])
        self.comm_backward: Dict[Tuple[str, str], list] = defaultdict(lambda: [0, 0, 0])
        # (kind, axis) -> cause -> count, per phase: what caused each collective (comm/collective_cause.py)
        self.comm_causes: Dict[Tuple[str, str], Counter] = defaultdict(Counter)
        self.comm_backward_causes: Dict[Tuple[str, str], Counter] = defaultdict(Counter)
        self.ops: Counter = Counter()
        self.fallbacks: Counter = Counter()
        self.compute: Counter = Counter()  # (op, FLOPs, bytes) of one call on one device -> calls
        self.timeline: List[Tuple[str, int]] = []  # per op dispatched: (op, live bytes when it started)
        self.peak_op = ""  # the op during which the peak was reached
        self._op = ""
        self.steps = 0
        # for runtime/step_memory.py: per op of `timeline`, the sizes (bytes -> count) of the
        # activations it made that the step holds; those made before the micro-batch's first op
        # (its inputs); where in `timeline` the last micro-batch began; parameter id -> (index in
        # `timeline` of the last op that read it, bytes of its shard)
        self.held_sizes: List[Counter] = []
        self.held_before: Counter = Counter()
        self.micro_batch_start = 0
        self.parameter_reads: Dict[int, Tuple[int, int]] = {}
        # a script-driven training step's forward being noted (dtensor/step_window.py), or None
        self.window = None

    _STATE = ("live_bytes", "peak_bytes", "held_bytes", "peak_op", "_op", "micro_batch_start")
    _TABLES = ("comm", "comm_backward", "comm_causes", "comm_backward_causes", "ops", "fallbacks", "compute")

    def snapshot(self) -> dict:
        """Every counter, copied (what `restore` puts back)."""
        state = {name: getattr(self, name) for name in self._STATE}
        state.update({name: {k: _copy(v) for k, v in getattr(self, name).items()} for name in self._TABLES})
        state["timeline"] = list(self.timeline)
        state["held_sizes"] = [Counter(c) for c in self.held_sizes]
        state["held_before"] = Counter(self.held_before)
        state["parameter_reads"] = dict(self.parameter_reads)
        return state

    def restore(self, state: dict) -> None:
        """Put back the counters of `snapshot()` (a dry run replaying a program it already ran)."""
        for name in self._STATE:
            setattr(self, name, state[name])
        for name in self._TABLES:
            table = getattr(self, name)
            table.clear()
            table.update({k: _copy(v) for k, v in state[name].items()})
        self.timeline[:] = state["timeline"]
        self.held_sizes[:] = [Counter(c) for c in state["held_sizes"]]
        self.held_before = Counter(state["held_before"])
        self.parameter_reads = dict(state["parameter_reads"])

    def reset_step(self) -> None:
        """Clear per-step counters: the last step's held activations are released and the peak
        restarts from what is live now."""
        self.live_bytes -= self.held_bytes
        self.held_bytes = 0
        self.peak_bytes = self.live_bytes
        self.comm.clear()
        self.comm_backward.clear()
        self.comm_causes.clear()
        self.comm_backward_causes.clear()
        self.ops.clear()
        self.fallbacks.clear()
        self.compute.clear()
        self.timeline.clear()
        self.held_sizes.clear()
        self.held_before = Counter()
        self.micro_batch_start = 0
        self.parameter_reads.clear()
        self.peak_op = self._op = ""

    def release_held(self) -> None:
        """Free the held activations (a micro-batch's, when the step's next one starts); the step's
        timeline and other counters go on."""
        self.live_bytes -= self.held_bytes
        self.held_bytes = 0
        self.held_before = Counter()
        self.micro_batch_start = len(self.timeline)

    def allocate(self, nbytes: int) -> None:
        if self.window is not None:
            self.window.note(nbytes, len(self.timeline))
        self.live_bytes += nbytes
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes, self.peak_op = self.live_bytes, self._op

    def free(self, nbytes: int) -> None:
        self.live_bytes -= nbytes

    def hold(self, nbytes: int) -> None:
        """Allocate `nbytes` kept until the step ends (`reset_step`)."""
        self.allocate(nbytes)
        self.held_bytes += nbytes
        sizes = self.held_sizes[-1] if len(self.timeline) > self.micro_batch_start else self.held_before
        sizes[nbytes] += 1

    def record_comm(self, kind: str, axis: str, send_bytes: int, input_bytes: int = 0,
                    backward: bool = False, cause: Optional[str] = None) -> None:
        """One collective over `axis` ("a+b" for several axes): bytes one device sends, its local
        input size, and what caused it (None: the current `collective_cause`; "": unknown)."""
        entry = (self.comm_backward if backward else self.comm)[(kind, axis)]
        entry[0] += 1
        entry[1] += send_bytes
        entry[2] += input_bytes
        causes = (self.comm_backward_causes if backward else self.comm_causes)[(kind, axis)]
        causes[current_cause() if cause is None else cause] += 1

    def record_op(self, op_name: str, tensors: Sequence = ()) -> None:
        """One op on DTensors dispatched (by its MindSpore name): it starts at the live bytes now;
        of its input `tensors`, those laying out a model parameter are recorded as read by it."""
        self.ops[op_name] += 1
        self.timeline.append((op_name, self.live_bytes))
        self.held_sizes.append(Counter())
        self._op = op_name
        for t in tensors:
            pid = getattr(t, "_parameter_id", None)
            if pid is not None:
                nbytes = math.prod(t.layout.max_local_shape(t.global_shape)) * t.dtype.itemsize  # uneven: largest
                self.parameter_reads[pid] = (len(self.timeline) - 1, nbytes)

    def record_compute(self, op_name: str, flops: int, nbytes: int) -> None:
        """One forward op's work on one device: FLOPs and bytes read and written (`dtensor.op_cost`)."""
        self.compute[(op_name, int(flops), int(nbytes))] += 1

    def record_fallback(self, op_name: str) -> None:
        self.fallbacks[op_name] += 1


def _copy(value):
    """A table entry, copied (counters are lists, cause counts Counters, others immutable)."""
    if isinstance(value, Counter):
        return Counter(value)
    return list(value) if isinstance(value, list) else value


_GLOBAL = Accounting(device_num=0)
_stack = [_GLOBAL]


def active_accounting() -> Accounting:
    """The accounting that DTensor operations currently report to."""
    return _stack[-1]


@contextlib.contextmanager
def use_accounting(accounting: Optional[Accounting]) -> Iterator[Accounting]:
    """Route DTensor bookkeeping to `accounting` inside the block."""
    _stack.append(accounting or _GLOBAL)
    try:
        yield _stack[-1]
    finally:
        _stack.pop()
