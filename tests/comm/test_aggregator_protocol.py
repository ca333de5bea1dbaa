"""The aggregator's batch protocol over the shared-memory transport (ShmCommunicator's C++ aggregator,
the one the package uses): ranks that queued different numbers of requests before flushing agree on
a common batch (the negotiation's second exchange) and every request gets its exact sum, and
requests that differ across ranks fail on both ranks with CommMismatch, leaving the group usable.
Sums of small integers in float32 are exact, so results are compared for equality."""
import numpy as np
import pytest
from comm_helpers import on_both_ranks

from mindspore_hyper.comm import CommMismatch


def test_unequal_queues_agree_on_a_batch_and_every_request_gets_its_sum(shm_pair):
    def run(g):
        if g.rank == 0:  # three queued, one flush: it waits until rank 1 has queued its third
            handles = [g.all_reduce_async(np.full(4, i + 1, np.float32)) for i in range(3)]
            g.flush()
        else:  # two queued and flushed (a batch of min(3, 2) = 2), then the third
            handles = [g.all_reduce_async(np.full(4, 10 * (i + 1), np.float32)) for i in range(2)]
            g.flush()
            handles.append(g.all_reduce_async(np.full(4, 30, np.float32)))
            g.flush()
        return [h.wait(10) for h in handles]

    results = on_both_ranks(shm_pair, run)
    for res in results:
        assert not isinstance(res, Exception), res
        for i, y in enumerate(res):
            np.testing.assert_array_equal(y, np.full(4, 11 * (i + 1), np.float32))


def test_different_requests_fail_on_both_ranks_and_the_group_stays_usable(shm_pair):
    def mismatched(g):
        h = g.all_reduce_async(np.ones(4 + g.rank, np.float32))
        g.flush()
        with pytest.raises(CommMismatch, match="requests differ across ranks: this rank's batch of 1 requests holds"):
            h.wait(10)
        ok = g.all_reduce_async(np.full(2, 3 + g.rank, np.float32), "min")
        g.flush()
        return ok.wait(10)

    for res in on_both_ranks(shm_pair, mismatched):
        assert not isinstance(res, Exception), res
        np.testing.assert_array_equal(res, [3, 3])
