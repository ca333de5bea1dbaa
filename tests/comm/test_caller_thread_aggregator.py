"""The MindSpore transport's aggregator (comm/caller_thread_aggregator.py), in one process over a
fake group: requests wait until a flush, which packs them per (dtype, op) into packets of at most
`packet_bytes` on the calling thread (no other thread ever calls the group), compares the ranks'
queues first, and reduces exactly (the fake group's members hold integer-valued data: every sum
is exact in float32, so results are compared for equality)."""
import threading

import numpy as np
import pytest

from mindspore_hyper.comm import CommError, CommMismatch
from mindspore_hyper.comm.caller_thread_aggregator import CallerThreadAggregator


class FakeGroup:
    """`size` members whose other members hold `others_factor` times this member's data; records
    each call (op, element count, thread). `peer_digest` replaces the others' queue digest."""

    def __init__(self, size=2, peer_digest=None):
        self.size, self.peer_digest, self.calls = size, peer_digest, []

    def __call__(self, array, op):
        self.calls.append((op, array.size, threading.current_thread().name))
        if len(self.calls) == 1 and array.dtype == np.int32 and array.size == 6 and self.peer_digest is not None:
            np.maximum(array, self.peer_digest, out=array)  # the batch's queue comparison
            return
        if op == "sum":
            array *= self.size  # every member holds the same data
        # max / min of equal data: unchanged


def test_requests_wait_for_flush_and_are_packed_on_the_calling_thread():
    group = FakeGroup()
    agg = CallerThreadAggregator(group, 2, packet_bytes=64, what="test group")
    sizes = [3, 10, 5, 40]  # float32: 12 B, 40 B | 20 B (12+40+20 > 64); 160 B > 64 B bypasses
    handles = [agg.submit(np.arange(n, dtype=np.float32) + i, "sum") for i, n in enumerate(sizes)]
    ints = agg.submit(np.full((2, 3), 7, np.int32), "max")
    assert group.calls == [] and not handles[0].done()  # nothing is sent before a flush
    for i, (n, h) in enumerate(zip(sizes, handles)):
        np.testing.assert_array_equal(h.wait(), 2 * (np.arange(n, dtype=np.float32) + i))
    np.testing.assert_array_equal(ints.wait(), np.full((2, 3), 7, np.int32))  # shape kept
    # in queue order: the queue comparison, the packet [3, 10] (full when 5 comes), the bypassed
    # 40, then the open packets [5] (float32) and [6] (int32)
    assert [(op, n) for op, n, _ in group.calls] == [("max", 6), ("sum", 13), ("sum", 40), ("sum", 5), ("max", 6)]
    assert {thread for _, _, thread in group.calls} == {threading.current_thread().name}
    assert agg.stats() == {"requests": 5, "packets": 3, "in_place": 0, "bypassed": 1, "batches": 1,
                           "bytes": 4 * (3 + 10 + 5 + 40) + 4 * 6}


def test_average_of_a_batch_and_truncated_integer_average():
    agg = CallerThreadAggregator(FakeGroup(size=4), 4, packet_bytes=1024, what="test group")
    handle = agg.submit_many([np.full(3, 1.5, np.float32), np.array([1, 2, 3], np.int32)], "avg")
    agg.flush()
    floats, ints = handle.wait()
    np.testing.assert_array_equal(floats, np.full(3, 1.5, np.float32))  # (4 * 1.5) / 4
    np.testing.assert_array_equal(ints, np.array([1, 2, 3], np.int32))  # trunc(4 * x / 4)
    assert len(handle) == 2 and handle.done()


def test_ranks_with_different_queues_fail_with_mismatch_not_a_wrong_sum():
    # a peer that queued 2 requests where this rank queued 1: its digest has length 2
    peer = np.array([2, -1, 0, 0, 0, 0], np.int32)
    agg = CallerThreadAggregator(FakeGroup(peer_digest=peer), 2, packet_bytes=1024, what="test group")
    handle = agg.submit(np.ones(4, np.float32), "sum")
    with pytest.raises(CommMismatch, match=r"test group: the ranks queued different all_reduce_async requests.*"
                                           r"queue lengths 1\.\.2, this rank 1"):
        agg.flush()
    with pytest.raises(CommMismatch):
        handle.wait()


def test_a_failing_collective_fails_its_requests_with_comm_error():
    def broken(array, op):
        raise RuntimeError("AllReduce failed.")

    agg = CallerThreadAggregator(broken, 2, packet_bytes=1024, what="test group")
    handle = agg.submit(np.ones(4, np.float32), "sum")
    with pytest.raises(CommError, match="test group: AllReduce failed"):
        handle.wait()
    with pytest.raises(CommError, match="AllReduce failed"):
        handle.wait()  # the failure stays with the handle


def test_close_fails_queued_requests_and_refuses_later_use():
    agg = CallerThreadAggregator(FakeGroup(), 2, packet_bytes=1024, what="test group")
    handle = agg.submit(np.ones(4, np.float32), "sum")
    agg.close()
    with pytest.raises(CommError, match="test group was closed with this request queued"):
        handle.wait()
    with pytest.raises(CommError, match="test group is closed: all_reduce_async"):
        agg.submit(np.ones(2, np.float32), "sum")
    with pytest.raises(CommError, match="test group is closed: flush"):
        agg.flush()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match=r"packet_bytes=0: expected a positive number of bytes"):
        CallerThreadAggregator(FakeGroup(), 2, packet_bytes=0, what="test group")
    agg = CallerThreadAggregator(FakeGroup(), 2, packet_bytes=1024, what="test group")
    with pytest.raises(TypeError, match="dtype complex64 is not supported"):
        agg.submit(np.ones(2, np.complex64), "sum")
