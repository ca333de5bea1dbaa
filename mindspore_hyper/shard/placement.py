"""Placements: how one mesh axis holds a tensor (Shard a dimension, Replicate, or Partial values)."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Placement", "Shard", "Replicate", "Partial", "REDUCE_OPS", "RANK_LOCAL"]

REDUCE_OPS = ("sum", "avg", "max", "min")

# Not a placement a user declares: the mark a TensorLayout puts on the mesh axes along which a
# rank-local value (`DTensor.to_local()` of a process holding several ranks) differs. Such a
# value has each rank's own tensor and no global value.
RANK_LOCAL = "local"


class Placement:
    """Base of the three placements of a tensor along one mesh axis."""

    def is_shard(self, dim: int = None) -> bool:
        """Whether this is Shard (of dimension `dim`, when given)."""
        return isinstance(self, Shard) and (dim is None or self.dim == dim)

    def is_replicate(self) -> bool:
        return isinstance(self, Replicate)

    def is_partial(self) -> bool:
        return isinstance(self, Partial)


@dataclass(frozen=True)
class Shard(Placement):
    """The tensor's dimension `dim` is split into contiguous chunks along this mesh axis, as
    torch.chunk splits it: ceil(size / devices) elements each, the trailing devices fewer or none
    when the size does not divide (`shard.chunking`). A negative `dim` counts from the last
    dimension, as in HyperParallel and torch."""

    dim: int

    def __post_init__(self):
        if isinstance(self.dim, bool) or not isinstance(self.dim, int):
            raise ValueError(f"Shard(dim={self.dim!r}): dim must be an int")

    def normalized(self, ndim: int) -> "Shard":
        """This placement with `dim` counted from the front of an `ndim`-dimensional tensor.

        Raises:
            ValueError: `dim` is outside [-ndim, ndim).
        """
        if not -ndim <= self.dim < ndim:
            raise ValueError(f"Shard({self.dim}): the tensor has {ndim} dimensions")
        return Shard(self.dim % ndim)

    def __repr__(self) -> str:
        return f"Shard({self.dim})"


@dataclass(frozen=True)
class Replicate(Placement):
    """Every device along this mesh axis holds the same values."""

    def __repr__(self) -> str:
        return "Replicate()"


@dataclass(frozen=True)
class Partial(Placement):
    """Devices along this axis hold partial values; the tensor is their reduction by `reduce_op`.

    `sum`: the tensor is the sum of the copies; `avg`: their mean; `max`/`min`: their max/min.
    (`op` is the same field under this package's earlier name.)
    """

    reduce_op: str = "sum"

    def __post_init__(self):
        if self.reduce_op not in REDUCE_OPS:
            raise ValueError(f"Partial(reduce_op={self.reduce_op!r}): expected one of {', '.join(REDUCE_OPS)}")

    @property
    def op(self) -> str:
        return self.reduce_op

    def __repr__(self) -> str:
        return f"Partial({self.reduce_op!r})"
