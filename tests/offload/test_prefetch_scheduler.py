"""Prefetch scheduler: trace recording, prediction from trace + position, async prefetch hits,
invalidation on a changed order with on-demand fallback, coalesced disk reads, statistics."""
import os
import sys
import time

import numpy as np
import pytest

from mindspore_hyper import _core

BS = 4096


@pytest.fixture
def store(tmp_path):
    s = _core.BlockStore(BS, 4 * BS, 6 * BS, str(tmp_path), blocks_per_file=16)
    ids = [s.allocate() for _ in range(8)]
    for i, b in enumerate(ids):
        s.write(b, np.full(BS, i + 1, np.uint8))
    for b in ids:  # everything starts on disk
        s.evict(b, "host")
    return s, ids


def run_step(sched, order, drain=True):
    sched.begin_step()
    if drain:
        sched.drain()
    for b in order:
        sched.acquire([b])
        sched.release([b])
        if drain:
            sched.drain()  # let the worker finish the window: makes hits deterministic


def test_trace_recording_and_prediction(store):
    s, ids = store
    sched = _core.PrefetchScheduler(s, depth=2, workers=1)
    assert sched.predict(3) == []  # nothing recorded yet
    run_step(sched, ids)
    assert sched.trace() == []  # the first step is recorded, becomes the trace at the boundary
    sched.begin_step()
    assert sched.trace() == ids
    assert sched.predict(3) == ids[:3]
    sched.acquire([ids[0]])
    sched.release([ids[0]])
    assert sched.position() == 1
    assert sched.predict(3) == ids[1:4]
    for b in ids[1:]:
        sched.acquire([b])
        sched.release([b])
    assert sched.predict(2) == ids[:2]  # wraps into the next step
    sched.drain()


def test_prefetch_turns_misses_into_hits(store):
    s, ids = store
    sched = _core.PrefetchScheduler(s, depth=2, workers=2)
    run_step(sched, ids)
    first = sched.stats()
    assert first["misses"] == len(ids) and first["hits"] == 0
    sched.reset_stats()
    run_step(sched, ids)
    run_step(sched, ids)
    st = sched.stats()
    # After the trace exists every block was prefetched before it was needed.
    assert st["hits"] == 2 * len(ids) and st["misses"] == 0 and st["late"] == 0
    assert st["issued"] >= len(ids) and st["completed"] == st["issued"] - st["cancelled"]
    assert st["trace_valid"] and st["trace_length"] == len(ids)
    bytes_moved = s.stats()["bytes_moved"]
    assert bytes_moved["disk->host"] > 0 and bytes_moved["host->device"] > 0
    assert s.stats()["device"]["peak_blocks"] <= 4


def test_changed_order_invalidates_trace_and_falls_back(store):
    s, ids = store
    sched = _core.PrefetchScheduler(s, depth=2, workers=1)
    run_step(sched, ids)
    run_step(sched, ids)
    sched.reset_stats()
    new_order = ids[:3] + ids[3:][::-1]
    run_step(sched, new_order)
    st = sched.stats()
    assert st["trace_invalidations"] == 1 and not st["trace_valid"]
    assert st["misses"] >= 1  # the unexpected access was served on demand
    sched.begin_step()
    assert sched.trace() == new_order  # re-recorded from the changed step
    assert sched.predict(2) == new_order[:2]
    sched.reset_stats()
    sched.drain()
    for b in new_order:
        sched.acquire([b])
        sched.release([b])
        sched.drain()
    st = sched.stats()
    assert st["hits"] == len(ids) and st["trace_invalidations"] == 1


def test_data_served_through_scheduler_is_correct(store):
    s, ids = store
    sched = _core.PrefetchScheduler(s, depth=3, workers=2)
    out = np.empty(BS, np.uint8)
    for _ in range(3):
        sched.begin_step()
        for i, b in enumerate(ids):
            sched.acquire([b])
            s.read_pinned_into(b, "device", out)
            assert (out == i + 1).all()
            sched.release([b])
    sched.drain()
    assert s.stats()["device"]["peak_blocks"] <= 4


def test_adjacent_disk_reads_are_coalesced(store):
    s, ids = store
    before = s.stats()["coalesced_reads"]
    s.fetch(ids[:4], "host")
    st = s.stats()
    assert st["coalesced_reads"] > before
    for i, b in enumerate(ids[:4]):
        assert s.has_valid_copy(b, "host")
        assert (s.read(b) == i + 1).all()


def test_depth_is_adjustable(store):
    s, _ = store
    sched = _core.PrefetchScheduler(s, depth=2)
    sched.depth = 5
    assert sched.depth == 5
    with pytest.raises(_core.StoreError):
        sched.depth = -1


def test_freed_block_in_trace_is_skipped(store):
    s, ids = store
    sched = _core.PrefetchScheduler(s, depth=3, workers=1)
    run_step(sched, ids[:4])
    s.free(ids[2])  # e.g. an activation slot replaced by one of another shape
    sched.begin_step()  # issues the window, which contains the freed block: no error
    sched.drain()
    for b in (ids[0], ids[1]):
        sched.acquire([b])
        sched.release([b])
    sched.drain()
    assert sched.stats()["trace_valid"]


def test_prefetches_are_issued_soonest_needed_first(store):
    s, ids = store
    sched = _core.PrefetchScheduler(s, depth=3, workers=1, max_batch=1)
    run_step(sched, ids)
    for b in ids:  # empty the device tier so the next window's fetch order is visible
        s.evict(b, "device")
    sched.begin_step()  # window: ids[0], ids[1], ids[2], fetched one at a time by one worker
    sched.drain()
    order = s.lru_order("device")  # least recently fetched first
    assert order == ids[:3]


def test_acquire_is_all_or_nothing(store):
    # 5 blocks do not fit the 4 device slots: the error leaves none of them pinned, so the caller
    # can make room and retry (the offload hooks do) without leaking pins.
    s, ids = store
    sched = _core.PrefetchScheduler(s, depth=0, workers=1)
    with pytest.raises(_core.CapacityError, match="device tier full"):
        sched.acquire(ids[:5])
    sched.acquire(ids[4:8])  # four other blocks: only possible if no slot was left pinned
    sched.release(ids[4:8])
    sched.drain()


def os_threads():
    """{thread id: (name, nice)} of this process's live threads, from /proc (Linux)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except (FileNotFoundError, ProcessLookupError):  # the thread ended after the listing
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (stat[stat.index("(") + 1:stat.rindex(")")], int(fields[16]))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread priorities are set on Linux only")
def test_workers_run_as_named_background_threads(store):
    s, ids = store
    before = set(os_threads())
    sched = _core.PrefetchScheduler(s, depth=2, workers=2, worker_nice=7)
    run_step(sched, ids[:3])
    deadline = time.monotonic() + 30  # a worker names itself when its thread starts running
    while True:
        new = sorted(v for tid, v in os_threads().items() if tid not in before)
        if new == [("mshyper-io", 7), ("mshyper-io", 7)] or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert new == [("mshyper-io", 7), ("mshyper-io", 7)]
    assert _core.current_thread_nice() == 0  # the caller's own priority is untouched
    del sched


def test_bad_worker_nice_is_refused(store):
    s, _ = store
    for nice in (-1, 20):
        with pytest.raises(_core.StoreError, match=r"worker_nice must be in 0\.\.19, got " + str(nice)):
            _core.PrefetchScheduler(s, depth=2, worker_nice=nice)
    with pytest.raises(ValueError, match="worker_nice must be in 0..19, got 25"):
        _core.make_background_thread("x", 25)
