"""Strategy: a model-wide sharding declaration (the seed's `layout(tensor_map=..., optimizer_state=...)`).

It lives in the algebra beside Layout and TensorLayout because it is pure data over a mesh: a
default tensor map, name-pattern overrides, the optimizer-state and input splits. `Layout`'s
keyword form builds one directly (no hook from the strategy layer); `mindspore_hyper.strategy`
resolves it against a model into the per-parameter `StrategyTable` that the runtimes consume.

Semantics, for a parameter named N of shape S:
1. Its tensor map is the last override whose pattern (fnmatch glob on N) matches, else the
   default `tensor_map` applied by dimension position: truncated to len(S), padded with None.
2. Default maps adapt: a dimension whose size does not divide by its axes' device count is left
   unsharded and the fact is reported in `ParamLayout.notes`. Overrides are explicit, so
   they are checked strictly (wrong rank or indivisible -> ValueError).
3. Optimizer states (ZeRO-1) follow the parameter's layout and are additionally split along the
   `optimizer_state` axis, on the first dimension that divides, if the parameter does not
   already use that axis.
4. Model inputs are split along `data_axis` on their first (batch) dimension; `input_map`
   replaces that default (e.g. ("data", "seq") for batch and sequence splits).
5. With `context_parallel="cp"` the inputs' sequence dimension (dimension 1, or where `input_map`
   names the axis) is split along "cp" and attention runs by `context_method` (docs/context_parallel.md);
   the axis never splits parameters.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from mindspore_hyper.shard.context_parallel_spec import ContextParallel
from mindspore_hyper.shard.mesh_protocol import Mesh
from mindspore_hyper.shard.tensor_layout import NONE_ALIAS, TensorLayout

__all__ = ["Strategy", "ParamLayout"]

_AUTO = object()


@dataclass(frozen=True)
class ParamLayout:
    """Where one parameter lives: its layout, its optimizer states' layout and why."""

    name: str
    global_shape: Tuple[int, ...]
    layout: TensorLayout
    optimizer_layout: TensorLayout
    source: str  # "default" or the matching override pattern
    notes: Tuple[str, ...] = field(default=())

    @property
    def local_shape(self) -> Tuple[int, ...]:
        return self.layout.local_shape(self.global_shape)


class Strategy:
    """Default parameter tensor map, optimizer-state axis, input split, per-name overrides.

    Args:
        mesh: the device Layout.
        tensor_map: default tensor map for parameters, applied by dimension position.
        optimizer_state: mesh alias along which optimizer states are sharded (ZeRO-1), or None.
        data_axis: mesh alias splitting the batch dimension of inputs; defaults to "data" when
            the mesh has such an axis, else None.
        input_map: explicit tensor map for inputs (overrides data_axis), applied by position.
        overrides: ordered {name pattern: tensor map}; the last matching pattern wins. A pattern
            that matches no parameter of the model is an error in `resolve_strategy` unless it
            is in `optional_overrides` (or added with `override(..., optional=True)`).
        optional_overrides: override patterns that may match nothing (a strategy shared by
            several models).
        context_parallel: mesh alias splitting the inputs' sequence dimension (context
            parallelism), or None.
        context_method: how attention crosses that axis: "ring" (default) or "ulysses".

    Raises:
        ValueError: unknown aliases, methods or malformed maps (named in the message); a
            context-parallel axis that also splits parameters or the batch, or that `input_map`
            leaves out.
    """

    def __init__(self, mesh: Mesh, tensor_map: Sequence = (), optimizer_state: Optional[str] = None,
                 data_axis=_AUTO, input_map: Optional[Sequence] = None,
                 overrides: Optional[Dict[str, Sequence]] = None, context_parallel: Optional[str] = None,
                 context_method: Optional[str] = None, optional_overrides=()):
        self.mesh = mesh
        TensorLayout(mesh, tensor_map)  # validates aliases and uniqueness
        self.tensor_map = tuple(tensor_map)
        if optimizer_state is not None:
            mesh.axis_index(optimizer_state)
        self.optimizer_state = optimizer_state
        if data_axis is _AUTO:
            data_axis = "data" if "data" in mesh.alias_names else None
        if data_axis is not None:
            mesh.axis_index(data_axis)
        self.data_axis = data_axis
        if input_map is not None:
            TensorLayout(mesh, input_map)
        self.input_map = None if input_map is None else tuple(input_map)
        self.context: Optional[ContextParallel] = None
        if context_parallel is not None:
            self.context = ContextParallel.declare(mesh, context_parallel, context_method)
            self._check_context()
        elif context_method is not None:
            raise ValueError(f"context_method={context_method!r} given without context_parallel=<mesh alias>")
        self.overrides: Dict[str, Tuple] = {}
        for pattern, tmap in (overrides or {}).items():
            self._add_override(pattern, tmap)
        self.optional_overrides = set(optional_overrides)

    def _check_context(self) -> None:
        axis = self.context.axis
        if axis in _aliases(self.tensor_map):
            raise ValueError(f"context_parallel={axis!r}: the axis splits the sequence, it cannot also split "
                             f"parameters (tensor_map={self.tensor_map})")
        if axis == self.data_axis:
            raise ValueError(f"context_parallel={axis!r}: the axis is also data_axis; give the sequence its own axis")
        if self.input_map is not None and axis not in _aliases(self.input_map):
            raise ValueError(f"context_parallel={axis!r}: input_map={self.input_map} does not name the axis; "
                             "put it on the inputs' sequence dimension")

    @property
    def sequence_dim(self) -> Optional[int]:
        """The inputs' dimension split by the context-parallel axis (None without one)."""
        if self.context is None:
            return None
        if self.input_map is None:
            return 1
        return next(d for d, e in enumerate(self.input_map) if self.context.axis in _aliases([e]))

    def _add_override(self, pattern: str, tensor_map: Sequence) -> None:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError(f"override pattern {pattern!r}: expected a non-empty name pattern")
        try:
            TensorLayout(self.mesh, tensor_map)
        except ValueError as exc:
            raise ValueError(f"override {pattern!r}: {exc}") from None
        if self.context is not None and self.context.axis in _aliases(tensor_map):
            raise ValueError(f"override {pattern!r}: tensor map {tuple(tensor_map)} uses the context-parallel axis "
                             f"{self.context.axis!r}, which splits the sequence, not parameters")
        self.overrides.pop(pattern, None)
        self.overrides[pattern] = tuple(tensor_map)

    def override(self, pattern: str, *tensor_map, optional: bool = False) -> "Strategy":
        """Add (or move to last) an override for parameters whose name matches `pattern`; returns self.

        optional=True: the pattern may match no parameter of the model (otherwise
        `resolve_strategy` refuses it, naming the nearest parameter names)."""
        if not isinstance(optional, bool):
            raise ValueError(f"override {pattern!r}: optional={optional!r}; expected True or False")
        self._add_override(pattern, tensor_map)
        if optional:
            self.optional_overrides.add(pattern)
        else:
            self.optional_overrides.discard(pattern)
        return self

    def matching_override(self, name: str) -> Optional[str]:
        """The override pattern that decides parameter `name` (the last match), or None."""
        found = None
        for pattern in self.overrides:
            if fnmatch.fnmatchcase(name, pattern):
                found = pattern
        return found

    # -- per-tensor resolution ---------------------------------------------------------------
    def param_placement(self, name: str, shape: Sequence[int]) -> ParamLayout:
        """Resolve one parameter.

        Raises:
            ValueError: an override longer than the parameter's rank or not dividing its shape.
        """
        shape = tuple(int(s) for s in shape)
        pattern = self.matching_override(name)
        notes: List[str] = []
        if pattern is not None:
            tmap = self.overrides[pattern]
            if len(tmap) > len(shape):
                raise ValueError(
                    f"override {pattern!r} for parameter {name!r}: tensor map {tmap} has {len(tmap)} "
                    f"entries but the parameter has shape {shape} ({len(shape)} dimensions)"
                )
            layout = TensorLayout(self.mesh, tuple(tmap) + (None,) * (len(shape) - len(tmap)))
            try:
                layout.check_shape(shape)
            except ValueError as exc:
                raise ValueError(f"override {pattern!r} for parameter {name!r}: {exc}") from None
        else:
            layout, notes = self._fit(self.tensor_map, shape, f"parameter {name!r}")
        return ParamLayout(name, shape, layout, self._optimizer_layout(layout, shape),
                              pattern or "default", tuple(notes))

    def input_layout(self, shape: Sequence[int]) -> Tuple[TensorLayout, List[str]]:
        """Layout of a model input of `shape` (batch split on data_axis unless input_map is set;
        with context parallelism the sequence dimension, 1 by default, on its axis)."""
        tmap = self.input_map if self.input_map is not None else ((self.data_axis,) if self.data_axis else ())
        if self.context is not None and self.input_map is None:
            tmap = (self.data_axis, self.context.axis)
        return self._fit(tmap, tuple(shape), "input")

    def input_split_error(self, shape: Sequence[int]) -> Optional[str]:
        """Why a model input of `shape` cannot be split as this strategy declares, with the fix
        (which batch sizes work, padding the sequence, input_map), or None when it splits."""
        shape = tuple(int(s) for s in shape)
        tmap = self.input_map if self.input_map is not None else ((self.data_axis,) if self.data_axis else ())
        if self.context is not None and self.input_map is None:
            tmap = (self.data_axis, self.context.axis)
        entries = list(tmap[:len(shape)]) + [None] * (len(shape) - len(tmap))
        problems = []
        for dim, entry in enumerate(entries):
            count = TensorLayout(self.mesh, [entry]).shard_count(0)
            size = shape[dim]
            if size % count == 0:
                continue
            axes = f"mesh axis {entry!r}" if isinstance(entry, str) else f"mesh axes {tuple(entry)}"
            lower, upper = size // count * count, (size // count + 1) * count
            nearest = f"{lower} or {upper}" if lower else str(upper)
            if dim == 0 and self.data_axis is not None and self.data_axis in _aliases([entry]):
                problems.append(
                    f"the batch (dimension 0) is {size}, which does not divide over the {count} devices of {axes}: "
                    f"use a global batch that is a multiple of {count} ({', '.join(str(count * k) for k in (1, 2, 3))}, "
                    f"...; here {nearest}), e.g. drop the last partial batch (dataset.batch(n, drop_remainder=True)) "
                    f"or pad it")
            elif self.context is not None and self.context.axis in _aliases([entry]):
                problems.append(
                    f"the sequence (dimension {dim}) is {size} long, which does not divide over the {count} devices "
                    f"of the context-parallel {axes}: pad it to a multiple of {count} (here {upper}) and mask the padding")
            else:
                problems.append(
                    f"dimension {dim} is {size}, which does not divide over the {count} devices of {axes}: make it a "
                    f"multiple of {count} (here {nearest}), or give the strategy an input_map that leaves it unsplit")
        return "; ".join(problems) or None

    def _fit(self, tmap: Sequence, shape: Tuple[int, ...], what: str) -> Tuple[TensorLayout, List[str]]:
        entries = list(tmap[:len(shape)]) + [None] * (len(shape) - len(tmap))
        notes = []
        for dim, entry in enumerate(entries):
            single = TensorLayout(self.mesh, [entry])
            count = single.shard_count(0)
            if shape[dim] % count:
                notes.append(
                    f"{what}: dimension {dim} (size {shape[dim]}) not divisible by {count} "
                    f"(axis {entry}); left unsharded"
                )
                entries[dim] = None
        return TensorLayout(self.mesh, entries), notes

    def _optimizer_layout(self, layout: TensorLayout, shape: Tuple[int, ...]) -> TensorLayout:
        if self.optimizer_state is None:
            return layout
        axis = self.mesh.axis_index(self.optimizer_state)
        if axis in layout.sharded_axes():
            return layout
        n = self.mesh.device_matrix[axis]
        for dim, size in enumerate(shape):
            if size % (layout.shard_count(dim) * n) == 0:
                dims = [list(e) for e in layout.dims]
                dims[dim].append(axis)
                return TensorLayout.from_dims(self.mesh, dims)
        return layout

    def __repr__(self) -> str:
        tmap = tuple(NONE_ALIAS if e is None else e for e in self.tensor_map)
        return (f"Strategy(mesh={self.mesh}, tensor_map={tmap}, optimizer_state={self.optimizer_state!r}, "
                f"data_axis={self.data_axis!r}, input_map={self.input_map}, overrides={self.overrides}"
                f"{'' if self.context is None else f', context_parallel={self.context.axis!r}'}"
                f"{'' if self.context is None else f', context_method={self.context.method!r}'})")


def _aliases(tensor_map: Sequence) -> List[str]:
    """The mesh aliases a tensor map names (entries may be an alias, None or a tuple of aliases)."""
    out: List[str] = []
    for entry in tensor_map:
        out.extend(entry if isinstance(entry, (tuple, list)) else [entry])
    return [a for a in out if isinstance(a, str) and a != NONE_ALIAS]
