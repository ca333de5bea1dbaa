"""HyperParallel's placement types: this package's Shard, Replicate and Partial, and StridedShard."""
from __future__ import annotations

from dataclasses import dataclass

from mindspore_hyper.shard.placement import Partial, Placement, Replicate, Shard

__all__ = ["Placement", "Shard", "Replicate", "Partial", "StridedShard"]


@dataclass(frozen=True)
class StridedShard(Placement):
    """Upstream's strided shard (dimension `dim` split into `split_factor` interleaved pieces per
    device). Declared so scripts import it; laying a tensor out with it is refused (this
    package's layouts split dimensions contiguously)."""

    dim: int
    split_factor: int = 1
