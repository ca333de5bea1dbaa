"""The asynchronous ring shift of the process collectives (`ring_shift_async`) on a two-rank
shared-memory group in this process: each rank's `ProcessCollectives` posts, the sender threads
move the bytes, the waits (in this thread) give the neighbour's tensors, timed per phase."""
import numpy as np
import pytest
from mindspore import Tensor

from mindspore_hyper.comm import CommError, CommTimeout
from mindspore_hyper.comm.collectives import AxisGroup
from mindspore_hyper.comm.process_collectives import ProcessCollectives
from mindspore_hyper.comm.ring_shift_async import RingShiftTiming, hidden_fraction

from comm_helpers import shm_group_pair


def _pair(timeout: float = 10.0):
    comms = shm_group_pair(timeout=timeout)
    collectives = [ProcessCollectives(lambda ranks, c=c: c) for c in comms]
    groups = [AxisGroup("cp", (0, 1), (r,)) for r in range(2)]
    return comms, collectives, groups


def test_values_arrive_from_the_ring_neighbour_in_posting_order():
    comms, pcs, groups = _pair()
    try:
        rng = np.random.default_rng(0)
        sent = [[rng.standard_normal((3, 4)).astype(np.float32), np.arange(5, dtype=np.int32) + 10 * r,
                 np.array([r == 0, True, False])] for r in range(2)]
        posts = [[pcs[r].ring_shift_async([Tensor(a) for a in sent[r]], groups[r]),
                  pcs[r].ring_shift_async([Tensor(sent[r][0] * 2)], groups[r], phase="backward")] for r in range(2)]
        for r in range(2):  # two handles posted on each rank before any wait: they arrive in order
            first, second = posts[r][0].wait(), posts[r][1].wait()
            other = sent[1 - r]
            assert len(first) == 3 and len(second) == 1
            for got, want in zip(first, other):
                np.testing.assert_array_equal(got.asnumpy(), want)
            assert first[2].asnumpy().dtype == np.bool_
            np.testing.assert_array_equal(second[0].asnumpy(), other[0] * 2)
            assert posts[r][0].wait() is first  # waiting again returns the same tensors
            assert posts[r][0].done()
        for r in range(2):
            assert len(pcs[r].ring_timings) == 2
            assert all(t.transfer_s >= 0 and t.wait_s >= 0 for t in pcs[r].ring_timings)
            assert pcs[r].ring_timings[0].nbytes == sum(a.nbytes for a in sent[r])
            assert [t.phase for t in pcs[r].ring_timings] == ["forward", "backward"]
    finally:
        for c in comms:
            c.close()


def test_a_one_member_group_returns_the_tensors_without_moving_them():
    pc = ProcessCollectives(lambda ranks: pytest.fail("a one-member group needs no communicator"))
    x = Tensor(np.ones(3, np.float32))
    assert pc.ring_shift_async([x], AxisGroup("cp", (4,), (0,))).wait() == [x]


def test_a_transfer_error_surfaces_on_wait():
    comms, pcs, groups = _pair(timeout=2.0)
    try:
        h0 = pcs[0].ring_shift_async([Tensor(np.zeros(2, np.float32))], groups[0])
        h1 = pcs[1].ring_shift_async([Tensor(np.zeros(3, np.float32))], groups[1])  # shapes differ
        with pytest.raises(CommError, match="ring recv over mesh axis 'cp'"):
            h1.wait()  # rank 1 receives first: the mismatch
        with pytest.raises(CommError, match="rank 0"):
            h0.wait()  # rank 0's receive never gets rank 1's message: the communicator's timeout
    finally:
        for c in comms:
            c.close()


def test_a_wait_timeout_fails_and_aborts_the_group_instead_of_hanging():
    comms, pcs, groups = _pair(timeout=60.0)
    try:
        h0 = pcs[0].ring_shift_async([Tensor(np.zeros(2, np.float32))], groups[0])  # rank 1 never posts
        with pytest.raises(CommTimeout, match=r"ring_shift_async over mesh axis 'cp'.*wait\(timeout=0.2\)"):
            h0.wait(timeout=0.2)
        np.testing.assert_array_equal(comms[1].recv((2,), np.float32, 0), np.zeros(2))  # sent before the abort
        with pytest.raises(CommError, match="did not complete within wait"):  # the group is aborted: rank 1
            comms[1].recv((2,), np.float32, 0)                                # fails fast too
        with pytest.raises(CommError):  # and the stuck transfer ended with the abort
            h0.wait()
    finally:
        for c in comms:
            c.close()


def test_hidden_fraction_is_the_share_of_transfer_time_not_waited_for():
    timings = [RingShiftTiming(2.0, 0.5, 8), RingShiftTiming(2.0, 0.0, 8)]
    assert hidden_fraction(timings) == pytest.approx(1 - 0.5 / 4.0)
    with pytest.raises(ValueError, match="timings is empty"):
        hidden_fraction([])


def test_ring_shift_async_refuses_a_process_with_two_members():
    pc = ProcessCollectives(lambda ranks: None)
    with pytest.raises(ValueError, match="ring_shift_async: a process holds exactly one member"):
        pc.ring_shift_async([Tensor(np.ones(1, np.float32))], AxisGroup("cp", (0, 1), (0, 1)))
