"""Per-device bookkeeping of a parallel run: live activation bytes and their peak, collectives
by kind and mesh axis with what caused them, the ops dispatched with their FLOPs and bytes, the live bytes as each op
started (the memory timeline) and the op at the peak, and ops that fell back to replicated
execution; for the step's memory over forward and backward (`runtime/step_memory.py`), the sizes of
the activations each op made that the step holds and the last op that read each parameter.

All byte figures are per device. A DTensor's shards all have the same size, so a live tensor
adds the same bytes to each device of its mesh (uneven torch.chunk pieces: the largest,
device 0's). A DTensor made while a training step records gradients is held until the step
ends (its backward needs most such activations; an upper bound
for ops that save none); otherwise it is freed when it is garbage.

The counters are the representative device's (rank 0's). Devices whose figures differ from it
(an expert member's all-to-all bytes, expert activations, exchange buffers and experts' ops under
a routing assumption: `moe/member_loads.py`) get a *variant*: an Accounting of their own, a copy of this
one made at the first amount that differs (`*_by_ranks`), told every later event; `for_rank`
gives a device's. The devices of one group (an expert member) share one variant, and devices
whose amounts equal the representative's need none, so the work grows with the distinct programs,
not the devices. Forward collectives are recorded as the
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
        # ranks -> the Accounting of those devices, where they differ from this (the representative)
        self.variants: Dict[Tuple[int, ...], "Accounting"] = {}

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
        state["variants"] = {ranks: v.snapshot() for ranks, v in self.variants.items()}
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
        self.variants = {}
        for ranks, saved in state.get("variants", {}).items():
            self.variants[ranks] = Accounting(self.device_num)
            self.variants[ranks].restore(saved)

    def _copy(self) -> "Accounting":
        """A new Accounting with this one's counters (a variant's start)."""
        copy = Accounting(self.device_num)
        copy.restore({**self.snapshot(), "variants": {}})
        copy.steps = self.steps
        return copy

    def for_rank(self, rank: int) -> "Accounting":
        """The accounting of device `rank`: its variant's, else this one."""
        for ranks, variant in self.variants.items():
            if rank in ranks:
                return variant
        return self

    def _each(self):
        """This accounting and its variants (every event reaches each)."""
        return (self, *self.variants.values()) if self.variants else (self,)

    def _vary(self, amounts: Dict[Tuple[int, ...], object], act) -> None:
        """`act(accounting, amount)` on every program: this one with the amount of the group holding
        the lowest rank (the representative device), each variant with its group's; a group whose
        amount differs from the representative's and has no variant gets one (a copy of this
        accounting before the act).

        Raises:
            ValueError: the groups are empty or overlap at the lowest rank; a group cuts across a
                variant's ranks, or leaves a variant out.
        """
        first = min((min(ranks) for ranks in amounts if ranks), default=None)
        base = [ranks for ranks in amounts if first in ranks]
        if len(base) != 1:
            raise ValueError(f"accounting: per-device amounts over groups {list(amounts)}: expected disjoint, "
                             "non-empty groups of ranks")
        for ranks, amount in amounts.items():
            variant = self.variants.get(ranks)
            if variant is None and ranks != base[0] and amount != amounts[base[0]]:
                cut = [k for k in self.variants if set(k) & set(ranks)]
                if cut:
                    raise ValueError(f"accounting: devices {ranks} differ from the representative but overlap "
                                     f"the programs {cut}; expected the same device groups in every call")
                variant = self.variants[ranks] = self._copy()
            if variant is not None:
                act(variant, amount)
        for ranks, variant in self.variants.items():
            if ranks not in amounts:
                raise ValueError(f"accounting: per-device amounts over groups {list(amounts)} leave out the "
                                 f"program of devices {ranks}; expected the same device groups in every call")
        act(self, amounts[base[0]])

    def allocate_by_ranks(self, amounts: Dict[Tuple[int, ...], int]) -> None:
        """`allocate` an amount that differs between groups of devices (ranks -> bytes)."""
        self._vary(amounts, Accounting._allocate)

    def free_by_ranks(self, amounts: Dict[Tuple[int, ...], int]) -> None:
        """`free` an amount that differs between groups of devices (ranks -> bytes)."""
        self._vary(amounts, Accounting._free)

    def hold_by_ranks(self, amounts: Dict[Tuple[int, ...], int]) -> None:
        """`hold` an amount that differs between groups of devices (ranks -> bytes)."""
        self._vary(amounts, Accounting._hold)

    def record_comm_by_ranks(self, kind: str, axis: str, amounts: Dict[Tuple[int, ...], int],
                             cause: Optional[str] = None) -> None:
        """`record_comm` of a collective whose bytes sent differ between groups of devices (ranks ->
        bytes sent, which are also the input bytes)."""
        cause = current_cause() if cause is None else cause
        self._vary(amounts, lambda acc, n: acc._record_comm(kind, axis, n, n, False, cause))

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
        self.variants = {}  # a new step's devices start alike

    def release_held(self) -> None:
        """Free the held activations (a micro-batch's, when the step's next one starts); the step's
        timeline and other counters go on."""
        for acc in self.variants.values():
            acc.release_held()
        self.live_bytes -= self.held_bytes
        self.held_bytes = 0
        self.held_before = Counter()
        self.micro_batch_start = len(self.timeline)

    def allocate(self, nbytes: int) -> None:
        for acc in self._each():
            acc._allocate(nbytes)

    def free(self, nbytes: int) -> None:
        for acc in self._each():
            acc._free(nbytes)

    def hold(self, nbytes: int) -> None:
        """Allocate `nbytes` kept until the step ends (`reset_step`)."""
        for acc in self._each():
            acc._hold(nbytes)

    def _allocate(self, nbytes: int) -> None:
        if self.window is not None:
            self.window.note(nbytes, len(self.timeline))
        self.live_bytes += nbytes
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes, self.peak_op = self.live_bytes, self._op

    def _free(self, nbytes: int) -> None:
        self.live_bytes -= nbytes

    def _hold(self, nbytes: int) -> None:
        self._allocate(nbytes)
        self.held_bytes += nbytes
        sizes = self.held_sizes[-1] if len(self.timeline) > self.micro_batch_start else self.held_before
        sizes[nbytes] += 1

    def record_comm(self, kind: str, axis: str, send_bytes: int, input_bytes: int = 0,
                    backward: bool = False, cause: Optional[str] = None) -> None:
        """One collective over `axis` ("a+b" for several axes): bytes one device sends, its local
        input size, and what caused it (None: the current `collective_cause`; "": unknown)."""
        cause = current_cause() if cause is None else cause
        for acc in self._each():
            acc._record_comm(kind, axis, send_bytes, input_bytes, backward, cause)

    def _record_comm(self, kind: str, axis: str, send_bytes: int, input_bytes: int, backward: bool,
                     cause: str) -> None:
        entry = (self.comm_backward if backward else self.comm)[(kind, axis)]
        entry[0] += 1
        entry[1] += send_bytes
        entry[2] += input_bytes
        causes = (self.comm_backward_causes if backward else self.comm_causes)[(kind, axis)]
        causes[cause] += 1

    def record_op(self, op_name: str, tensors: Sequence = ()) -> None:
        """One op on DTensors dispatched (by its MindSpore name): it starts at the live bytes now;
        of its input `tensors`, those laying out a model parameter are recorded as read by it."""
        for acc in self._each():
            acc._record_op(op_name, tensors)

    def _record_op(self, op_name: str, tensors: Sequence) -> None:
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
        for acc in self._each():
            acc.compute[(op_name, int(flops), int(nbytes))] += 1

    def record_compute_calls(self, calls: Sequence[Tuple[str, int, int]]) -> None:
        """`record_compute` of several op calls, each (op name, FLOPs, bytes) of one device."""
        for acc in self._each():
            acc._add_compute(calls)

    def record_compute_by_ranks(self, calls: Dict[Tuple[int, ...], Tuple[Tuple[str, int, int], ...]]) -> None:
        """`record_compute_calls` of op calls that differ between groups of devices (ranks ->
        (op name, FLOPs, bytes) per call: an expert member's experts on its own rows)."""
        self._vary(calls, Accounting._add_compute)

    def _add_compute(self, calls) -> None:
        for op_name, flops, nbytes in calls:
            self.compute[(op_name, int(flops), int(nbytes))] += 1

    def record_fallback(self, op_name: str) -> None:
        for acc in self._each():
            acc.fallbacks[op_name] += 1


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
