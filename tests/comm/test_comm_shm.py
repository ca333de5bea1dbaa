"""Shared-memory transport: every collective against numpy with 2 and 4 processes, aggregation,
faults (dead peer, stalled peer, mismatched shapes/dtypes) and /dev/shm cleanup."""
import multiprocessing as mp
import os
import signal
import struct
import subprocess
import threading
import time
import traceback
import uuid

import numpy as np
import pytest

from comm_helpers import on_both_ranks, segment_path
from shm_raw import HEADER_BYTES, PIDS_OFFSET

from mindspore_hyper.comm import CommError, CommMismatch, CommTimeout, ShmCommunicator
from mindspore_hyper.comm._common import _C
from mindspore_hyper.comm.shm import SEGMENT_PREFIX, cleanup_stale_segments

# spawn: the children must not inherit threads (MindSpore, other tests) of the pytest process
CTX = mp.get_context("spawn")
JOIN_TIMEOUT = 180  # seconds; a hang guard (spawned processes start slowly on a loaded machine)
SHM_MAGIC = 0x4D5348595045524D  # "MSHYPERM", the segment header's first 8 bytes (ccsrc/comm/shm_segment.h)


def _run(size, target, *args):
    """Run target(rank, size, name, queue, *args) in `size` processes; returns {rank: result}."""
    name = "t" + uuid.uuid4().hex[:12]
    q = CTX.Queue()
    procs = [CTX.Process(target=_entry, args=(target, r, size, name, q) + args) for r in range(size)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.time() + JOIN_TIMEOUT
    try:
        while len(results) < size and time.time() < deadline:
            try:
                rank, res = q.get(timeout=0.5)
                results[rank] = res
            except Exception:  # queue.Empty
                if all(not p.is_alive() for p in procs) and q.empty():
                    break
    finally:
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.time()))
            if p.is_alive():
                p.kill()
                p.join()
    leftovers = [f for f in os.listdir("/dev/shm") if name in f]
    return results, leftovers


def _entry(target, rank, size, name, q, *args):
    try:
        res = target(rank, size, name, *args)
    except BaseException as exc:  # report to the parent
        res = ("error", type(exc).__name__, str(exc), traceback.format_exc())
    q.put((rank, res))


def _inputs(rank, n, dtype, seed):
    rng = np.random.default_rng(seed * 1000 + rank)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-50, 50, n).astype(dtype)
    return (rng.standard_normal(n) * 3).astype(dtype)


def _close(a, ref, dtype):
    a = np.asarray(a, dtype=np.float64)
    if np.dtype(dtype).kind == "i":
        return np.array_equal(a, ref)
    if dtype == np.float16:
        return np.allclose(a, ref, rtol=1e-2, atol=0.05)
    return np.allclose(a, ref, rtol=1e-5, atol=1e-4)


def _collectives(rank, size, name):
    g = ShmCommunicator(name, rank, size, timeout=20, channel_bytes=64 << 10)
    failures = []
    for dtype in (np.float32, np.float16, np.int32):
        for n in (1, 13, 4099, 100003):  # odd sizes; 100003 streams through the 64KB rings
            xs = [_inputs(r, n, dtype, n) for r in range(size)]
            st = np.stack([x.astype(np.float64) for x in xs])
            for algo in ("ring", "ring_direct", "recursive_doubling", "auto"):
                for op in ("sum", "max", "min", "avg"):
                    y = g.all_reduce(xs[rank], op, algo)
                    ref = {"sum": st.sum(0), "max": st.max(0), "min": st.min(0), "avg": st.mean(0)}[op]
                    if np.dtype(dtype).kind == "i" and op == "avg":
                        ref = np.trunc(st.sum(0) / size)
                    if y.dtype != dtype or not _close(y, ref, dtype):
                        failures.append(f"all_reduce {algo} {op} {np.dtype(dtype).name} n={n}")
            m = np.stack([_inputs(r, 3 * n, dtype, n + 1).reshape(3, n) for r in range(size)])
            y = g.reduce_scatter(m[rank], dim=1, op="sum")
            ref = np.array_split(m.astype(np.float64).sum(0), size, axis=1)[rank]
            if y.shape != ref.shape or not _close(y, ref, dtype):
                failures.append(f"reduce_scatter {np.dtype(dtype).name} n={n}")
            rows = rank + 1  # uneven along the gather dim
            parts = [np.full((r + 1, 3), r, dtype) + _inputs(r, 3 * (r + 1), dtype, n).reshape(r + 1, 3)
                     for r in range(size)]
            y = g.all_gather(parts[rank], dim=0)
            if not np.array_equal(y, np.concatenate(parts, axis=0)) or rows != parts[rank].shape[0]:
                failures.append(f"all_gather {np.dtype(dtype).name} n={n}")
            a = np.stack([_inputs(r, 2 * n * size, dtype, n + 2).reshape(2 * size, n) for r in range(size)])
            y = g.all_to_all(a[rank], split_dim=0, concat_dim=1)
            ref = np.concatenate([np.array_split(a[r], size, axis=0)[rank] for r in range(size)], axis=1)
            if not np.array_equal(y, ref):
                failures.append(f"all_to_all {np.dtype(dtype).name} n={n}")
            for algo in ("binomial", "pipelined_chain"):
                y = g.broadcast(xs[rank], root=size - 1, algorithm=algo)
                if not np.array_equal(y, xs[size - 1]):
                    failures.append(f"broadcast {algo} {np.dtype(dtype).name} n={n}")
    # uneven all_to_all_v: rank r sends (r + j) % 3 + j elements to rank j
    counts = [[(r + j) % 3 + j for j in range(size)] for r in range(size)]
    data = [np.arange(sum(counts[r]), dtype=np.int32) + 1000 * r for r in range(size)]
    recv, rc = g.all_to_all_v(data[rank], counts[rank])
    offs = [np.cumsum([0] + counts[r]) for r in range(size)]
    ref = np.concatenate([data[r][offs[r][rank]:offs[r][rank + 1]] for r in range(size)])
    if not np.array_equal(recv, ref) or rc != [counts[r][rank] for r in range(size)]:
        failures.append("all_to_all_v")
    # send/recv around a ring, barrier
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    if rank % 2 == 0:
        g.send(np.full(7, rank, np.float32), nxt)
        got = g.recv((7,), np.float32, prv)
    else:
        got = g.recv((7,), np.float32, prv)
        g.send(np.full(7, rank, np.float32), nxt)
    if not np.array_equal(got, np.full(7, prv, np.float32)):
        failures.append("send/recv")
    g.barrier()
    # aggregation: mixed sizes, dtypes and ops, one request larger than a packet (bypass)
    g.aggregation_bytes = 4096
    reqs, refs = [], []
    for i, (n, dtype, op) in enumerate([(10, np.float32, "sum"), (999, np.int32, "max"), (3, np.float32, "sum"),
                                         (5000, np.float32, "sum"), (1, np.int32, "sum"), (700, np.float32, "avg")]):
        xs = [_inputs(r, n, dtype, 77 + i) for r in range(size)]
        st = np.stack([x.astype(np.float64) for x in xs])
        reqs.append(g.all_reduce_async(xs[rank], op))
        refs.append((dtype, {"sum": st.sum(0), "max": st.max(0), "avg": st.mean(0)}[op]))
    g.flush()
    for h, (dtype, ref) in zip(reqs, refs):
        if not _close(h.wait(), ref, dtype):
            failures.append("aggregated all_reduce")
    stats = g.aggregator_stats()
    # a request without flush is still sent after the bounded delay
    late = g.all_reduce_async(np.full(4, rank + 1, np.float32))
    if not np.array_equal(late.wait(timeout=10), np.full(4, size * (size + 1) / 2, np.float32)):
        failures.append("delayed packet")
    params = g.calibrate(repeats=5)
    calib = (params.alpha_s, params.beta_s_per_byte, params.gamma_s_per_byte, g.model.params.alpha_s)
    g.close()
    return failures, stats, calib


@pytest.mark.parametrize("size", [2, 4])
def test_shm_collectives_match_numpy(size):
    results, leftovers = _run(size, _collectives)
    assert sorted(results) == list(range(size)), results
    for rank, res in results.items():
        assert res[0] != "error", res
        failures, stats, calib = res
        assert failures == [], (rank, failures)
        # calibrate(): positive costs, the maximum over ranks, so every rank models alike
        assert all(v > 0 for v in calib) and calib[0] == calib[3]
        assert calib == results[0][2]
        assert stats["requests"] == 6 and stats["bypassed"] == 1  # the 20000-byte request
        assert stats["packets"] >= 3  # float32/sum, int32/max, int32/sum, float32/avg packets
    assert leftovers == []


def _killed_peer(rank, size, name, direct):
    g = ShmCommunicator(name, rank, size, timeout=5, channel_bytes=64 << 10)
    if not direct:
        g.direct_min_bytes = -1  # the channel ring instead of single-copy direct reads
    x = np.ones(4 << 20, np.float32)  # 16MB: many ring chunks through 64KB channels
    g.all_reduce(x)
    if rank == 1:
        threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    start = time.time()
    try:
        for _ in range(10000):
            g.all_reduce(x, algorithm="ring")
    except CommTimeout as exc:
        return ("timeout", str(exc), time.time() - start)
    return ("no error", "", 0.0)


@pytest.mark.parametrize("size,direct", [(2, True), (4, True), (2, False)])
def test_dead_peer_gives_timeout_and_no_leftovers(size, direct):
    results, leftovers = _run(size, _killed_peer, direct)
    assert 1 not in results  # killed
    assert sorted(results) == [r for r in range(size) if r != 1]
    for rank, (kind, msg, _) in results.items():
        assert kind == "timeout", results[rank]
        # the neighbour of the dead rank sees it die; the others fail fast through the group's abort flag
        assert "rank 1 died" in msg, msg
    assert leftovers == []


def _stalled_peer(rank, size, name):
    g = ShmCommunicator(name, rank, size, timeout=JOIN_TIMEOUT)  # both attach, however slow the start
    g.timeout = 1.0  # then rank 0 waits at most 1 s in the collective
    if rank == 1:
        time.sleep(4)  # never joins the collective within rank 0's timeout
        return ("slept", "")
    try:
        g.all_reduce(np.ones(10, np.float32))
    except CommTimeout as exc:
        return ("timeout", str(exc))
    return ("no error", "")


def test_stalled_peer_gives_timeout():
    results, leftovers = _run(2, _stalled_peer)
    assert results[0][0] == "timeout", results
    assert "timed out after" in results[0][1] and "rank 1" in results[0][1]
    assert leftovers == []


def _mismatch(rank, size, name):
    g = ShmCommunicator(name, rank, size, timeout=10)
    out = []
    try:
        g.all_reduce(np.ones(10 + rank, np.float32))
    except CommMismatch as exc:
        out.append(str(exc))
    try:
        g.all_reduce(np.ones(10, np.float32 if rank == 0 else np.int32))
    except CommMismatch as exc:
        out.append(str(exc))
    try:
        g.all_to_all(np.ones((size * (2 + rank), 3), np.float32))
    except CommMismatch as exc:
        out.append(str(exc))
    # the group is still usable afterwards
    y = g.all_reduce(np.full(3, rank, np.int32))
    out.append(y.tolist())
    return out


def test_mismatched_shapes_and_dtypes_error_naming_both():
    results, leftovers = _run(2, _mismatch)
    for rank in (0, 1):
        res = results[rank]
        assert res[0] != "error", res
        assert "rank 0 calls all_reduce(float32, 10 elements, op sum)" in res[0]
        assert "rank 1 calls all_reduce(float32, 11 elements, op sum)" in res[0]
        assert "float32" in res[1] and "int32" in res[1]
        assert "rank 0 calls all_to_all(float32, 12 elements) but rank 1 calls all_to_all(float32, 18 elements)" in res[2]
        assert res[3] == [1, 1, 1]
    assert leftovers == []


def _crash_before_attach(rank, size, name):
    if rank == 1:
        os._exit(3)  # never attaches
    try:
        ShmCommunicator(name, rank, size, timeout=1.0)
    except CommTimeout as exc:
        return ("timeout", str(exc))
    return ("no error", "")


def test_rank_missing_at_setup_times_out_without_leftovers():
    results, leftovers = _run(2, _crash_before_attach)
    assert results[0][0] == "timeout" and "attached" in results[0][1]
    assert leftovers == []
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(SEGMENT_PREFIX + "t")]


def _create_and_wait(name):
    ShmCommunicator(name, 0, 2, timeout=60.0)  # waits for a rank 1 that never comes


def _files_of(segment: str) -> list:
    """The /dev/shm names of a segment: its final name and rank 0's creation temporaries."""
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith(segment))


def test_segment_of_a_creator_killed_before_anyone_attached_is_removed_by_the_next_group():
    name = "t" + uuid.uuid4().hex[:12]
    path = segment_path(name)
    segment = os.path.basename(path)
    creator = CTX.Process(target=_create_and_wait, args=(name,))
    creator.start()
    deadline = time.time() + JOIN_TIMEOUT
    while not _files_of(segment) and time.time() < deadline:
        time.sleep(0.001)
    os.kill(creator.pid, signal.SIGKILL)  # rank 0 dies while the group forms, wherever it is in the creation
    creator.join(timeout=JOIN_TIMEOUT)
    left = _files_of(segment)
    assert left, "nothing of the creator's segment showed up in /dev/shm"  # left behind: nobody else knew of it
    if os.path.exists(path):  # the final name is never published without its header
        with open(path, "rb") as f:
            assert struct.unpack("<Q", f.read(8))[0] == SHM_MAGIC
    fresh = ShmCommunicator("t" + uuid.uuid4().hex[:12], 0, 1, timeout=5.0)  # any new group's rank 0 cleans up
    fresh.close()
    assert _files_of(segment) == [], left


def _make_segment_file(name: str, header_pid: int = 0) -> str:
    """Create /dev/shm/`name` (mode 0600) as a crashed creator leaves it: blank (size 0), or a
    header with the magic and rank 0's pid `header_pid`. Its path."""
    path = "/dev/shm/" + name
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.fchmod(fd, 0o600)
        if header_pid:
            os.ftruncate(fd, HEADER_BYTES)
            os.pwrite(fd, struct.pack("<Q", SHM_MAGIC), 0)
            os.pwrite(fd, struct.pack("<i", header_pid), PIDS_OFFSET)
    finally:
        os.close(fd)
    return path


def _held_by_this_process(path_prefix: str) -> list:
    """This process's open descriptors and mappings of files whose path starts with `path_prefix`."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the descriptor listdir itself used
            continue
        if target.startswith(path_prefix):
            held.append(target)
    with open("/proc/self/maps") as maps:
        held += [line.split(None, 5)[-1].strip() for line in maps if path_prefix in line]
    return held


def test_dead_creators_temporaries_and_old_blank_segments_are_removed_live_ones_kept():
    exited = subprocess.Popen(["true"])
    exited.wait()
    dead = exited.pid  # a process that has exited and been reaped
    group = "t" + uuid.uuid4().hex[:12]
    blank = segment_path(group)  # what an older version left when its rank 0 died before the header
    base = os.path.basename(blank)
    made = {
        "dead blank temporary": _make_segment_file(f"{base}a.{dead}.0.init"),
        "dead temporary, dead pid in its header": _make_segment_file(f"{base}b.{dead}.1.init", header_pid=dead),
        "live temporary": _make_segment_file(f"{base}c.{os.getpid()}.7.init"),
        "dead pid in the name, live one in the header": _make_segment_file(f"{base}d.{dead}.2.init",
                                                                             header_pid=os.getpid()),
        "young blank segment": _make_segment_file(base),
    }
    try:
        with pytest.raises(CommError, match="blank_age_s must be >= 0 seconds"):
            cleanup_stale_segments(base, blank_age_s=-1.0)
        assert cleanup_stale_segments(base, blank_age_s=60.0) == 2
        assert {what: os.path.exists(path) for what, path in made.items()} == {
            "dead blank temporary": False, "dead temporary, dead pid in its header": False, "live temporary": True,
            "dead pid in the name, live one in the header": True, "young blank segment": True}
        # the next group of that name: refused while the blank segment may still be an older version's
        # creation in progress, naming why; its own temporary is gone with the refusal
        with pytest.raises(CommError, match=f"segment /{base} already exists and is blank \\(no header"):
            ShmCommunicator(group, 0, 1, timeout=60.0)
        assert not [f for f in _files_of(base) if f.startswith(base + ".")]
        assert _held_by_this_process("/dev/shm/" + base + ".") == []  # nor its descriptor or mapping
        time.sleep(0.3)  # the segment's ctime (kernel clock, never ahead of now) is now >= 0.3 s old
        # older than the group timeout: rank 0 removes it and forms the group (size 1: it unlinks its name
        # at once); the C++ group directly, so that not the Python side's cleanup_stale_segments removes it
        formed = _C.ShmCommunicator(base, 0, 1, 4096, 0.25)
        assert formed.size == 1 and formed.segment_name == "/" + base
        del formed
        assert not os.path.exists(blank)
        assert [os.path.basename(made[k]) for k in ("live temporary", "dead pid in the name, live one in the header")
                ] == _files_of(base)
    finally:
        for path in made.values():
            if os.path.exists(path):
                os.unlink(path)


def test_a_name_shaped_like_a_creation_temporary_is_refused():
    with pytest.raises(CommError, match=r"segment name 'mshyper_x\.5\.0\.init' ends like a creation temporary"):
        _C.ShmCommunicator("mshyper_x.5.0.init", 0, 1, 4096, 1.0)


def test_bfloat16_reduces_in_float32_and_moves_as_bytes(shm_pair):
    """The library has no bfloat16 kernels: a bfloat16 sum is taken in float32 and rounded to
    bfloat16 once (numpy's ml_dtypes rounding, to nearest even), gathers and broadcasts copy the
    bytes; a bfloat16 comes back."""
    import mindspore as ms
    from mindspore import Tensor

    bf16 = Tensor(np.zeros(1, np.float32), dtype=ms.bfloat16).asnumpy().dtype  # what MindSpore's asnumpy gives
    rng = np.random.default_rng(3)
    parts = [rng.standard_normal((3, 5)).astype(np.float32).astype(bf16) for _ in range(2)]
    exact = (parts[0].astype(np.float32) + parts[1].astype(np.float32)).astype(bf16)  # exact in float32, rounded once
    reduced = on_both_ranks(shm_pair, lambda g: g.all_reduce(parts[g.rank]))
    gathered = on_both_ranks(shm_pair, lambda g: g.all_gather(parts[g.rank], dim=1))
    scattered = on_both_ranks(shm_pair, lambda g: g.reduce_scatter(parts[g.rank], dim=0))
    sent = on_both_ranks(shm_pair, lambda g: g.broadcast(parts[g.rank], root=1))
    for rank in range(2):
        assert reduced[rank].dtype == bf16 and np.array_equal(reduced[rank].view(np.uint16), exact.view(np.uint16))
        assert np.array_equal(gathered[rank].view(np.uint16), np.concatenate(parts, 1).view(np.uint16))
        assert np.array_equal(scattered[rank].view(np.uint16), np.array_split(exact, 2, 0)[rank].view(np.uint16))
        assert np.array_equal(sent[rank].view(np.uint16), parts[1].view(np.uint16))
