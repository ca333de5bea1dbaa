"""Placements: how one mesh axis holds a tensor (Shard a dimension, Replicate, or Partial values)."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Placement", "Shard", "Replicate", "Partial", "REDUCE_OPS"]

REDUCE_OPS = ("sum", "avg", "max", "min")


class Placement:
    """Base of the three placements of a tensor along one mesh axis."""


@dataclass(frozen=True)
class Shard(Placement):
    """The tensor's dimension `dim` is split into equal contiguous chunks along this mesh axis."""

    dim: int

    def __post_init__(self):
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 0:
            raise ValueError(f"Shard(dim={self.dim!r}): dim must be a non-negative int")

    def __repr__(self) -> str:
        return f"Shard({self.dim})"


@dataclass(frozen=True)
class Replicate(Placement):
    """Every device along this mesh axis holds the same values."""

    def __repr__(self) -> str:
        return "Replicate()"


@dataclass(frozen=True)
class Partial(Placement):
    """Devices along this axis hold partial values; the tensor is their reduction by `op`.

    `sum`: the tensor is the sum of the copies; `avg`: their mean; `max`/`min`: their max/min.
    """

    op: str = "sum"

    def __post_init__(self):
        if self.op not in REDUCE_OPS:
            raise ValueError(f"Partial(op={self.op!r}): expected one of {', '.join(REDUCE_OPS)}")

    def __repr__(self) -> str:
        return f"Partial({self.op!r})"
