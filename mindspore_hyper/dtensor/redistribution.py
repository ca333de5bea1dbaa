"""Running a redistribution plan (`shard.redistribution_plan.plan_redistribution`) on a DTensor's shards.

Each step runs with the execution's collectives on the distinct shards it holds, or, for small
shards in the in-process simulation, on the shards of every group stacked into one tensor.
"""
from __future__ import annotations

import math
from typing import Dict, Sequence

from mindspore import Tensor, ops

from mindspore_hyper import bfloat16_emulation
from mindspore_hyper.comm.collective_cause import current_cause, set_cause
from mindspore_hyper.comm.inprocess_collectives import InProcessCollectives, reduce_tensors
from mindspore_hyper.dtensor.batched import BATCH_BELOW_ELEMENTS, stacked_shards
from mindspore_hyper.dtensor.dtensor import DTensor, Key, key_of, significant_axes
from mindspore_hyper.dtensor.padded_collectives import PaddedCollectives
from mindspore_hyper.shard.redistribution_plan import (
    AllGather, AllReduce, AllToAll, LocalSlice, MakePartial, ReduceScatter, plan_redistribution,
)
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["run_redistribution", "DIRECT_CAUSE"]

# the collective cause of a redistribution no op asked for (`DTensor.redistribute`, `full_tensor`)
DIRECT_CAUSE = "DTensor.redistribute / full_tensor called directly"

# (source layout, target layout, global shape, item size) -> the steps planned for them: a plan
# depends on nothing else, and every step of a training run moves the same tensors the same way
_PLANS: Dict[tuple, tuple] = {}
_PLANS_KEPT = 4096  # past this many the memo starts over


def _planned_steps(src: TensorLayout, dst: TensorLayout, global_shape: Sequence[int], itemsize: int) -> tuple:
    """The steps of `plan_redistribution(src, dst, global_shape, itemsize)`, planned once per key."""
    key = (src, dst, tuple(global_shape), itemsize)
    steps = _PLANS.get(key)
    if steps is None:
        steps = tuple(plan_redistribution(src, dst, global_shape, itemsize))  # steps are frozen dataclasses
        if len(_PLANS) >= _PLANS_KEPT:
            _PLANS.clear()
        _PLANS[key] = steps
    return steps


def run_redistribution(dt: DTensor, layout: TensorLayout, record: bool, grad_partial_axes: Sequence[int]):
    """`dt` laid out as `layout` (a new DTensor), and the `grad_partial_axes` whose gathers took
    over the backward gradient sum. `record` accounts the steps' bytes.

    Raises:
        ValueError: either layout is rank-local (such a value has no global value to move).
    """
    if dt.layout.is_rank_local or layout.is_rank_local:
        raise ValueError(f"a rank-local tensor (DTensor.to_local() where ranks hold different values) has no global "
                         f"value to lay out as {layout if dt.layout.is_rank_local else dt.layout}: make a DTensor of it "
                         "with DTensor.from_local(local, device_mesh, placements)")
    if not current_cause():  # called by a script or library code, not for an op: say so in the report
        previous = set_cause(DIRECT_CAUSE)
        try:
            return run_redistribution(dt, layout, record, grad_partial_axes)
        finally:
            set_cause(previous)
    plan = _planned_steps(dt.layout, layout, dt.global_shape, dt.dtype.itemsize)
    execution = dt.execution
    shards, stacked, current = None, dt._stacked, dt.layout
    accounting = execution.accounting
    itemsize = dt.dtype.itemsize
    fused = set()
    uneven = dt._uneven or not layout.is_even(dt.global_shape)  # torch.chunk pieces: padded collectives
    # Stack (Unstack's backward) has no bfloat16 CPU kernel: bfloat16 shards move one by one
    by_shard = uneven or bfloat16_emulation.touches_bfloat16((dt.dtype,))
    for step in plan:
        local = current.max_local_shape(dt.global_shape) if uneven else current.local_shape(dt.global_shape)
        input_bytes = math.prod(local) * itemsize
        grad_partial = isinstance(step, AllGather) and step.axis in grad_partial_axes
        if not by_shard and _runs_stacked(execution, step, current, dt.global_shape):
            if stacked is None:
                stacked = stacked_shards(execution, dt if shards is None else
                                         DTensor._create(current, shards, dt.global_shape, dt.dtype, execution))
            if isinstance(step, AllReduce):
                stacked, current = _all_reduce_stacked(execution, step, stacked, current)
            else:
                stacked, current = _all_gather_stacked(execution, step, stacked, current, record, grad_partial)
            shards = None
        else:
            if shards is None:
                shards = dt.shards if stacked is dt._stacked else _unstacked(execution, stacked, current)
            shards, current = _apply_step(execution, step, shards, current, record, grad_partial,
                                          dt.global_shape if uneven else None)
            stacked = None
        if grad_partial:
            fused.add(step.axis)
        if record and not isinstance(step, (LocalSlice, MakePartial)):
            axis = current.mesh.alias_names[step.axis]
            accounting.record_comm(type(step).__name__, axis, step.send_bytes, input_bytes)
    if shards is None:
        keys = execution.keys(significant_axes(layout))
        return DTensor._from_stack(layout, stacked, keys, dt.global_shape, dt.dtype, execution), fused
    return DTensor._create(layout, shards, dt.global_shape, dt.dtype, execution), fused


def _runs_stacked(execution, step, layout: TensorLayout, global_shape) -> bool:
    """Whether a step runs on the stacked shards of every group at once: an AllReduce (the same
    additions in member order) or an AllGather along a dimension's innermost axis (the same
    concatenation), with the in-process MindSpore collectives holding every device."""
    if not (execution.batch_shards and execution.holds_all_ranks and type(execution.collectives) is InProcessCollectives
            and len(significant_axes(layout)) > 1 and math.prod(layout.local_shape(global_shape)) < BATCH_BELOW_ELEMENTS):
        return False
    if isinstance(step, AllGather):
        return layout.dims[step.dim][-1] == step.axis
    return isinstance(step, AllReduce)


def _all_gather_stacked(execution, step, stacked: Tensor, layout: TensorLayout, record: bool, grad_partial: bool):
    """AllGather along `step.axis` into local dimension `step.dim` of stacked shards: the batch
    dimension of that axis moved next to the local dimension and merged into it (the members'
    shards concatenated in member order, for every group at once)."""
    mesh = layout.mesh
    axes = significant_axes(layout)
    sizes = tuple(mesh.device_matrix[a] for a in axes)
    local = tuple(stacked.shape[1:])
    nb, p, d = len(axes), axes.index(step.axis), step.dim
    perm = [i for i in range(nb) if i != p] + [nb + j for j in range(d)] + [p] + [nb + j for j in range(d, len(local))]
    moved = stacked.reshape(sizes + local).transpose(tuple(perm))
    gathered = local[:d] + (sizes[p] * local[d],) + local[d + 1:]
    out = moved.reshape((-1,) + gathered)
    if grad_partial and record:  # the consumers' partial gradients are reduce-scattered back
        coords = mesh.coords(execution.local_ranks[0])  # the group through it records
        group = execution.group([step.axis], {a: coords[a] for a in axes if a != step.axis})
        execution.collectives._on_backward(out, "ReduceScatter", group, math.prod(gathered) * out.dtype.itemsize)
    dims = [list(e) for e in layout.dims]
    dims[d].remove(step.axis)
    return out, TensorLayout.from_dims(mesh, dims, layout.partial)


def _all_reduce_stacked(execution, step, stacked: Tensor, layout: TensorLayout):
    """AllReduce along `step.axis` of stacked shards: the members' shards (slices of the stack
    along that axis) reduced in member order, for every group at once."""
    mesh = layout.mesh
    axes = significant_axes(layout)
    sizes = tuple(mesh.device_matrix[a] for a in axes)
    local = tuple(stacked.shape[1:])
    grid = stacked.reshape(sizes + local)
    members = ops.unstack(grid, axes.index(step.axis))  # one op (its backward one stack), not n slices
    reduced = reduce_tensors(list(members), step.op)
    partial = layout.partial
    del partial[step.axis]
    new_layout = TensorLayout.from_dims(mesh, layout.dims, partial)
    return reduced.reshape((-1,) + local), new_layout


def _unstacked(execution, stacked: Tensor, layout: TensorLayout) -> Dict[Key, Tensor]:
    return dict(zip(execution.keys(significant_axes(layout)), ops.unstack(stacked, 0)))


def _apply_step(execution, step, shards: Dict[Key, Tensor], layout: TensorLayout, record: bool,
                grad_partial: bool, uneven_shape=None):
    """One plan step on the held distinct shards; returns (new shards, new layout). With
    `uneven_shape` (the global shape of a tensor some layout does not divide) the collectives pad
    the pieces (`padded_collectives`)."""
    mesh = layout.mesh
    a = step.axis
    old_axes = significant_axes(layout)
    dims = [list(e) for e in layout.dims]
    partial = layout.partial
    if isinstance(step, LocalSlice):
        dims[step.dim].append(a)
    elif isinstance(step, AllGather):
        dims[step.dim].remove(a)
    elif isinstance(step, AllToAll):
        dims[step.concat_dim].remove(a)
        dims[step.split_dim].append(a)
    elif isinstance(step, ReduceScatter):
        del partial[a]
        dims[step.dim].append(a)
    elif isinstance(step, AllReduce):
        del partial[a]
    elif isinstance(step, MakePartial):
        partial[a] = step.op
    new_layout = TensorLayout.from_dims(mesh, dims, partial)
    new_axes = significant_axes(new_layout)
    new_shards: Dict[Key, Tensor] = {}
    backend = execution.collectives
    if uneven_shape is not None:
        backend = PaddedCollectives(backend, layout, new_layout, uneven_shape)
    if a not in old_axes:  # LocalSlice / MakePartial: one old shard -> the held new ones
        for key, shard in shards.items():
            fixed = dict(zip(old_axes, key))
            group = execution.group([a], fixed)
            if isinstance(step, LocalSlice):
                parts = backend.local_slice(shard, step.dim, group, record=record)
            else:
                parts = backend.make_partial(shard, step.op, group)
            for index, part in zip(group.local, parts):
                coords = dict(fixed)
                coords[a] = index
                new_shards[key_of(coords, new_axes)] = part
        return new_shards, new_layout
    position = old_axes.index(a)
    groups: Dict[Key, Dict[int, Tensor]] = {}
    for key, shard in shards.items():
        rest = key[:position] + key[position + 1:]
        groups.setdefault(rest, {})[key[position]] = shard
    others = [x for x in old_axes if x != a]
    for rest, members in sorted(groups.items()):
        fixed = dict(zip(others, rest))
        group = execution.group([a], fixed)
        if group.records and not record:
            group = type(group)(group.axis, group.ranks, group.local, records=False)
        tensors = [members[i] for i in group.local]
        if isinstance(step, AllGather):
            outs = backend.all_gather(tensors, step.dim, group, grad_partial=grad_partial)
        elif isinstance(step, AllToAll):
            outs = backend.all_to_all(tensors, step.split_dim, step.concat_dim, group)
        elif isinstance(step, ReduceScatter):
            outs = backend.reduce_scatter(tensors, step.dim, step.op, group)
        else:
            outs = backend.all_reduce(tensors, step.op, group)
        for index, out in zip(group.local, outs):
            coords = dict(fixed)
            coords[a] = index
            new_shards.setdefault(key_of(coords, new_axes), out)
    return new_shards, new_layout
