"""`ShapeStore`: the offload store of a dry run, on sizes only.

A dry run has no values to store, but the offload's device-tier figures do not depend on them:
which blocks a tensor occupies follows from its byte size and the order of the puts (the C++
`TensorStore::Put`: a tensor of at least one block gets blocks of its own, a smaller one is
packed into the current shared block at 64-byte alignment, `close_pack` starts a new one), and
which blocks are pinned on the device tier follows from the callers' acquire/release order
(`PinCount`, the same count `OffloadStore` keeps). A pin beyond the device tier's blocks raises
`CapacityError`, as the C++ store does when every slot holds a pinned block.

Not modelled: the device tier's cache of unpinned blocks (the C++ tier's `peak_bytes`). Which
unpinned blocks are on the tier depends on when the prefetch workers' copies complete and when
the writer threads' writes drop a device copy (timings), not on the schedule alone.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

from mindspore_hyper.context import get_context
from mindspore_hyper.offload.store import CapacityError, PinCount, TensorRef
from mindspore_hyper.units import format_bytes

__all__ = ["ShapeStore"]

_ALIGN = 64  # bytes: a packed tensor's offset in its shared block (tensor_store.cc, kAlign)


class ShapeStore:
    """One device's store in a dry run: block layout and device-tier pins, no values.

    Args are those of `OffloadStore` (defaults from the same context flags); `block_size` and
    `device_memory` decide the figures, the others are checked and kept for the statistics.

    Raises:
        ValueError: `device_memory` below one block, or `worker_nice` outside 0..19 (as
            `OffloadStore`).
    """

    def __init__(self, block_size: Optional[int] = None, device_memory: Optional[int] = None,
                 host_memory: Optional[int] = None, offload_dir: Optional[str] = None,
                 prefetch_depth: Optional[int] = None, io_workers: int = 2,
                 drop_page_cache: bool = False, direct_io: bool = True, worker_nice: Optional[int] = None):
        self.block_size = int(block_size if block_size is not None else get_context("cache_block_size"))
        self.device_memory = int(device_memory if device_memory is not None else get_context("device_memory"))
        self.host_memory = int(host_memory if host_memory is not None else get_context("host_memory"))
        self.prefetch_depth = int(prefetch_depth if prefetch_depth is not None else get_context("prefetch_depth"))
        self.worker_nice = int(worker_nice if worker_nice is not None else get_context("offload_worker_nice"))
        if not 0 <= self.worker_nice <= 19:
            raise ValueError(f"worker_nice must be in 0..19, got {self.worker_nice}")
        if self.block_size <= 0:
            raise ValueError(f"block_size must be a positive number of bytes, got {self.block_size}")
        if self.device_memory < self.block_size:
            raise ValueError(f"device_memory={format_bytes(self.device_memory, short=True)} holds no cache block of "
                             f"cache_block_size={format_bytes(self.block_size, short=True)}: raise device_memory "
                             f"(per device in simulation) or lower cache_block_size")
        self.device_blocks = self.device_memory // self.block_size
        self.pins = PinCount()
        self.stored_bytes = 0  # bytes of the tensors put
        self._blocks = 0  # blocks allocated (ids 0, 1, ...)
        self._pack_block = -1
        self._pack_fill = 0

    def put(self, shape: Sequence[int], dtype) -> TensorRef:
        """The reference a value of `shape` and `dtype` would get (its blocks as the C++ store
        allocates them)."""
        ref = TensorRef(-1, tuple(int(n) for n in shape), np.dtype(dtype), (), -1)
        nbytes = ref.nbytes
        if nbytes >= self.block_size:
            count = -(-nbytes // self.block_size)
            blocks = tuple(range(self._blocks, self._blocks + count))
            self._blocks += count
        elif nbytes > 0:
            if self._pack_block < 0 or self._pack_fill + nbytes > self.block_size:
                self._pack_block, self._pack_fill = self._blocks, 0
                self._blocks += 1
            blocks = (self._pack_block,)
            self._pack_fill = -(-(self._pack_fill + nbytes) // _ALIGN) * _ALIGN
        else:
            blocks = ()
        ref.blocks = blocks
        self.stored_bytes += nbytes
        return ref

    def close_pack(self) -> None:
        """The next small tensor starts a new shared block."""
        self._pack_block, self._pack_fill = -1, 0

    def acquire(self, blocks: Sequence[int], record: bool = True) -> None:
        """Pins the blocks on the device tier (all or none).

        Raises:
            CapacityError: the pinned blocks would exceed the tier's blocks.
        """
        needed = len(set(self.pins.count) | set(blocks))
        if needed > self.device_blocks:
            raise CapacityError(f"device tier: pinning {len(blocks)} blocks would need {needed} pinned blocks, "
                                f"the tier holds {self.device_blocks}")
        self.pins.pin(blocks)

    def release(self, blocks: Sequence[int]) -> None:
        self.pins.unpin(blocks)

    def touch(self, blocks: Sequence[int]) -> None:
        """A use of held blocks (the prefetch trace only: nothing to model)."""

    def begin_step(self) -> None:
        """A step boundary: the pin count's loads count from zero (`PinCount.step_loads`)."""
        self.pins.begin_step()

    def stats(self) -> Dict:
        """The figures a shape-only store has: blocks and bytes stored, the device budget and the
        pinned blocks (as `OffloadStore.stats()["pinned"]`)."""
        return {"blocks": self._blocks, "block_size": self.block_size, "stored_bytes": self.stored_bytes,
                "device_budget_bytes": self.device_memory, "pinned": self.pins.stats(self.block_size)}
