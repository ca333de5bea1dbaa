"""The `step_memory` section of a HyperParallel-API mesh's report: its last training step's
memory over forward, backward and update (`runtime/step_memory.py`), from the phases the
script's own calls marked (`step_phases.py`).

The series is one device's: every device of the mesh runs the same shapes (with uneven
torch.chunk pieces, the largest, as the rest of the mesh's report). Each device's step peak adds
what is alive throughout: its laid-out parameters and the optimizer's states of them (each state
at its parameter's layout: a global-shaped state in simulation and dry run counts one device's
piece; under msrun its real size), exact, with every block rounded to the context's
`allocator_alignment`, and that x (1 + `allocator_fragmentation`).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Dict, Optional

from mindspore_hyper.context import get_context
from mindspore_hyper.hyper_parallel.step_phases import last_step
from mindspore_hyper.runtime.step_memory import round_block, step_memory

__all__ = ["api_step_memory"]


def _piece_bytes(slot, shape, itemsize: int) -> int:
    """One device's bytes of a tensor of `shape` laid out like `slot`'s parameter: its layout's
    largest piece for the parameter's global shape, the tensor's own size otherwise (a shard)."""
    if tuple(shape) == tuple(slot.global_shape) and not slot.local:
        return math.prod(slot.layout.max_local_shape(slot.global_shape)) * itemsize
    return math.prod(shape) * itemsize


def _model_states(execution, optimizer, alignment: int) -> int:
    """Bytes of the laid-out parameters and of `optimizer`'s states of them on one device, each
    block rounded up to `alignment`. A state is matched to its parameter by name ("moment1.w" of
    "w"); states of no laid-out parameter (step counters, other models') are left out."""
    slots = list(execution.parameters.values())
    total = sum(round_block(_piece_bytes(s, s.param.shape, s.param.dtype.itemsize), alignment) for s in slots)
    if optimizer is None:
        return total
    by_name = {s.param.name: s for s in slots}
    updated = {id(p) for p in optimizer.parameters}
    for _, state in optimizer.parameters_and_names():
        _, _, name = state.name.partition(".")
        slot = by_name.get(name)
        if slot is None or id(state) in updated:
            continue
        total += round_block(_piece_bytes(slot, state.shape, state.dtype.itemsize), alignment)
    return total


def api_step_memory(execution, ranks) -> Optional[Dict]:
    """The mesh's `step_memory` section (the schema of `StepReport.step_memory`, per_device keyed
    by job rank), or None when no backward ran on it.

    Args:
        execution: the mesh's Execution.
        ranks: the job's rank of each device of the mesh.
    """
    step = last_step(execution)
    if step is None:
        return None
    alignment, fragmentation = get_context("allocator_alignment"), get_context("allocator_fragmentation")
    trainable = None if step.optimizer is None else {id(p) for p in step.optimizer.parameters}
    # a gradient lives until the update at its Parameter's layout: what an op read may be gathered
    # (fully_shard's all-gathered weights), the gradient is reduce-scattered back to the shard
    pieces = {pid: _piece_bytes(s, s.param.shape, s.param.dtype.itemsize) for pid, s in execution.parameters.items()}
    record = replace(step.record, parameter_reads={pid: (index, pieces.get(pid, nbytes)) for pid, (index, nbytes)
                                                   in step.record.parameter_reads.items()})
    exact, rounded = (step_memory(record, a, trainable) for a in (1, alignment))
    section = {"timeline": exact.to_rows(), "peak_phase": "", "peak_op": "", "alignment_bytes": alignment,
               "fragmentation": fragmentation, "optimizer": type(step.optimizer).__name__ if step.optimizer else None,
               "per_device": {}}
    if not exact.points:
        return section
    states, states_rounded = _model_states(execution, step.optimizer, 1), _model_states(execution, step.optimizer,
                                                                                       alignment)
    step_rounded = states_rounded + rounded.peak.total
    row = {"step_peak": states + exact.peak.total, "step_peak_rounded": step_rounded,
           "step_peak_with_fragmentation": math.ceil(step_rounded * (1 + fragmentation))}
    section.update(peak_phase=exact.peak.phase, peak_op=exact.peak.op, rounded_peak_phase=rounded.peak.phase,
                   rounded_peak_op=rounded.peak.op, per_device={rank: dict(row) for rank in ranks})
    return section
