"""Writing one per-rank safetensors file durably: header (8-byte little-endian length + JSON with
each tensor's dtype, shape and data offsets, MindSpore's `__metadata__` plus this save's id), then
the tensors' bytes, each chunk checksummed (CRC32C), then fsync.

Two ways: `write_safetensors` from the arrays (a blocking save: straight from the Parameters'
memory, buffered writes), and `write_image` of a file image an asynchronous save's snapshot
filled (`file_layout` says where everything goes; its checksums come from the snapshot's copy):
page-aligned, written with O_DIRECT where the file system takes it, so the writer neither copies
the bytes into the page cache nor leaves dirty pages for the kernel's writeback threads (both
take CPU from the training; measured in docs/benchmarks.md).

Plain numpy and file I/O, no MindSpore call, so it runs in the background thread of an
asynchronous save; MindSpore's `load_checkpoint(path, format="safetensors")` reads the result.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import struct
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from mindspore_hyper.checkpoint.checksums import chunk_crcs
from mindspore_hyper.checkpoint.faults import fault_point
from mindspore_hyper.checkpoint.staging import ALIGN

__all__ = ["WrittenFile", "FileLayout", "file_layout", "write_safetensors", "write_image"]

_ALIGN = 8  # the header is padded with spaces to a multiple of 8 bytes, as safetensors' own writer does
_MAX_WRITE = 1 << 30  # bytes per write() call (Linux writes at most ~2 GB at once)
_IMAGE_WRITE = 16 << 20  # bytes per write() of a file image (a multiple of the page size)
USE_DIRECT_IO = True  # write images with O_DIRECT where possible (the stall benchmark's A/B turns it off)


@dataclass(frozen=True)
class WrittenFile:
    """A file written and synced: its size and each tensor's chunk checksums."""

    bytes: int
    crc32c: Dict[str, List[int]]


@dataclass(frozen=True)
class FileLayout:
    """Where everything of a safetensors file lies.

    Attributes:
        header: the file's first bytes (length prefix + padded JSON header).
        spans: tensor key -> its (begin, end) byte offsets in the file.
        size: the file's size in bytes.
    """

    header: bytes
    spans: Dict[str, Tuple[int, int]]
    size: int


def file_layout(tensors: Sequence[Tuple[str, Tuple[int, ...], int, str]], metadata: Dict[str, str]) -> FileLayout:
    """The layout of a file of `tensors` ((key, shape, bytes, safetensors dtype code), in key
    order) with `metadata`."""
    header: Dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for key, shape, nbytes, code in tensors:
        # MindSpore's own writer stores a 0-d tensor with shape [1] (same bytes); so do we
        header[key] = {"dtype": code, "shape": list(shape) or [1], "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % _ALIGN)
    start = 8 + len(text)
    spans = {key: (start + begin, start + end) for key, (begin, end) in
             ((k, header[k]["data_offsets"]) for k, _, _, _ in tensors)}
    return FileLayout(struct.pack("<Q", len(text)) + text, spans, start + offset)


def write_safetensors(path: str, tensors: Sequence[Tuple[str, np.ndarray, str]], metadata: Dict[str, str],
                      chunk_bytes: int, point: str = "") -> WrittenFile:
    """Write `tensors` ((key, C-contiguous array, safetensors dtype code), in key order) to the new
    file `path`, fsync it, and return its size and checksums.

    `point` names the file in the fault points ("file_open:<point>", "file_partial:<point>",
    "file_written:<point>", "file_synced:<point>").

    Raises:
        OSError: the file exists already or cannot be written.
    """
    layout = file_layout([(key, array.shape, array.nbytes, code) for key, array, code in tensors], metadata)
    crcs: Dict[str, List[int]] = {}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        fault_point(f"file_open:{point}")
        _write_all(fd, layout.header)
        for i, (key, array, _) in enumerate(tensors):
            crcs[key] = _write_tensor(fd, array, chunk_bytes)
            if i == len(tensors) // 2:
                fault_point(f"file_partial:{point}")
        fault_point(f"file_written:{point}")
        os.fsync(fd)
    finally:
        os.close(fd)
    fault_point(f"file_synced:{point}")
    return WrittenFile(layout.size, crcs)


def write_image(path: str, image: np.ndarray, size: int, crc32c: Dict[str, List[int]], point: str = "") -> WrittenFile:
    """Write the first `size` bytes of the file image `image` (page-aligned uint8 of whole pages,
    as `staging.staging_bytes` gives) to the new file `path`, fsync it; `crc32c` are its tensors'
    chunk checksums (returned as they are). O_DIRECT where the file system takes it (whole pages
    from the aligned image, then the file truncated to `size`); else buffered writes (after a
    refused O_DIRECT probe, the file is written from its start). Same fault points as
    `write_safetensors`.

    Raises:
        OSError: the file exists already or cannot be written.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        direct = USE_DIRECT_IO and _direct(fd)
        fault_point(f"file_open:{point}")
        end = image.size if direct else size
        half = (end // 2) // ALIGN * ALIGN if direct else end // 2  # O_DIRECT writes whole pages
        for piece, (first, last) in enumerate(((0, half), (half, end))):
            if piece == 1:
                fault_point(f"file_partial:{point}")
            for begin in range(first, last, _IMAGE_WRITE):
                _write_all(fd, image[begin:min(begin + _IMAGE_WRITE, last)])
        if direct and end != size:
            os.ftruncate(fd, size)
        fault_point(f"file_written:{point}")
        os.fsync(fd)
    finally:
        os.close(fd)
    fault_point(f"file_synced:{point}")
    return WrittenFile(size, crc32c)


def _direct(fd: int) -> bool:
    """Switch `fd` to O_DIRECT and probe it with one page (the header's, rewritten after);
    False, `fd` left buffered, where the file system refuses either (tmpfs, some FUSE and
    network file systems, a block size above the page)."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
        probe = _page()
        if os.pwrite(fd, probe, 0) != len(probe):
            raise OSError(errno.EINVAL, "short O_DIRECT write")
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
        return False
    return True


def _page() -> memoryview:
    """One page of zeros at a page-aligned address (an O_DIRECT probe)."""
    raw = np.zeros(2 * ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return memoryview(raw[start:start + ALIGN])


def _write_tensor(fd: int, array: np.ndarray, chunk_bytes: int) -> List[int]:
    """Checksum `array`'s bytes chunk by chunk and write them; each is one call with the GIL
    released (an asynchronous save's thread hardly competes with training for it). Returns the
    chunks' CRC32C."""
    crcs = chunk_crcs(array, chunk_bytes)
    _write_all(fd, array.reshape(-1).view(np.uint8))
    return crcs


def _write_all(fd: int, data) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view[:_MAX_WRITE]):]
