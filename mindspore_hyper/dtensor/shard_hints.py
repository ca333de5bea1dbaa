"""Honour MindSpore `.shard()` strategies in the simulation.

A primitive's `.shard()` strategy is stored in `prim.attrs` ("in_strategy" int tuples or
"in_layout" Layout dicts) but is not visible to the op dispatcher. `install_hints` converts the
strategies of a model's primitives into TensorLayouts on the run's mesh and makes each such
primitive announce its layouts to the run's Execution while it runs; the dispatcher `take`s them
and redistributes the inputs first, as MindSpore's semi-auto parallel would.

Int-tuple strategies name split counts, not mesh axes. A count n is mapped to an unused mesh
axis of size n (the axis already chosen for the same count in an earlier input is preferred, so
MatMul's shared contraction dimension lands on one axis), else to consecutive axes whose sizes
multiply to n. Layout-based strategies map exactly.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

from mindspore.ops.primitive import Primitive

from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["install_hints", "take", "strategy_to_layouts"]

_hinted_classes: Dict[type, type] = {}


def take(execution, op_name: str, n_inputs: int) -> Optional[List[Optional[TensorLayout]]]:
    """The layouts announced by the running primitive, if it is `op_name` (consumed once)."""
    active = execution.hints
    if active and active[-1][0] == op_name and active[-1][1] is not None:
        name, layouts = active[-1]
        active[-1] = (name, None)
        return list(layouts[:n_inputs]) + [None] * max(0, n_inputs - len(layouts))
    return None


def strategy_to_layouts(prim: Primitive, mesh: Layout) -> Optional[List[TensorLayout]]:
    """The input layouts requested by `prim.shard(...)`, or None if it has no strategy.

    Raises:
        ValueError: the strategy cannot be expressed on `mesh` (message names the primitive).
    """
    attrs = prim.attrs
    if attrs.get("in_layout"):
        return [_from_ms_layout(d, mesh, prim) for d in attrs["in_layout"]]
    if attrs.get("in_strategy"):
        return _from_int_strategy(attrs["in_strategy"], mesh, prim)
    return None


def _from_ms_layout(d: dict, mesh: Layout, prim: Primitive) -> TensorLayout:
    if tuple(d["device_matrix"]) != mesh.device_matrix:
        raise ValueError(
            f"{prim.name}.shard(): layout device_matrix {tuple(d['device_matrix'])} differs from the "
            f"model's mesh {mesh.device_matrix}"
        )
    right = lambda v: mesh.ndim - 1 - v  # noqa: E731 - MindSpore counts mesh axes from the right
    dims = []
    for entry in d["tensor_map"]:
        if isinstance(entry, (tuple, list)):
            dims.append(tuple(right(v) for v in entry if v != -1))
        else:
            dims.append(() if entry == -1 else (right(entry),))
    return TensorLayout.from_dims(mesh, dims)


def _from_int_strategy(strategy, mesh: Layout, prim: Primitive) -> List[TensorLayout]:
    by_count: Dict[int, Tuple[int, ...]] = {}
    layouts = []
    for i, dims in enumerate(strategy):
        used: set = set()
        entries = []
        for d, count in enumerate(dims):
            count = int(count)
            if count == 1:
                entries.append(())
                continue
            axes = by_count.get(count)
            if axes is None or used.intersection(axes):
                axes = _find_axes(mesh, count, used)
            if axes is None:
                raise ValueError(
                    f"{prim.name}.shard({tuple(map(tuple, strategy))}): input {i} dimension {d} is split "
                    f"{count} ways but no unused mesh axes of {mesh.device_matrix} {mesh.alias_names} "
                    f"multiply to {count}"
                )
            by_count.setdefault(count, axes)
            used.update(axes)
            entries.append(axes)
        layouts.append(TensorLayout.from_dims(mesh, entries))
    return layouts


def _find_axes(mesh: Layout, count: int, used: set) -> Optional[Tuple[int, ...]]:
    for a, size in enumerate(mesh.device_matrix):
        if size == count and a not in used:
            return (a,)
    for start in range(mesh.ndim):
        for stop in range(start + 2, mesh.ndim + 1):
            axes = tuple(range(start, stop))
            if not used.intersection(axes) and math.prod(mesh.device_matrix[a] for a in axes) == count:
                return axes
    return None


def install_hints(model, execution) -> int:
    """Make every primitive with a `.shard()` strategy in `model` announce its layouts to
    `execution` when called; returns how many primitives were found. Validates all strategies
    first."""
    mesh = execution.mesh
    found = []
    for _, cell in model.cells_and_names():
        for prim in list(getattr(cell, "_primitives", {}).values()):
            if isinstance(prim, Primitive):
                layouts = strategy_to_layouts(prim, mesh)
                if layouts is not None:
                    found.append((prim, layouts))
    for prim, layouts in found:
        prim._hyper_hint = (execution, layouts)
        prim.__class__ = _hinted_class(type(prim))
    return len(found)


def _hinted_class(cls: type) -> type:
    if getattr(cls, "_hyper_hinted", False):
        return cls
    if cls not in _hinted_classes:
        def __call__(self, *args, **kwargs):
            execution, layouts = self._hyper_hint
            execution.hints.append((self.name, layouts))
            try:
                return cls.__call__(self, *args, **kwargs)
            finally:
                execution.hints.pop()

        _hinted_classes[cls] = type(cls.__name__, (cls,), {"__call__": __call__, "_hyper_hinted": True})
    return _hinted_classes[cls]
