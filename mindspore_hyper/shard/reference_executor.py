"""Numpy reference: lay a global array out per rank, apply a redistribution plan, reassemble.

The ground truth that the planner and every runtime's collectives are tested against. Shards
are a dict rank -> numpy array.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from mindspore_hyper.shard.redistribution_plan import (
    AllGather, AllReduce, AllToAll, LocalSlice, MakePartial, RedistributionPlan, ReduceScatter,
)
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["scatter", "gather", "apply_plan", "reduce_arrays"]

Shards = Dict[int, np.ndarray]


def reduce_arrays(arrays, op: str) -> np.ndarray:
    """Elementwise reduction of equally shaped arrays by sum/avg/max/min."""
    stacked = np.stack(arrays)
    if op == "sum":
        return stacked.sum(axis=0)
    if op == "avg":
        return stacked.mean(axis=0)
    if op == "max":
        return stacked.max(axis=0)
    if op == "min":
        return stacked.min(axis=0)
    raise ValueError(f"reduce op {op!r}: expected sum, avg, max or min")


def scatter(global_array: np.ndarray, layout: TensorLayout, rng: Optional[np.random.Generator] = None) -> Shards:
    """Each rank's shard of `global_array` under `layout`. Partial axes get random contributions
    that reduce to the true values (coordinate 0 holds the exact value for max/min/avg)."""
    rng = rng or np.random.default_rng(0)
    shards = {r: np.array(global_array[layout.rank_slices(r, global_array.shape)]) for r in layout.mesh.ranks}
    mesh = layout.mesh
    for axis, op in layout.partial.items():
        for group in mesh.axis_groups([axis]):
            exact = shards[group[0]]
            others = [rng.integers(-3, 4, size=exact.shape).astype(exact.dtype) for _ in group[1:]]
            if op == "sum":
                first = exact - sum(others)
            elif op == "avg":
                first = exact * len(group) - sum(others)
            elif op == "max":
                first, others = exact, [exact - np.abs(o) for o in others]
            else:
                first, others = exact, [exact + np.abs(o) for o in others]
            for rank, value in zip(group, [first] + others):
                shards[rank] = value
    return shards


def gather(shards: Shards, layout: TensorLayout, global_shape) -> np.ndarray:
    """Reassemble the global array (reducing Partial axes) and check that replicas agree."""
    mesh = layout.mesh
    values = dict(shards)
    for axis, op in layout.partial.items():
        reduced = {}
        for group in mesh.axis_groups([axis]):
            total = reduce_arrays([values[r] for r in group], op)
            reduced.update({r: total for r in group})
        values = reduced
    sample = next(iter(values.values()))
    out = np.zeros(tuple(global_shape), dtype=sample.dtype)
    written = np.zeros(tuple(global_shape), dtype=bool)
    for rank in mesh.ranks:
        index = layout.rank_slices(rank, global_shape)
        if written[index].all() and not np.array_equal(out[index], values[rank]):
            raise AssertionError(f"rank {rank}'s replica differs from its peers")
        out[index] = values[rank]
        written[index] = True
    if not written.all():
        raise AssertionError("the shards do not cover the global array")
    return out


def apply_plan(shards: Shards, plan: RedistributionPlan) -> Shards:
    """Execute `plan` on per-rank numpy shards, step by step, as the collectives would."""
    mesh = plan.src.mesh
    current = dict(shards)
    for step in plan:
        n = mesh.device_matrix[step.axis]
        coord = {r: mesh.coords(r)[step.axis] for r in mesh.ranks}
        nxt = {}
        for group in mesh.axis_groups([step.axis]):
            members = [current[r] for r in group]
            if isinstance(step, AllToAll):
                split = [np.split(m, n, axis=step.split_dim) for m in members]
            elif isinstance(step, (ReduceScatter, AllReduce)):
                reduced = reduce_arrays(members, step.op)
                parts = np.split(reduced, n, axis=step.dim) if isinstance(step, ReduceScatter) else None
            for r in group:
                c = coord[r]
                if isinstance(step, AllGather):
                    nxt[r] = np.concatenate(members, axis=step.dim)
                elif isinstance(step, LocalSlice):
                    nxt[r] = np.split(current[r], n, axis=step.dim)[c]
                elif isinstance(step, AllToAll):
                    nxt[r] = np.concatenate([pieces[c] for pieces in split], axis=step.concat_dim)
                elif isinstance(step, ReduceScatter):
                    nxt[r] = parts[c].copy()
                elif isinstance(step, AllReduce):
                    nxt[r] = reduced.copy()
                elif isinstance(step, MakePartial):
                    keep = step.op != "sum" or c == 0
                    nxt[r] = current[r].copy() if keep else np.zeros_like(current[r])
                else:
                    raise TypeError(f"unknown plan step {step!r}")
        current = nxt
    return current
