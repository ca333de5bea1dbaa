"""A strategy re-derived for another world size: its data axis resized, every other axis kept.

What shrinks when processes are lost is data parallelism: the other axes (tensor, pipeline, ...)
cut the model itself, and a process holds its part of every parameter only with them intact. A
world size that is not a multiple of the other axes' product, a strategy without a data axis, or
a global batch the new data axis does not divide cannot be served, and is refused by name.
"""
from __future__ import annotations

import math
import os
import sys
from typing import Optional

from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.shard.model_strategy import Strategy

__all__ = ["CannotResize", "EXIT_CANNOT_RESIZE", "resize_data_axis", "elastic_strategy"]

EXIT_CANNOT_RESIZE = 3  # a worker's exit code telling the elastic launcher not to restart


class CannotResize(ValueError):
    """The strategy cannot run on the world size asked for (the message says why)."""


def resize_data_axis(strategy: Strategy, world_size: int, batch_size: Optional[int] = None) -> Strategy:
    """`strategy` on a mesh of `world_size` devices: its data axis resized, all else unchanged.

    Args:
        strategy: a Strategy whose mesh has a data axis (`strategy.data_axis`).
        world_size: the new number of devices (processes).
        batch_size: the global batch, checked to divide by the new data axis (None: not checked).

    Returns:
        A new Strategy (the same object when the size is unchanged).

    Raises:
        CannotResize: no data axis, `world_size` not a multiple of the other axes' product, a
            batch the new data axis does not divide, or a mesh with an explicit rank list.
    """
    if not isinstance(strategy, Strategy):
        raise CannotResize(f"strategy: expected a Strategy (a Layout called with tensor_map=...), got "
                           f"{type(strategy).__name__}; YAML configs are not resized")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise CannotResize(f"world_size: expected an int >= 1, got {world_size!r}")
    mesh = strategy.mesh
    if mesh.size == world_size:
        return strategy
    axis = strategy.data_axis
    if axis is None:
        raise CannotResize(f"the strategy's mesh {mesh.device_matrix} {mesh.alias_names} has no data axis: it "
                           f"cannot be resized from {mesh.size} to {world_size} devices")
    if tuple(mesh.rank_list) != tuple(range(mesh.size)):
        raise CannotResize(f"the mesh has an explicit rank list {list(mesh.rank_list)}: it is not resized")
    index = mesh.axis_index(axis)
    others = math.prod(n for i, n in enumerate(mesh.device_matrix) if i != index)
    if world_size % others:
        kept = ", ".join(f"{a}={n}" for i, (a, n) in enumerate(zip(mesh.alias_names, mesh.device_matrix)) if i != index)
        raise CannotResize(f"{world_size} devices cannot run the strategy: the axes kept ({kept}) need a multiple of "
                           f"{others}; only the {axis!r} axis ({mesh.device_matrix[index]}) can shrink")
    data = world_size // others
    if batch_size is not None and batch_size % data:
        raise CannotResize(f"the global batch {batch_size} does not divide over {axis}={data} ({world_size} devices)")
    matrix = tuple(data if i == index else n for i, n in enumerate(mesh.device_matrix))
    resized = Layout(matrix, tuple(mesh.alias_names))
    context = strategy.context
    return Strategy(resized, strategy.tensor_map, strategy.optimizer_state, strategy.data_axis, strategy.input_map,
                    strategy.overrides, context_parallel=context and context.axis,
                    context_method=context and context.method, optional_overrides=strategy.optional_overrides)


def elastic_strategy(strategy: Strategy, batch_size: Optional[int] = None) -> Strategy:
    """Worker side: `strategy` resized to this job's world size (msrun's MS_WORKER_NUM).

    Under the elastic launcher (MSHYPER_ELASTIC_ATTEMPT set) a strategy that cannot be resized
    ends the job, saying why, with exit code EXIT_CANNOT_RESIZE, so the launcher does not
    restart it; elsewhere CannotResize is raised.
    """
    world_size = int(os.environ.get("MS_WORKER_NUM", os.environ.get("RANK_SIZE", "1")))
    try:
        return resize_data_axis(strategy, world_size, batch_size)
    except CannotResize as exc:
        if "MSHYPER_ELASTIC_ATTEMPT" not in os.environ:
            raise
        print(f"mindspore_hyper elastic: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_CANNOT_RESIZE)
