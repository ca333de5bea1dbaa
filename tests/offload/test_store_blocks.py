"""Block store semantics: tiers, spanning/packing, eviction order, pinning, versions, checksums,
disk errors, concurrent readers/writers (the C++ core through mindspore_hyper._core)."""
import glob
import os
import shutil
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from mindspore_hyper import _core
from paths import REPO_ROOT

BS = 4096



def flip_disk_byte(store, block, offset, mask):
    """Corrupts one byte of the block's disk copy (XOR with `mask`); returns (file, block offset)."""
    path, off = store.disk_location(block)
    with open(path, "r+b") as f:
        f.seek(off + offset)
        byte = f.read(1)
        f.seek(off + offset)
        f.write(bytes([byte[0] ^ mask]))
    return path, off

def make_store(tmp_path, device=2, host=3, **kw):
    return _core.BlockStore(BS, device * BS, host * BS, str(tmp_path), **kw)


def block_bytes(value, n=BS):
    return np.full(n, value, dtype=np.uint8)


def test_crc32c_known_value_and_hw_matches_software():
    assert _core.crc32c(np.frombuffer(b"123456789", np.uint8)) == 0xE3069283
    data = np.random.default_rng(0).integers(0, 256, 100_003, dtype=np.uint8)
    for start in range(0, 9):
        assert _core.crc32c(data[start:]) == _core.crc32c_software(data[start:])


def test_crc32c_long_buffers_match_software():
    # Buffers of several 3 x 8KB lanes take the interleaved path; odd lengths and offsets the tails.
    data = np.random.default_rng(1).integers(0, 256, (4 << 20) + 1001, dtype=np.uint8)
    for start, end in ((0, None), (3, None), (5, 3 * 8192), (7, 3 * 8192 + 9), (0, 6 * 8192 - 1)):
        part = data[start:end]
        assert _core.crc32c(part) == _core.crc32c_software(part)
        half = len(part) // 2
        assert _core.crc32c(part[half:], _core.crc32c(part[:half])) == _core.crc32c_software(part)


def test_partly_filled_blocks_move_only_their_used_pages(tmp_path):
    bs = 64 * 1024
    s = _core.BlockStore(bs, 2 * bs, 2 * bs, str(tmp_path))
    # Fill every slot with garbage first, so stale slot memory would show if it were served.
    junk = [s.allocate() for _ in range(4)]
    for b in junk:
        s.write(b, np.full(bs, 0xAB, np.uint8))
    for b in junk:
        s.free(b)
    b = s.allocate()
    assert (s.read(b) == 0).all()  # never written: zeros, whatever the slot held
    s.write(b, np.full(100, 7, np.uint8), offset=64)
    s.write(b, np.full(10, 9, np.uint8), offset=20000)  # beyond the fill mark: the gap reads 0
    expect = np.zeros(bs, np.uint8)
    expect[64:164] = 7
    expect[20000:20010] = 9
    np.testing.assert_array_equal(s.read(b), expect)
    before = s.stats()["bytes_moved"]
    s.evict(b, "host")  # to disk: 5 pages (20010 bytes rounded up to 4KB), not 64KB
    s.fetch([b], "device")  # and back up through host to device
    after = s.stats()["bytes_moved"]
    assert after["host->disk"] - before["host->disk"] == 5 * 4096
    assert after["disk->host"] - before["disk->host"] == 5 * 4096
    assert after["host->device"] - before["host->device"] == 5 * 4096
    s.pin(b, "device")
    out = np.full(bs, 0xCD, np.uint8)
    s.read_pinned_into(b, "device", out)
    np.testing.assert_array_equal(out, expect)
    s.unpin(b, "device")
    s.write(b, np.full(bs, 3, np.uint8))  # a whole-block write fills it
    s.evict(b, "device")
    s.evict(b, "host")
    assert (s.read(b) == 3).all()


def test_discarded_blocks_read_as_zeros_and_never_go_to_disk(tmp_path):
    s = make_store(tmp_path, device=2, host=3)
    a, b = s.allocate(), s.allocate()
    s.write(a, block_bytes(1))
    s.write(b, block_bytes(2))
    s.evict(a, "host")  # a: on disk only; b: dirty in host
    v = s.version(a)
    s.discard(a)
    s.discard(b)
    assert s.version(a) == v + 2
    assert (s.read(a) == 0).all() and (s.read(b) == 0).all()
    before = s.stats()["bytes_moved"]
    for blk in (a, b):
        s.evict(blk, "device")
        s.evict(blk, "host")
        assert s.has_valid_copy(blk, "disk")
    s.fetch([a, b], "device")
    after = s.stats()["bytes_moved"]
    assert all(after[k] == before[k] for k in after)  # nothing to copy or write for empty blocks
    assert (s.read(a) == 0).all()
    s.write(b, np.full(8, 5, np.uint8), offset=8)  # writable again
    assert (s.read(b)[8:16] == 5).all() and (s.read(b)[16:] == 0).all() and (s.read(b)[:8] == 0).all()
    ts = _core.TensorStore(s)
    big, small = ts.put(np.full(BS // 4, 3, np.float32)), ts.put(np.full(4, 7, np.float32))
    other = ts.put(np.full(4, 8, np.float32))  # shares small's block
    ts.discard(big)
    ts.discard(small)
    assert (ts.get_bytes(big) == 0).all() and (ts.get_bytes(small) == 0).all()
    np.testing.assert_array_equal(ts.get_bytes(other).view(np.float32), np.full(4, 8, np.float32))


@pytest.mark.parametrize("direct_io", [True, False])
def test_uncached_io_roundtrip_and_corruption(tmp_path, direct_io):
    # drop_page_cache=True opens the disk files with O_DIRECT where the file system allows it
    # (direct_io=True), else buffered I/O with posix_fadvise(DONTNEED) after each read and write.
    s = _core.BlockStore(BS, 2 * BS, 3 * BS, str(tmp_path), drop_page_cache=True, direct_io=direct_io)
    ids = [s.allocate() for _ in range(10)]
    for i, b in enumerate(ids):
        s.write(b, block_bytes(i + 1))
    s.write(ids[0], np.full(5, 77, np.uint8), offset=100)
    s.fetch(ids[:6], "host")  # several disk-only blocks: coalesced reads
    for i, b in enumerate(ids):
        out = s.read(b)
        assert (out[:100] == i + 1).all() and (out[105:] == i + 1).all()
    assert (s.read(ids[0])[100:105] == 77).all()
    for b in ids[:4]:
        s.evict(b, "device")
        s.evict(b, "host")
    flip_disk_byte(s, ids[1], 17, 0x55)
    with pytest.raises(_core.CorruptBlockError, match=rf"corrupted block {ids[1]}"):
        s.read(ids[1])
    assert (s.read(ids[2]) == 3).all()


def test_roundtrip_across_three_tiers(tmp_path):
    s = make_store(tmp_path)
    ids = [s.allocate() for _ in range(10)]
    for i, b in enumerate(ids):
        s.write(b, block_bytes(i + 1))
    st = s.stats()
    assert st["host"]["used_blocks"] <= 3 and st["disk"]["used_blocks"] >= 7
    assert st["bytes_moved"]["host->disk"] >= 7 * BS
    for i, b in enumerate(ids):
        s.pin(b, "device")
        out = np.empty(BS, np.uint8)
        s.read_pinned_into(b, "device", out)
        assert (out == i + 1).all()
        s.unpin(b, "device")
    st = s.stats()
    assert st["device"]["peak_blocks"] <= 2 and st["host"]["peak_blocks"] <= 3
    assert st["bytes_moved"]["disk->host"] > 0 and st["bytes_moved"]["host->device"] >= 10 * BS
    # time per tier pair is counted exactly where blocks moved; the busy wall time is their union
    for pair, n in st["copies"].items():
        assert (st["copy_ns"][pair] > 0) == (n > 0), pair
    assert 0 < st["transfer_busy_ns"] <= sum(st["copy_ns"].values())


def test_spanning_and_packing(tmp_path):
    s = make_store(tmp_path, device=2, host=4)
    ts = _core.TensorStore(s)
    big = np.arange(int(3.5 * BS) // 4, dtype=np.float32)
    tb = ts.put(big)
    ext = ts.extents(tb)
    assert len(ext) == 4 and len(set(e[0] for e in ext)) == 4
    assert [e[2] for e in ext] == [BS, BS, BS, BS // 2]
    small = [np.full(50 + i, i, dtype=np.float32) for i in range(5)]
    tids = [ts.put(a) for a in small]
    blocks = {ts.blocks(t)[0] for t in tids}
    assert len(blocks) == 1  # all packed into one shared block
    offs = [ts.extents(t)[0][1] for t in tids]
    assert offs == sorted(offs) and all(o % 64 == 0 for o in offs)
    out = np.empty_like(big)
    ts.get_into(tb, out)
    np.testing.assert_array_equal(out, big)
    for t, a in zip(tids, small):
        np.testing.assert_array_equal(ts.get_bytes(t).view(np.float32), a)
    ts.update(tids[2], small[2] * 7)
    np.testing.assert_array_equal(ts.get_bytes(tids[2]).view(np.float32), small[2] * 7)
    np.testing.assert_array_equal(ts.get_bytes(tids[3]).view(np.float32), small[3])
    before = s.stats()["blocks"]
    ts.erase(tb)
    assert s.stats()["blocks"] == before - 4
    with pytest.raises(_core.StoreError, match="unknown tensor id"):
        ts.get_bytes(tb)


def test_lru_eviction_order_and_priority(tmp_path):
    s = make_store(tmp_path, device=2, host=3)
    a, b, c = (s.allocate() for _ in range(3))
    assert s.lru_order("host") == [a, b, c]
    s.read(a, 0, 8)  # a becomes most recent
    assert s.lru_order("host") == [b, c, a]
    d = s.allocate()  # evicts b (least recently used)
    assert not s.has_valid_copy(b, "host") and s.has_valid_copy(b, "disk")
    assert s.lru_order("host") == [c, a, d]
    s.set_priority(c, 5)  # keep-hint: c goes last despite being LRU
    e = s.allocate()
    assert s.has_valid_copy(c, "host") and not s.has_valid_copy(a, "host")
    assert s.lru_order("host") == [c, d, e]


def test_pinning_prevents_eviction(tmp_path):
    s = make_store(tmp_path, device=2, host=3)
    ids = [s.allocate() for _ in range(4)]
    s.pin(ids[0], "device")
    s.pin(ids[1], "device")
    assert s.pin_count(ids[0], "device") == 1
    with pytest.raises(_core.CapacityError, match="device tier full: all 2 blocks"):
        s.pin(ids[2], "device")
    assert s.evict(ids[0], "device") is False  # pinned: stays
    assert s.has_valid_copy(ids[0], "device")
    s.unpin(ids[0], "device")
    s.pin(ids[2], "device")  # now ids[0] can be evicted
    assert not s.has_valid_copy(ids[0], "device")
    assert s.has_valid_copy(ids[1], "device")
    with pytest.raises(_core.StoreError, match="not pinned"):
        s.unpin(ids[0], "device")
    with pytest.raises(_core.StoreError, match="pinned"):
        s.free(ids[1])


def test_versions_and_invalidation_of_stale_copies(tmp_path):
    s = make_store(tmp_path, device=2, host=3)
    b = s.allocate()
    v0 = s.version(b)
    assert v0 % 2 == 0
    s.write(b, block_bytes(1))
    assert s.version(b) == v0 + 2
    s.write(b, np.full(10, 9, np.uint8), offset=5)  # partial write
    assert s.version(b) == v0 + 4
    out = s.read(b)
    assert (out[5:15] == 9).all() and (out[:5] == 1).all() and (out[15:] == 1).all()
    # Put a copy in each tier, then write: the other copies become invalid.
    s.evict(b, "host")  # host -> disk
    assert s.has_valid_copy(b, "disk") and not s.has_valid_copy(b, "host")
    s.fetch([b], "device")  # disk -> host -> device
    assert s.has_valid_copy(b, "device") and s.has_valid_copy(b, "host") and s.has_valid_copy(b, "disk")
    s.write(b, block_bytes(3))
    # The write went to the host copy (the device copy was not in use) and every other copy,
    # device and disk, is invalid now.
    assert s.has_valid_copy(b, "host")
    assert not s.has_valid_copy(b, "device") and not s.has_valid_copy(b, "disk")
    s.pin(b, "device")  # a pinned device copy is the write target and stays valid
    s.write(b, block_bytes(5))
    assert s.has_valid_copy(b, "device") and not s.has_valid_copy(b, "disk")
    s.unpin(b, "device")
    s.write(b, block_bytes(3))
    s.evict(b, "device")
    s.evict(b, "host")
    assert s.has_valid_copy(b, "disk")
    assert (s.read(b) == 3).all()


def test_pinned_copy_is_written_through(tmp_path):
    s = make_store(tmp_path)
    b = s.allocate()
    s.pin(b, "device")
    s.pin(b, "host")
    s.write(b, block_bytes(4))
    for tier in ("device", "host"):
        assert s.has_valid_copy(b, tier)
        out = np.empty(BS, np.uint8)
        s.read_pinned_into(b, tier, out)
        assert (out == 4).all()
        s.unpin(b, tier)


def test_write_back_cleans_dirty_host_blocks(tmp_path):
    s = make_store(tmp_path, device=2, host=4)
    ids = [s.allocate() for _ in range(4)]
    for i, b in enumerate(ids):
        s.write(b, block_bytes(20 + i))
    assert s.write_back(10) == 2  # the older half of the pool
    assert s.has_valid_copy(ids[0], "disk") and s.has_valid_copy(ids[0], "host")
    before = s.stats()["bytes_moved"]["host->disk"]
    s.allocate()  # evicts ids[0]: clean now, so no disk write is needed
    assert s.stats()["bytes_moved"]["host->disk"] == before
    assert (s.read(ids[0]) == 20).all()


def test_corrupted_disk_block_is_detected(tmp_path):
    s = make_store(tmp_path)
    ids = [s.allocate() for _ in range(3)]
    for i, b in enumerate(ids):
        s.write(b, block_bytes(10 + i))
    s.evict(ids[1], "host")
    path, off = flip_disk_byte(s, ids[1], 1234, 0xFF)
    assert os.path.exists(path)
    with pytest.raises(_core.CorruptBlockError, match=rf"corrupted block {ids[1]}: disk copy in '.*' at offset {off}"):
        s.read(ids[1])
    assert s.stats()["crc_failures"] == 1
    # never served: still refused, other blocks unaffected
    with pytest.raises(_core.CorruptBlockError):
        s.fetch([ids[1]], "device")
    assert (s.read(ids[0]) == 10).all() and (s.read(ids[2]) == 12).all()


def test_unwritable_directory_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(_core.DiskError, match="offload directory"):
        _core.BlockStore(BS, 2 * BS, 3 * BS, str(blocker / "sub"))


def test_disk_capacity_full_loses_no_block(tmp_path):
    s = make_store(tmp_path, device=1, host=2, disk_capacity=2 * BS, blocks_per_file=1)
    ids = []
    for i in range(4):
        b = s.allocate()
        s.write(b, block_bytes(i + 1))
        ids.append(b)
    with pytest.raises(_core.DiskError, match="disk tier full"):
        s.allocate()
    # Nothing was lost: the blocks still in memory are intact, and once space is freed the
    # blocks on disk are served too.
    in_memory = [b for b in ids if s.has_valid_copy(b, "host")]
    assert len(in_memory) == 2
    for b in in_memory:
        assert (s.read(b) == ids.index(b) + 1).all()
    s.free(in_memory[-1])
    for i, b in enumerate(ids):
        if b != in_memory[-1]:
            assert (s.read(b) == i + 1).all()


def test_file_system_full_loses_no_block(tmp_path):
    # RLIMIT_FSIZE makes the kernel refuse the disk tier's file growth (EFBIG), like a full disk.
    script = textwrap.dedent(f"""
        import resource, signal, numpy as np
        from mindspore_hyper import _core
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({3 * BS}, {3 * BS}))
        s = _core.BlockStore({BS}, {BS}, {2 * BS}, {str(tmp_path)!r}, blocks_per_file=4)
        ids = []
        err = None
        for i in range(6):
            try:
                b = s.allocate()
                s.write(b, np.full({BS}, i + 1, np.uint8))
                ids.append(b)
            except _core.DiskError as e:
                err = str(e)
                break
        assert err is not None, "expected a DiskError"
        for i, b in enumerate(ids):
            assert (s.read(b) == i + 1).all(), i
        print("OK", len(ids), err)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("OK")
    assert "cannot preallocate" in out.stdout or "write of block" in out.stdout


def test_concurrent_writer_and_readers_never_see_torn_blocks(tmp_path):
    s = make_store(tmp_path, device=3, host=5)
    nb = 6
    ids = [s.allocate() for _ in range(nb)]
    words = BS // 8
    torn = []
    errors = []

    def stamp(k, n):
        return np.full(words, (k << 40) | n, dtype=np.uint64)

    def writer():
        try:
            for n in range(1, 400):
                k = n % nb
                s.write(ids[k], stamp(k, n))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    def reader(seed, pinned):
        rng = np.random.default_rng(seed)
        out = np.empty(words, np.uint64)
        try:
            for _ in range(400):
                k = int(rng.integers(nb))
                if pinned:
                    s.pin(ids[k], "device")
                    s.read_pinned_into(ids[k], "device", out)
                    s.unpin(ids[k], "device")
                else:
                    s.read_into(ids[k], out)
                if not (out == out[0]).all() or (out[0] != 0 and int(out[0]) >> 40 != k):
                    torn.append(k)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader, args=(1, False)),
               threading.Thread(target=reader, args=(2, True))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and not torn
    assert s.stats()["writes"] == 399


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_cpp_stress_program(tmp_path):
    root = str(REPO_ROOT)
    srcs = ["ccsrc/tools/store_stress.cc", *sorted(glob.glob("ccsrc/store/*.cc", root_dir=root)),
            *sorted(glob.glob("ccsrc/prefetch/*.cc", root_dir=root))]
    exe = tmp_path / "store_stress"
    subprocess.run(["g++", "-std=c++17", "-O2", "-pthread", "-Iccsrc", *srcs, "-o", str(exe)],
                   cwd=root, check=True, timeout=300)
    out = subprocess.run([str(exe), "1500", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "torn=0 errors=0" in out.stdout and "STRESS OK" in out.stdout
