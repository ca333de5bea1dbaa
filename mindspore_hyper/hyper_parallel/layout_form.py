"""Upstream's Layout call form in place of a mesh and placements: `DTensor.from_local(x, layout)`
and `dtensor.redistribute(layout)` with `layout = Layout((1, 8), ("dp", "tp"))("None", "tp")`
(upstream's redistribute test in its Layout form).

Such a layout is a device matrix with one name per axis and a global rank per position
(`rank_list`), and a tensor map: per tensor dimension "None" (not split), an axis name, or a
tuple of names (split over several axes, the first the major one). It becomes, exactly, the
DeviceMesh of those ranks in that shape with those names, and the tensor map as HyperParallel's
alias placements on it (the DeviceMesh takes them as they are, any axis order included). A
layout with Partial axes (this package's `TensorLayout.with_partial`; the call form makes none)
becomes Placement objects where they express it; a layout they cannot express, or one whose
tensor map does not match the tensor, is refused, naming the field. The DeviceMesh's
`device_type` is "cpu" (a Layout names no device kind; every kind runs on this machine's CPU).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from mindspore_hyper.dtensor.dtensor import accept_layout_form
from mindspore_hyper.hyper_parallel.device_mesh import DeviceMesh
from mindspore_hyper.shard.placement import Replicate
from mindspore_hyper.shard.tensor_layout import NONE_ALIAS, TensorLayout

__all__ = ["mesh_and_placements"]


def mesh_and_placements(layout: TensorLayout, ndim: int, caller: str = "DTensor.from_local") -> Tuple[DeviceMesh,
                                                                                                        tuple]:
    """The DeviceMesh and placements a Layout call result stands for (see module docstring).

    Args:
        layout: a Layout call result (`Layout(device_matrix, alias_name, rank_list)(*tensor_map)`).
        ndim: the number of dimensions of the tensor it lays out.
        caller: the API named in errors.

    Returns:
        (mesh, placements): alias placements (one entry per tensor dimension), or Placement
        objects (one per mesh dimension) for a layout with Partial axes.

    Raises:
        TypeError: `layout` is not a Layout call result.
        ValueError: its tensor_map does not have `ndim` entries, it marks a rank-local value, or
            its Partial axes come with a split placements cannot express (named).
    """
    if not isinstance(layout, TensorLayout):
        raise TypeError(f"{caller}: layout must be a Layout call result (layout('None', 'tp')), got "
                        f"{type(layout).__name__}")
    if layout.ndim != ndim:
        raise ValueError(f"{caller}: layout.tensor_map={layout.tensor_map} has {layout.ndim} entries, but the tensor "
                         f"has {ndim} dimensions; give one entry per dimension ('None' for one not split)")
    if layout.is_rank_local:
        raise ValueError(f"{caller}: layout.partial={layout.partial} marks a rank-local value (each rank its own "
                         f"tensor, no global value), which has no placements: pass a layout of a global value")
    matrix = layout.mesh
    mesh = DeviceMesh("cpu", np.array(matrix.rank_list).reshape(matrix.device_matrix),
                      mesh_dim_names=matrix.alias_names)
    if layout.is_partial:
        placements = layout.placements
        if mesh.tensor_layout(placements, ndim) != TensorLayout(mesh.root, layout.tensor_map, layout.partial):
            raise ValueError(f"{caller}: layout.tensor_map={layout.tensor_map} splits a dimension over several axes "
                             f"in another order than the mesh's {matrix.alias_names}, together with Partial axes "
                             f"(layout.partial={layout.partial}); placements cannot express both: split in the mesh's "
                             f"axis order, or reduce the Partial axes first")
        return mesh, placements
    if ndim == 0:
        return mesh, (Replicate(),) * mesh.ndim
    return mesh, tuple(NONE_ALIAS if entry is None else entry for entry in layout.tensor_map)


accept_layout_form(mesh_and_placements)
