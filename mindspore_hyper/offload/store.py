"""The offload store: the C++ block store (device / host / disk tiers), the tensor layer over it and
the prefetch scheduler, configured from the context flags."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import numpy as np

from mindspore_hyper import _core
from mindspore_hyper.context import get_context
from mindspore_hyper.units import format_bytes

__all__ = ["OffloadStore", "PinCount", "StoreError", "CapacityError", "DiskError", "CorruptBlockError"]

StoreError = _core.StoreError
CapacityError = _core.CapacityError
DiskError = _core.DiskError
CorruptBlockError = _core.CorruptBlockError


@dataclass
class TensorRef:
    """A tensor in the store: its id, shape, dtype and blocks, and the handle by which the
    MindSpore kernels reach its store (`ops.StoreFetch` / `StorePut`)."""

    tid: int
    shape: tuple
    dtype: np.dtype
    blocks: tuple
    store_handle: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


class PinCount:
    """The blocks pinned on a device tier (pinned by `acquire`, unpinned by `release`): now and at
    the peak. Pinned blocks are the ones in use, which the tier must hold whatever its cache
    holds besides; their count follows the callers' acquire/release order only (no timing), so
    a dry run reproduces it (`offload/shape_store.py`)."""

    def __init__(self):
        self.count: Dict[int, int] = {}  # block id -> pins
        self.peak_blocks = 0
        # pins of a block that was not pinned (each one a load onto the tier unless its cache of
        # unpinned blocks still held it), since `begin_step`
        self.step_loads = 0

    def begin_step(self) -> None:
        """A new step: `step_loads` counts from zero."""
        self.step_loads = 0

    def pin(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            if b not in self.count:
                self.step_loads += 1
            self.count[b] = self.count.get(b, 0) + 1
        self.peak_blocks = max(self.peak_blocks, len(self.count))

    def unpin(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            left = self.count.get(b, 0) - 1
            if left > 0:
                self.count[b] = left
            else:
                self.count.pop(b, None)

    def stats(self, block_size: int) -> Dict[str, int]:
        """Blocks pinned now and at the peak, and the peak's bytes (blocks x `block_size`)."""
        return {"blocks": len(self.count), "peak_blocks": self.peak_blocks,
                "peak_bytes": self.peak_blocks * block_size}


class OffloadStore:
    """Block store + tensor store + prefetch scheduler.

    Args:
        block_size: bytes per cache block (default: the ``cache_block_size`` flag).
        device_memory: device-tier budget in bytes (default: ``device_memory``).
        host_memory: host DRAM pool in bytes (default: ``host_memory``).
        offload_dir: directory of the disk tier (default: ``offload_dir``; '' = system temp).
        prefetch_depth: blocks kept in flight ahead of use (default: ``prefetch_depth``); 0
            disables prefetching (every access is fetched on demand).
        io_workers: I/O worker threads of the prefetch scheduler.
        worker_nice: nice value (0..19) of the store's background threads and of the offload's
            host-update and writer threads (default: ``offload_worker_nice``): they yield the
            cores to the compute, which matters where both share the CPU (simulation).
        drop_page_cache: keep the page cache out of disk I/O so reads really hit the disk
            (benchmarks): O_DIRECT, or posix_fadvise(DONTNEED) after each I/O.
        direct_io: with `drop_page_cache`, use O_DIRECT (less CPU per block) where the file
            system accepts it; False: buffered I/O + posix_fadvise (streams faster on some disks).
    """

    def __init__(self, block_size: Optional[int] = None, device_memory: Optional[int] = None,
                 host_memory: Optional[int] = None, offload_dir: Optional[str] = None,
                 prefetch_depth: Optional[int] = None, io_workers: int = 2,
                 drop_page_cache: bool = False, direct_io: bool = True, worker_nice: Optional[int] = None):
        self.block_size = int(block_size if block_size is not None else get_context("cache_block_size"))
        self.device_memory = int(device_memory if device_memory is not None else get_context("device_memory"))
        self.host_memory = int(host_memory if host_memory is not None else get_context("host_memory"))
        directory = offload_dir if offload_dir is not None else get_context("offload_dir")
        depth = prefetch_depth if prefetch_depth is not None else get_context("prefetch_depth")
        self.worker_nice = int(worker_nice if worker_nice is not None else get_context("offload_worker_nice"))
        if not 0 <= self.worker_nice <= 19:
            raise ValueError(f"worker_nice must be in 0..19, got {self.worker_nice}")
        if self.device_memory < self.block_size:
            raise ValueError(f"device_memory={format_bytes(self.device_memory, short=True)} holds no cache block of "
                             f"cache_block_size={format_bytes(self.block_size, short=True)}: raise device_memory "
                             f"(per device in simulation) or lower cache_block_size")
        self.blocks = _core.BlockStore(self.block_size, self.device_memory, self.host_memory, directory,
                                       drop_page_cache=drop_page_cache, direct_io=direct_io)
        self.tensors = _core.TensorStore(self.blocks)
        self.scheduler = _core.PrefetchScheduler(self.blocks, depth=int(depth), workers=io_workers,
                                                 worker_nice=self.worker_nice)
        self.device_blocks = self.device_memory // self.block_size
        self.handle = _core.register_tensor_store(self.tensors)  # how the kernels reach it
        self.pins = PinCount()
        self.step_start: Optional[Dict] = None  # `stats()` at the last `begin_step`

    # -- tensors -------------------------------------------------------------------------
    def put(self, array: np.ndarray) -> TensorRef:
        """Stores a numpy array; returns its reference."""
        array = np.asarray(array)
        array = np.array(array, order="C", copy=not array.flags.c_contiguous)  # keeps 0-d shapes
        tid = self.tensors.put(array.reshape(-1).view(np.uint8))
        return TensorRef(tid, tuple(array.shape), array.dtype, tuple(self.tensors.blocks(tid)), self.handle)

    def update(self, ref: TensorRef, array: np.ndarray) -> None:
        array = np.asarray(array, dtype=ref.dtype)
        if not array.flags.c_contiguous:
            array = array.copy(order="C")
        if tuple(array.shape) != ref.shape:
            raise ValueError(f"update of tensor {ref.tid}: shape {array.shape} != stored {ref.shape}")
        self.tensors.update(ref.tid, array.reshape(-1).view(np.uint8))

    def get(self, ref: TensorRef, pinned_tier: Optional[str] = None) -> np.ndarray:
        """A copy of the tensor; `pinned_tier` when the caller holds pins on its blocks there."""
        out = np.empty(ref.shape, dtype=ref.dtype)
        self.get_into(ref, out, pinned_tier)
        return out

    def get_into(self, ref: TensorRef, out: np.ndarray, pinned_tier: Optional[str] = None) -> None:
        """Like `get`, into an existing C-contiguous array of the tensor's size (no allocation)."""
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("get_into needs a writeable C-contiguous array")
        flat = out.reshape(-1).view(np.uint8)
        if pinned_tier is None:
            self.tensors.get_into(ref.tid, flat)
        else:
            self.tensors.get_pinned_into(ref.tid, pinned_tier, flat)

    def discard(self, ref: TensorRef) -> None:
        """The tensor's value is no longer needed: it reads as zeros from now on, and its own
        blocks are never written to disk for it."""
        self.tensors.discard(ref.tid)

    def erase(self, ref: TensorRef) -> None:
        self.tensors.erase(ref.tid)

    def close_pack(self) -> None:
        """The next small tensor starts a new shared block."""
        self.tensors.close_pack()

    # -- scheduling ----------------------------------------------------------------------
    def acquire(self, blocks: Sequence[int], record: bool = True) -> None:
        """Pins the blocks on the device tier; record=False: without an access in the prefetch
        trace (the caller reports the use later with `touch`)."""
        self.scheduler.acquire(list(blocks), record)
        self.pins.pin(blocks)

    def touch(self, blocks: Sequence[int]) -> None:
        """Records a use of blocks the caller already holds (prefetch trace only)."""
        self.scheduler.touch(list(blocks))

    def release(self, blocks: Sequence[int]) -> None:
        self.scheduler.release(list(blocks))
        self.pins.unpin(blocks)

    def begin_step(self) -> None:
        """A step boundary: the prefetch trace's, the pin count's (`PinCount.step_loads`), and the
        counters the last step's measured figures are taken against (`step_start`)."""
        self.scheduler.begin_step()
        self.pins.begin_step()
        self.step_start = self.stats()

    @property
    def prefetch_depth(self) -> int:
        return self.scheduler.depth

    @prefetch_depth.setter
    def prefetch_depth(self, depth: int) -> None:
        self.scheduler.depth = int(depth)

    def stats(self) -> Dict:
        """Store statistics (per tier, bytes per tier pair), the prefetcher's (hits, stalls) and
        the blocks pinned on the device tier (`pinned`: now and at the peak, blocks and bytes)."""
        s = self.blocks.stats()
        s["prefetch"] = self.scheduler.stats()
        s["device_budget_bytes"] = self.device_memory
        s["pinned"] = self.pins.stats(self.block_size)
        return s

    def close(self) -> None:
        """Stops the I/O workers and releases the store (its disk files are removed)."""
        _core.release_tensor_store(self.handle)
        self.scheduler.drain()
        self.scheduler = None
        self.tensors = None
        self.blocks = None
