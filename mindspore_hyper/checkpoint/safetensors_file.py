"""Reading safetensors files by byte range: the header (8-byte little-endian length + JSON with
each tensor's dtype, shape and data offsets) and then the checksummed chunks that hold the byte
runs asked for, each chunk checked against its CRC32C, counted."""
from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from typing import Dict, Sequence, Tuple

import numpy as np

from mindspore_hyper.checkpoint.checksums import check_chunks, chunks_of
from mindspore_hyper.checkpoint.dtypes import ITEMSIZE as _ITEMSIZE
from mindspore_hyper.checkpoint.errors import CheckpointError

__all__ = ["StoredTensor", "SafetensorsHeader", "RangeReader"]

MAX_HEADER_BYTES = 100 << 20  # the safetensors format's own limit


@dataclass(frozen=True)
class StoredTensor:
    """A tensor in a safetensors file: dtype code, shape, and its bytes [begin, end) in the file."""

    dtype: str
    shape: Tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    """The parsed, checked header of one file.

    Attributes:
        path: the file.
        header_bytes: bytes read for it (8 + the JSON length).
        tensors: name -> StoredTensor (absolute file offsets).
        metadata: the `__metadata__` strings (MindSpore writes {"format": "ms", ...}).
    """

    path: str
    header_bytes: int
    tensors: Dict[str, StoredTensor]
    metadata: Dict[str, str]

    @classmethod
    def parse(cls, path: str, fd: int, file_size: int) -> "SafetensorsHeader":
        """Read and check the header of the open file `fd`.

        Raises:
            CheckpointError: truncated file, a header that is not safetensors JSON, an entry whose
                dtype, shape or offsets are malformed or point outside the file.
        """
        if file_size < 8:
            raise CheckpointError(f"{path}: corrupt safetensors file: {file_size} bytes, shorter than the 8-byte "
                                  "header length")
        (length,) = struct.unpack("<Q", os.pread(fd, 8, 0))
        if length > min(MAX_HEADER_BYTES, file_size - 8):
            raise CheckpointError(f"{path}: corrupt safetensors file: header length {length} does not fit the "
                                  f"file's {file_size} bytes")
        raw = os.pread(fd, length, 8)
        try:
            header = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise CheckpointError(f"{path}: corrupt safetensors file: the header is not JSON ({exc})") from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{path}: corrupt safetensors file: the header is not a JSON object")
        data_start = 8 + length
        metadata = header.pop("__metadata__", None) or {}
        tensors = {name: _stored(path, name, entry, data_start, file_size) for name, entry in header.items()}
        return cls(path, data_start, tensors, metadata)


def _stored(path: str, name: str, entry, data_start: int, file_size: int) -> StoredTensor:
    def bad(why: str):
        raise CheckpointError(f"{path}: corrupt safetensors file: tensor {name!r}: {why}")

    if not isinstance(entry, dict):
        bad("its header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in _ITEMSIZE:
        bad(f"dtype {dtype!r} is not one of {', '.join(_ITEMSIZE)}")
    if not isinstance(shape, list) or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in shape):
        bad(f"shape {shape!r} is not a list of non-negative ints")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or any(isinstance(n, bool) or not isinstance(n, int) for n in offsets)):
        bad(f"data_offsets {offsets!r} is not [begin, end]")
    begin, end = data_start + offsets[0], data_start + offsets[1]
    if not data_start <= begin <= end <= file_size:
        bad(f"data_offsets {offsets} point outside the file's {file_size - data_start} data bytes (truncated?)")
    if end - begin != math.prod(shape) * _ITEMSIZE[dtype]:
        bad(f"data_offsets {offsets} hold {end - begin} bytes, but shape {shape} of {dtype} needs "
            f"{math.prod(shape) * _ITEMSIZE[dtype]}")
    return StoredTensor(dtype, tuple(shape), begin, end)


class RangeReader:
    """Reads headers and checksummed byte runs of checkpoint files and counts what it read.

    Attributes:
        data_bytes: bytes of the runs asked for.
        read_bytes: bytes read for them (whole checksummed chunks: >= data_bytes).
        header_bytes: header bytes read.
        reads: number of reads (one per span of adjacent chunks).
    """

    def __init__(self):
        self.data_bytes = 0
        self.read_bytes = 0
        self.header_bytes = 0
        self.reads = 0
        self._fds: Dict[str, int] = {}
        self._headers: Dict[str, SafetensorsHeader] = {}

    def header(self, path: str) -> SafetensorsHeader:
        """The checked header of `path` (read once)."""
        if path not in self._headers:
            fd = self._open(path)
            header = SafetensorsHeader.parse(path, fd, os.fstat(fd).st_size)
            self.header_bytes += header.header_bytes
            self._headers[path] = header
        return self._headers[path]

    def read_checked(self, path: str, key: str, stored: StoredTensor, runs: Sequence[Tuple[int, int]],
                     crcs: Sequence[int], chunk_bytes: int) -> np.ndarray:
        """The bytes of `runs` ((offset, length) into the tensor `key`'s data, ascending) of
        `path`, concatenated as uint8; every chunk they touch is read whole and checked.

        Raises:
            CheckpointError: the file ended early, or a chunk's CRC32C differs (naming the file,
                the tensor and the bytes).
        """
        size = stored.end - stored.begin
        if len(runs) == 1 and tuple(runs[0]) == (0, size):  # the whole tensor: no copy
            whole = self._read(path, stored.begin, size)
            check_chunks(path, key, whole, 0, crcs, chunk_bytes)
            self.data_bytes += size
            return whole
        out = np.empty(sum(n for _, n in runs), np.uint8)
        at, i = 0, 0
        for first, stop in chunks_of(runs, chunk_bytes):
            begin, end = first * chunk_bytes, min(stop * chunk_bytes, size)
            span = self._read(path, stored.begin + begin, end - begin)
            check_chunks(path, key, span, first, crcs, chunk_bytes)
            while i < len(runs) and runs[i][0] < end:
                offset, length = runs[i]
                out[at:at + length] = span[offset - begin:offset - begin + length]
                at += length
                i += 1
        self.data_bytes += at
        return out

    def _read(self, path: str, offset: int, length: int) -> np.ndarray:
        fd = self._open(path)
        out = np.empty(length, np.uint8)
        view = memoryview(out)
        done = 0
        while done < length:
            got = os.preadv(fd, [view[done:]], offset + done)
            if got == 0:
                raise CheckpointError(f"{path}: corrupt safetensors file: {length} bytes expected at offset "
                                      f"{offset}, the file ends after {done} (truncated?)")
            done += got
        self.reads += 1
        self.read_bytes += length
        return out

    @property
    def files(self) -> int:
        """Number of files whose header was read."""
        return len(self._headers)

    def _open(self, path: str) -> int:
        if path not in self._fds:
            try:
                self._fds[path] = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise CheckpointError(f"{path}: cannot open checkpoint file ({exc.strerror})") from None
        return self._fds[path]

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> "RangeReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
