"""CRC32C checksums of stored tensors, one per chunk of `chunk_bytes` of a shard's bytes, so a
load that reads part of a shard verifies only the chunks it reads. The CRC32C itself is the C++
store's (`_core.crc32c_chunks`, the SSE4.2 instruction where the CPU has it, the GIL released)."""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

from mindspore_hyper import _core
from mindspore_hyper.checkpoint.errors import CheckpointError

__all__ = ["ALGORITHM", "CHUNK_BYTES", "chunk_crcs", "chunks_of", "check_chunks"]

ALGORITHM = "crc32c"
CHUNK_BYTES = 1 << 20  # default: 4 bytes of checksum per MiB, at most 1 MiB read beyond each end of a run


def chunk_crcs(data: np.ndarray, chunk_bytes: int) -> List[int]:
    """The CRC32C of every `chunk_bytes` piece of `data` (a C-contiguous array, as bytes; the
    last piece may be shorter; an empty array has none), in one call with the GIL released."""
    return _core.crc32c_chunks(data.reshape(-1).view(np.uint8), chunk_bytes).tolist()


def chunks_of(runs: Sequence[Tuple[int, int]], chunk_bytes: int) -> List[Tuple[int, int]]:
    """The chunk index ranges [first, stop) covering the byte `runs` ((offset, length) into the
    shard, ascending), merged where they touch or overlap."""
    spans: List[Tuple[int, int]] = []
    for offset, length in runs:
        if length == 0:
            continue
        first, stop = offset // chunk_bytes, (offset + length - 1) // chunk_bytes + 1
        if spans and first <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(stop, spans[-1][1]))
        else:
            spans.append((first, stop))
    return spans


def check_chunks(path: str, key: str, raw: np.ndarray, first: int, crcs: Sequence[int], chunk_bytes: int) -> None:
    """Check the bytes `raw` (uint8) of chunks first, first + 1, ... of tensor `key` against `crcs`.

    Raises:
        CheckpointError: a chunk's CRC32C differs (the message names the file, the tensor and
            the byte range inside it).
    """
    got = chunk_crcs(raw, chunk_bytes)
    want = list(crcs[first:first + len(got)])
    if got == want:
        return
    i = next(i for i in range(len(got)) if i >= len(want) or got[i] != want[i])
    begin = (first + i) * chunk_bytes
    raise CheckpointError(f"{path}: corrupt checkpoint file: tensor {key!r}, bytes [{begin}, "
                          f"{begin + min(chunk_bytes, raw.size - i * chunk_bytes)}): CRC32C {got[i]:#010x}, the "
                          f"manifest says {f'{want[i]:#010x}' if i < len(want) else 'no such chunk'}")
