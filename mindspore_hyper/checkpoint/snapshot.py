"""The snapshot of an asynchronous save: every shard this process writes, copied into the image
of its rank file, with the CRC32C of every chunk of the copy.

Two places to take it (`save_checkpoint(..., snapshot=...)`):

- "call": in the caller's thread, before `save_checkpoint` returns; the Parameters may change
  as soon as it has returned.
- "background": in the save's background thread, before it writes. The call returns after the
  planning and the agreement on the step; training goes on, and the next forward / backward
  only read the Parameters. Before anything writes them the snapshot must be complete: the
  **fence**, a forward pre-hook on the optimizer passed to `save_checkpoint`, waits for it when
  the optimizer is called (`optimizer(grads)`, as `ParallelModel.train_step` does);
  `SaveHandle.wait_snapshot()` waits for it explicitly (before a `set_data`, say); a load, the
  next save and the interpreter's exit wait for it too. The call also takes a **fingerprint**
  (the CRC32C of every chunk of every shard as it is then, one read pass with the GIL released);
  the copy's checksums must equal it, else a Parameter changed before it was copied (something
  the fence does not see: `set_data`, a BatchNorm's moving statistics updated in a forward, the
  optimizer called inside a compiled graph) and the save fails naming it: never a checkpoint
  that silently mixes two states.

The copies go straight into the images of the rank files (`safetensors_writer.file_layout`:
the header, then every shard at its offset; page-aligned staging buffers kept from the previous
save), which the writer writes as they are (O_DIRECT). A shard that is a whole array (every
shard under msrun and of a plain Cell) is copied by `_core.copy_crc32c_chunks` (memcpy and
CRC32C block by block while the block is in the cache, the GIL released): its checksums cost no
second pass. A shard cut from a larger array (a simulated sharded tensor) is copied by numpy and
checksummed after, and its fingerprint needs a contiguous copy in the call.
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

import numpy as np

from mindspore_hyper import _core
from mindspore_hyper.checkpoint.checksums import chunk_crcs
from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.checkpoint.faults import fault_point
from mindspore_hyper.checkpoint.safetensors_writer import FileLayout
from mindspore_hyper.checkpoint.staging import staging_bytes

__all__ = ["SNAPSHOT_MODES", "ShardCopy", "Snapshot", "wait_for_snapshots", "remove_finished_fences"]

SNAPSHOT_MODES = ("call", "background")
_pending: List["Snapshot"] = []  # background snapshots not taken yet
_fenced: List["Snapshot"] = []  # snapshots with fences still registered
_lock = threading.Lock()


@dataclass(frozen=True)
class ShardCopy:
    """One shard of the snapshot.

    Attributes:
        file: the rank file it goes to (relative path, as `RankFile.path`).
        key: its tensor key in that file.
        source: the Parameter's host array (shares its memory).
        slices: the shard's region of `source`.
        target: its bytes in the file image (uint8).
        fingerprint: CRC32C per chunk of the shard at the call (background snapshots), or None.
    """

    file: str
    key: str
    source: np.ndarray
    slices: Tuple[slice, ...]
    target: np.ndarray
    fingerprint: Optional[Tuple[int, ...]] = None

    @property
    def whole(self) -> bool:
        """Whether the shard is all of `source` (one contiguous copy)."""
        return all(s.indices(n) == (0, n, 1) for s, n in zip(self.slices, self.source.shape))

    def shard(self) -> np.ndarray:
        """The shard as it is now, C-contiguous (a view when whole, else a copy)."""
        return self.source if self.whole else np.ascontiguousarray(self.source[self.slices])


class Snapshot:
    """The file images of one save and the copies that fill them, taken once (`take`), in the
    call or in the background thread.

    Args:
        images: rank file path -> (its image: page-aligned uint8 of whole pages, its layout).
        copies: the shards to copy into them.
        chunk_bytes: bytes per CRC32C chunk (the manifest's).
        background: whether `take` runs in the background thread (fingerprints taken, a fence
            may be installed).
    """

    def __init__(self, images: Dict[str, Tuple[np.ndarray, FileLayout]], copies: Sequence[ShardCopy],
                 chunk_bytes: int, background: bool):
        self.images = dict(images)
        self.copies = tuple(copies)
        self.chunk_bytes = chunk_bytes
        self.background = background
        self._crcs: Dict[str, Dict[str, List[int]]] = {path: {} for path in self.images}
        self._done = threading.Event()
        self._fences: list = []  # (hook handle, registering thread id)
        if background:
            with _lock:
                _pending.append(self)

    @classmethod
    def plan(cls, files: Sequence[Tuple[str, FileLayout, Sequence[Tuple[str, np.ndarray, Tuple[slice, ...]]]]],
             chunk_bytes: int, background: bool) -> "Snapshot":
        """The images of `files` ((path, layout, (key, source, slices) per tensor)) with their
        headers written, and, for a background snapshot, the shards' fingerprints (taken now,
        in the caller's thread)."""
        images, copies = {}, []
        for path, layout, tensors in files:
            image = staging_bytes(("image", path), layout.size)
            image[:len(layout.header)] = np.frombuffer(layout.header, np.uint8)
            images[path] = (image, layout)
            for key, source, slices in tensors:
                begin, end = layout.spans[key]
                copy = ShardCopy(path, key, source, slices, image[begin:end])
                if background:
                    copy = dataclasses.replace(copy, fingerprint=tuple(chunk_crcs(copy.shard(), chunk_bytes)))
                copies.append(copy)
        return cls(images, copies, chunk_bytes, background)

    @property
    def buffers(self) -> Dict[Hashable, np.ndarray]:
        """The staging buffers, by key (given back for reuse when the save ends)."""
        return {("image", path): image for path, (image, _) in self.images.items()}

    def image(self, path: str) -> Tuple[np.ndarray, FileLayout, Dict[str, List[int]]]:
        """The rank file `path`'s image, layout and its tensors' chunk checksums (once taken)."""
        image, layout = self.images[path]
        return image, layout, self._crcs[path]

    def take(self) -> None:
        """Copy every shard into its image, checksumming the copy; a background snapshot then
        checks the copy against the fingerprint. The fence opens when this returns or raises.

        Raises:
            CheckpointError: a shard changed between the call and its copy (the tensor named).
        """
        try:
            fault_point("snapshot_start")
            for c in self.copies:
                if c.whole:
                    crcs = _core.copy_crc32c_chunks(c.source.reshape(-1).view(np.uint8), c.target,
                                                    self.chunk_bytes).tolist()
                else:
                    np.copyto(c.target.view(c.source.dtype).reshape(c.source[c.slices].shape), c.source[c.slices])
                    crcs = chunk_crcs(c.target, self.chunk_bytes)
                if c.fingerprint is not None and tuple(crcs) != c.fingerprint:
                    raise CheckpointError(
                        f"snapshot='background': the tensor {c.key!r} (of {c.file}) changed between the call and its "
                        "copy in the background (set_data, a BatchNorm's statistics updated in a forward, an optimizer "
                        "other than the one passed, or one called inside a compiled graph?); the step is not "
                        "saved. Call handle.wait_snapshot() before changing Parameters outside the optimizer, or "
                        "save with snapshot='call'")
                self._crcs[c.file][c.key] = crcs
            fault_point("snapshot_done")
        finally:
            self.release()

    def release(self) -> None:
        """Open the fence (the snapshot is complete, failed or will not be taken)."""
        self._done.set()
        with _lock:
            if self in _pending:
                _pending.remove(self)

    def done(self) -> bool:
        """Whether the snapshot is complete (or failed, or abandoned)."""
        return self._done.is_set()

    def wait(self) -> None:
        """Wait until the snapshot is complete, failed or abandoned."""
        if not self._done.is_set():
            fault_point("fence_wait")
            self._done.wait()

    def fence(self, optimizer) -> None:
        """Make `optimizer`'s next call wait for the snapshot (a forward pre-hook). MindSpore
        runs a Cell's pre-hooks while iterating over them, so a hook cannot remove itself: it is
        removed by `remove_fences` (the next save, the handle's wait from the same thread)."""
        def hook(cell, inputs):
            self.wait()

        with _lock:
            self._fences.append((optimizer.register_forward_pre_hook(hook), threading.get_ident()))
            _fenced.append(self)

    def remove_fences(self) -> None:
        """Remove this snapshot's fences registered by the calling thread (a Cell's hooks must
        not change while another thread runs them); only once the snapshot is done."""
        if not self.done():
            return
        me = threading.get_ident()
        with _lock:
            for handle, _ in [f for f in self._fences if f[1] == me]:
                handle.remove()
            self._fences = [f for f in self._fences if f[1] != me]
            if not self._fences and self in _fenced:
                _fenced.remove(self)


def remove_finished_fences() -> None:
    """Remove the calling thread's fences of every finished snapshot (each save does, so fences
    do not pile up on an optimizer)."""
    with _lock:
        snapshots = list(_fenced)
    for s in snapshots:
        s.remove_fences()


def wait_for_snapshots() -> None:
    """Wait for every background snapshot of this process not taken yet (before anything
    writes Parameters: a load)."""
    with _lock:
        snapshots = list(_pending)
    for s in snapshots:
        s.wait()

