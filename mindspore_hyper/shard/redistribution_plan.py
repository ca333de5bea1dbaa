"""Redistribution planner: the ordered collective/local steps that turn one tensor layout into another.

Plans are data. Nothing here executes; the simulation runtime, the numpy reference executor and
the distributed runtime consume plans. Each step records the bytes one device sends in it,
computed for ring algorithms (AllGather (n-1)·B, ReduceScatter and AllToAll (n-1)/n·B,
AllReduce 2(n-1)/n·B, with B the device's bytes before the step and n the axis size).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Sequence, Tuple


from mindspore_hyper import units
from mindspore_hyper.shard.chunking import nested_chunk_bounds
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = [
    "PlanStep", "AllGather", "AllToAll", "ReduceScatter", "AllReduce", "LocalSlice", "MakePartial",
    "RedistributionPlan", "plan_redistribution",
]


@dataclass(frozen=True)
class PlanStep:
    """One step over the devices of mesh axis `axis`; `send_bytes` is per device."""

    axis: int
    send_bytes: int


@dataclass(frozen=True)
class AllGather(PlanStep):
    """Concatenate the axis group's shards along `dim` (the axis was the dim's innermost split)."""

    dim: int = 0


@dataclass(frozen=True)
class AllToAll(PlanStep):
    """Split along `split_dim`, exchange, concatenate along `concat_dim`: moves the axis's shard
    from concat_dim (innermost there) to split_dim (appended innermost)."""

    split_dim: int = 0
    concat_dim: int = 0


@dataclass(frozen=True)
class ReduceScatter(PlanStep):
    """Reduce Partial values over the axis by `op` and keep this device's chunk of `dim`."""

    dim: int = 0
    op: str = "sum"


@dataclass(frozen=True)
class AllReduce(PlanStep):
    """Reduce Partial values over the axis by `op`; every device gets the result."""

    op: str = "sum"


@dataclass(frozen=True)
class LocalSlice(PlanStep):
    """Keep this device's chunk of `dim` along the axis (no communication)."""

    dim: int = 0


@dataclass(frozen=True)
class MakePartial(PlanStep):
    """Turn replicated values into Partial(op) values along the axis (no communication):
    for sum, devices other than coordinate 0 zero their copy; avg/max/min keep it."""

    op: str = "sum"


@dataclass
class RedistributionPlan:
    """An ordered list of steps from `src` to `dst` for a tensor of `global_shape` and `dtype`."""

    src: TensorLayout
    dst: TensorLayout
    global_shape: Tuple[int, ...]
    itemsize: int
    steps: List[PlanStep] = field(default_factory=list)

    def __iter__(self) -> Iterator[PlanStep]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, i) -> PlanStep:
        return self.steps[i]

    @property
    def send_bytes(self) -> int:
        """Total bytes one device sends over the whole plan."""
        return sum(s.send_bytes for s in self.steps)

    def kinds(self) -> List[str]:
        return [type(s).__name__ for s in self.steps]

    def __repr__(self) -> str:
        names = self.src.mesh.alias_names
        body = ", ".join(_describe(s, names) for s in self.steps) or "no-op"
        return f"RedistributionPlan({body}; {self.send_bytes} B/device)"


def _describe(step: PlanStep, names: Sequence[str]) -> str:
    args = {k: v for k, v in step.__dict__.items() if k not in ("axis", "send_bytes")}
    inner = ", ".join([repr(names[step.axis])] + [f"{k}={v!r}" for k, v in args.items()])
    return f"{type(step).__name__}({inner})"


def plan_redistribution(src: TensorLayout, dst: TensorLayout, global_shape: Sequence[int],
                        dtype="float32") -> RedistributionPlan:
    """Plan the steps that turn a tensor laid out as `src` into `dst`.

    Greedy on the per-dimension axis lists (major first): free local slices first, then
    ReduceScatter for Partial axes that become shards, AllToAll where an axis moves between
    dimensions, AllReduce of Partial axes that become replicated (before any gather grows the
    data), AllGather of innermost axes that must go, AllReduce for any Partial axis left,
    finally MakePartial for axes that are Partial only in `dst`.

    Args:
        src: the current layout.
        dst: the wanted layout (same mesh).
        global_shape: the tensor's global shape.
        dtype: a numpy/MindSpore dtype or an item size in bytes.

    Returns:
        The plan (iterable of steps with per-device send bytes).

    Raises:
        ValueError: meshes differ, or the shape's rank differs from the layouts'.
    """
    if src.mesh != dst.mesh:
        raise ValueError(f"cannot redistribute between different meshes: {src.mesh} vs {dst.mesh}")
    global_shape = tuple(int(s) for s in global_shape)
    src.check_shape(global_shape, uneven=True)  # uneven pieces: the runtime pads them for collectives
    dst.check_shape(global_shape, uneven=True)
    mesh = src.mesh
    sizes = mesh.device_matrix
    itemsize = units.itemsize(dtype)
    plan = RedistributionPlan(src, dst, global_shape, itemsize)

    state: List[List[int]] = [list(e) for e in src.dims]
    partial: Dict[int, str] = src.partial
    target = [list(e) for e in dst.dims]
    target_partial = dst.partial
    ndim = len(global_shape)

    def local_bytes() -> int:  # the largest shard's (what a padded collective moves per device)
        return math.prod(nested_chunk_bounds(size, [sizes[a] for a in entry], [0] * len(entry))[1]
                         for size, entry in zip(global_shape, state)) * itemsize

    def holder(axis: int):
        for d, entry in enumerate(state):
            if axis in entry:
                return d
        return None

    def is_prefix(d: int) -> bool:
        return state[d] == target[d][:len(state[d])]

    def wanted_next(d: int):
        return target[d][len(state[d])] if is_prefix(d) and len(state[d]) < len(target[d]) else None

    def all_reduce_one(eligible) -> bool:
        """Reduce the first Partial axis that dst does not keep as is and `eligible` accepts."""
        for a in sorted(partial):
            if eligible(a) and target_partial.get(a) != partial[a]:
                n, b = sizes[a], local_bytes()
                plan.steps.append(AllReduce(a, 2 * b * (n - 1) // n, op=partial.pop(a)))
                return True
        return False

    while True:
        # 1. Local slices: a replicated (non-partial) axis that a prefix dimension wants next.
        progressed = False
        for d in range(ndim):
            a = wanted_next(d)
            if a is not None and holder(a) is None and a not in partial:
                plan.steps.append(LocalSlice(a, 0, dim=d))
                state[d].append(a)
                progressed = True
        if progressed:
            continue
        # 2. ReduceScatter: a Partial axis that a prefix dimension wants next.
        for d in range(ndim):
            a = wanted_next(d)
            if a is not None and a in partial and target_partial.get(a) != partial[a]:
                n, b = sizes[a], local_bytes()
                plan.steps.append(ReduceScatter(a, b * (n - 1) // n, dim=d, op=partial.pop(a)))
                state[d].append(a)
                progressed = True
                break
        if progressed:
            continue
        # 3. AllToAll: an axis innermost in a dimension that must lose it, wanted next elsewhere.
        for d in range(ndim):
            a = wanted_next(d)
            e = holder(a) if a is not None else None
            if e is not None and e != d and not is_prefix(e) and state[e][-1] == a:
                n, b = sizes[a], local_bytes()
                plan.steps.append(AllToAll(a, b * (n - 1) // n, split_dim=d, concat_dim=e))
                state[e].pop()
                state[d].append(a)
                progressed = True
                break
        if progressed:
            continue
        # 4. AllReduce, while the data is small, of Partial axes that dst neither shards nor keeps.
        wanted = {a for entry in target for a in entry}
        if all_reduce_one(lambda a: a not in wanted):
            continue
        # 5. AllGather: drop the innermost axis of a dimension that is not a prefix of its target.
        for d in range(ndim):
            if not is_prefix(d):
                a = state[d][-1]
                n, b = sizes[a], local_bytes()
                plan.steps.append(AllGather(a, b * (n - 1), dim=d))
                state[d].pop()
                progressed = True
                break
        if progressed:
            continue
        # 6. AllReduce: Partial axes still left (their shard could not be reached by ReduceScatter).
        if all_reduce_one(lambda a: True):
            continue
        break

    # 7. Axes Partial only in dst.
    for a, op in sorted(target_partial.items()):
        if partial.get(a) != op:
            plan.steps.append(MakePartial(a, 0, op=op))
            partial[a] = op
    if state != target or partial != target_partial:
        raise AssertionError(f"planner bug: reached {state}/{partial}, wanted {target}/{target_partial}")
    return plan
