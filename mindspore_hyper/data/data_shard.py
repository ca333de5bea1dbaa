"""Which part of the global batch a process reads: the data-parallel size and this process's shard.

A parallel model splits its inputs' batch dimension along the strategy's data axis (or the axes
of `input_map[0]`) in contiguous blocks, rank `r` taking block `shard_index(r)` of `size`.
`DataShard.of_model` reads the same from the model, so a loader's rank part is exactly the rows
the model gives that rank. In simulation the one process holds every shard (`index` None: it
reads the global batch); under msrun each process holds one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["DataShard"]


@dataclass(frozen=True)
class DataShard:
    """The data-parallel split of the batch as one process sees it.

    Attributes:
        size: the data-parallel size (the blocks a global batch is cut into).
        index: this process's block, or None when it holds all of them (simulation, one device).
        axes: the mesh axes that split the batch, for messages ("mesh axis 'data'").
    """

    size: int = 1
    index: Optional[int] = None
    axes: str = "no data axis"

    def __post_init__(self):
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"dp_size={self.size!r}: expected an int >= 1")
        if self.index is not None and (isinstance(self.index, bool) or not isinstance(self.index, int)
                                       or not 0 <= self.index < self.size):
            raise ValueError(f"dp_rank={self.index!r}: expected an int in [0, {self.size}) or None")

    @classmethod
    def of_model(cls, model: Any) -> "DataShard":
        """The split a ParallelModel applies to its inputs' batch, and the block this process holds."""
        strategy = model.strategy
        entry = strategy.input_map[0] if strategy.input_map else strategy.data_axis
        if entry is None:
            return cls()
        layout = TensorLayout(model.mesh, [entry])
        size = layout.shard_count(0)
        held = {layout.shard_index(r, 0) for r in model.local_ranks}
        axes = f"mesh axis {entry!r}" if isinstance(entry, str) else f"mesh axes {tuple(entry)}"
        return cls(size, next(iter(held)) if len(held) == 1 and size > 1 else None, axes)

    def check(self, global_batch: int) -> None:
        """Refuse a global batch the data-parallel size does not divide.

        Raises:
            ValueError: naming global_batch, the size and the axes.
        """
        if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
            raise ValueError(f"global_batch={global_batch!r}: expected an int >= 1")
        if global_batch % self.size:
            raise ValueError(f"global_batch={global_batch}: not divisible by the data-parallel size {self.size} "
                             f"({self.axes}); use a multiple of {self.size}")

    def rows(self, global_batch: int, part: str) -> slice:
        """The rows of a global batch this process reads: all of them for part="global" or when it
        holds every block, else its block."""
        if part == "global" or self.index is None:
            return slice(0, global_batch)
        local = global_batch // self.size
        return slice(self.index * local, (self.index + 1) * local)
