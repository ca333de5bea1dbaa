"""ContextParallel: which mesh axis splits the sequence dimension, and how attention crosses it.

Context parallelism shards every activation along the sequence; attention, the one op that mixes
positions, runs by `method`:

- "ring": K/V blocks travel around the axis' ring; each device keeps an online softmax over the
  blocks it has seen (causal masks use the balanced zigzag chunk order).
- "ulysses": an AllToAll turns sequence-sharded q/k/v into head-sharded ones, attention runs on
  whole sequences for 1/cp of the heads, and a second AllToAll turns the result back.

The algorithms live in `mindspore_hyper.dtensor.context_parallel`; this value type only records the choice.
"""
from __future__ import annotations

from dataclasses import dataclass

from mindspore_hyper.shard.mesh_protocol import Mesh

__all__ = ["ContextParallel", "CONTEXT_METHODS"]

CONTEXT_METHODS = ("ring", "ulysses")


@dataclass(frozen=True)
class ContextParallel:
    """The context-parallel declaration of a Strategy.

    Attributes:
        axis: mesh alias that splits the sequence dimension.
        method: "ring" or "ulysses".
    """

    axis: str
    method: str = "ring"

    @classmethod
    def declare(cls, mesh: Mesh, axis, method, what: str = "context_parallel") -> "ContextParallel":
        """Validate a declaration against `mesh`.

        Args:
            mesh: the device Layout.
            axis: the mesh alias (a non-empty string).
            method: "ring" or "ulysses"; None means "ring".
            what: the argument or YAML path named in errors.

        Returns:
            The ContextParallel.

        Raises:
            ValueError: `axis` is not a mesh alias or `method` is unknown (both named).
        """
        if not isinstance(axis, str) or axis not in mesh.alias_names:
            raise ValueError(f"{what}: axis {axis!r} is not a mesh alias; expected one of {mesh.alias_names}")
        method = "ring" if method is None else method
        if method not in CONTEXT_METHODS:
            raise ValueError(f"{what}: method {method!r} is unknown; expected one of {CONTEXT_METHODS}")
        return cls(axis, method)

    def size(self, mesh: Mesh) -> int:
        """Devices along the axis (the cp size)."""
        return mesh.axis_size(self.axis)
