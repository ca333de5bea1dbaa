"""Chunked CRC32C of stored tensors: the store's per-chunk checksums equal its plain CRC32C of
each piece, also when taken while copying (the snapshot's copy); the chunks covering byte runs are merged where they touch; a bad chunk is named by
file, tensor and byte range."""
import numpy as np
import pytest

from mindspore_hyper import _core
from mindspore_hyper.checkpoint.checksums import check_chunks, chunk_crcs, chunks_of
from mindspore_hyper.checkpoint.errors import CheckpointError


def test_chunk_checksums_equal_the_crc32c_of_each_piece():
    data = np.random.default_rng(0).integers(0, 256, 3 * 8192 * 4 + 777, dtype=np.uint8)
    for chunk in (1, 100, 4096, 3 * 8192 + 5, len(data), 10 * len(data)):
        want = [int(_core.crc32c(data[at:at + chunk])) for at in range(0, len(data), chunk)]
        assert chunk_crcs(data, chunk) == want, chunk
    assert chunk_crcs(np.zeros(0, np.float32), 64) == []
    floats = np.arange(12, dtype=np.float32).reshape(3, 4)  # any dtype, as its bytes
    assert chunk_crcs(floats, 16) == [int(_core.crc32c(floats.view(np.uint8)[i:i + 1])) for i in range(3)]
    with pytest.raises(ValueError, match="chunk_bytes: expected an int >= 1"):
        _core.crc32c_chunks(data, 0)


def test_the_copy_pass_checksums_what_it_copies():
    data = np.random.default_rng(1).integers(0, 256, 3 * (64 << 10) + 4097, dtype=np.uint8)  # blocks and a tail
    for chunk in (1, 4096, (64 << 10) + 3, 5 * (64 << 10), len(data), 10 * len(data)):
        out = np.zeros_like(data)
        crcs = _core.copy_crc32c_chunks(data, out, chunk).tolist()
        assert np.array_equal(out, data) and crcs == chunk_crcs(data, chunk), chunk
    assert _core.copy_crc32c_chunks(data[:0], data[:0].copy(), 8).tolist() == []
    with pytest.raises(ValueError, match=r"dst: expected 4 bytes \(as src\), got 3"):
        _core.copy_crc32c_chunks(data[:4], np.zeros(3, np.uint8), 8)
    with pytest.raises(ValueError, match="chunk_bytes: expected an int >= 1"):
        _core.copy_crc32c_chunks(data, np.zeros_like(data), 0)


def test_the_chunks_of_byte_runs_merge_where_they_touch():
    assert chunks_of([(0, 10)], 4) == [(0, 3)]
    assert chunks_of([(0, 4), (4, 4), (20, 1)], 4) == [(0, 2), (5, 6)]
    assert chunks_of([(3, 2), (6, 1), (100, 0)], 4) == [(0, 2)]


def test_a_bad_chunk_is_named():
    data = np.arange(64, dtype=np.uint8)
    crcs = chunk_crcs(data, 16)
    check_chunks("f", "t", data[16:48], 1, crcs, 16)
    broken = data.copy()
    broken[40] ^= 1
    with pytest.raises(CheckpointError, match=r"f: corrupt checkpoint file: tensor 't', bytes \[32, 48\): CRC32C 0x"):
        check_chunks("f", "t", broken[16:48], 1, crcs, 16)
    with pytest.raises(CheckpointError, match="the manifest says no such chunk"):
        check_chunks("f", "t", data, 0, crcs[:2], 16)
