"""The aggregator's batch protocol, observed through a two-rank fake transport in Python: one
negotiation exchange when both ranks queued alike, a second one (the digests of the first m
requests) when they did not, in-place packets for a batched submission, and CommMismatch when
the requests differ."""
import threading

import numpy as np
import pytest
from comm_helpers import on_both_ranks

from mindspore_hyper.comm import CommMismatch
from mindspore_hyper.comm._common import _C

REDUCE = {"sum": np.add, "max": np.maximum, "min": np.minimum}


class TwoRankTransport:
    """All-reduce between two Python callbacks (one per rank) that meet at a barrier."""

    def __init__(self):
        self.barrier = threading.Barrier(2)
        self.slots = [None, None]
        self.result = None
        self.calls = [[], []]

    def callback(self, rank):
        def all_reduce(buf, dtype, op):
            arr = buf.view(dtype)
            self.calls[rank].append((dtype, arr.size))
            self.slots[rank] = arr
            self.barrier.wait(10)
            if rank == 0:
                self.result = REDUCE[op](self.slots[0], self.slots[1])
            self.barrier.wait(10)
            arr[...] = self.result
            self.barrier.wait(10)

        return all_reduce


@pytest.fixture
def pair():
    t = TwoRankTransport()
    aggs = [_C.python_aggregator(t.callback(r), 2, 4096, 3600.0) for r in range(2)]  # sent on flush only
    yield t, aggs
    for a in aggs:
        a.close()


def _flush_both(aggs):
    for res in on_both_ranks(aggs, lambda a: a.flush()):
        assert not isinstance(res, Exception), res


def test_unequal_queues_take_a_second_exchange_equal_ones_do_not(pair):
    t, aggs = pair
    h0 = [aggs[0].submit(np.full(4, i + 1, np.float32), "sum") for i in range(3)]
    h1 = [aggs[1].submit(np.full(4, 10 * (i + 1), np.float32), "sum") for i in range(2)]
    flush0 = threading.Thread(target=aggs[0].flush)  # waits for all 3, until rank 1 has sent its third
    flush0.start()
    aggs[1].flush()
    # batch of min(3, 2) = 2: the lengths differed, so the digests of those 2 went in a second exchange
    assert t.calls[1] == [("int64", 6), ("int64", 4), ("float32", 8)]
    np.testing.assert_array_equal(h1[1].wait(1), np.full(4, 22, np.float32))
    h1.append(aggs[1].submit(np.full(4, 30, np.float32), "sum"))
    aggs[1].flush()
    flush0.join(30)
    assert not flush0.is_alive()
    # then one request queued on each rank: one exchange carried the lengths and the digests
    assert t.calls[0] == t.calls[1] == [("int64", 6), ("int64", 4), ("float32", 8), ("int64", 6), ("float32", 4)]
    for i, h in enumerate(h0):
        np.testing.assert_array_equal(h.wait(1), np.full(4, 11 * (i + 1), np.float32))
    np.testing.assert_array_equal(h1[2].wait(1), np.full(4, 33, np.float32))


def test_batched_submission_is_one_in_place_packet(pair):
    t, aggs = pair
    hs = [a.submit_many([np.full(8, r + i, np.int32) for i in range(5)], "max") for r, a in enumerate(aggs)]
    _flush_both(aggs)
    assert t.calls[0] == [("int64", 6), ("int32", 40)]
    for r in range(2):
        for i, y in enumerate(hs[r].wait(1)):
            np.testing.assert_array_equal(y, np.full(8, 1 + i, np.int32))
    assert aggs[0].stats()["in_place"] == 1 and aggs[0].stats()["packets"] == 1


def test_different_requests_fail_on_both_ranks_after_one_exchange(pair):
    t, aggs = pair
    hs = [aggs[0].submit(np.ones(4, np.float32), "sum"), aggs[1].submit(np.ones(5, np.float32), "sum")]
    _flush_both(aggs)
    assert t.calls[0] == t.calls[1] == [("int64", 6)]
    for h in hs:
        with pytest.raises(CommMismatch, match="requests differ across ranks: this rank's batch of 1 requests holds"):
            h.wait(1)
    # the group stays usable
    ok = [a.submit(np.full(2, 3, np.float32), "min") for a in aggs]
    _flush_both(aggs)
    for h in ok:
        np.testing.assert_array_equal(h.wait(1), [3, 3])
