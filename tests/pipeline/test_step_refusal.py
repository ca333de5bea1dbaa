"""A pipeline step's refusal on one rank raised on every rank (pipeline/step_refusal.py): the
agreement before any transfer (two ranks as threads over an in-test all-gather), and the
refusal sent in place of an owed tensor over the ShmTransport (both ends in this process)."""
import threading

import numpy as np
import pytest
from mindspore import Tensor

from mindspore_hyper.pipeline.step_refusal import agree, rebuild
from shm_transport_pair import transport_pair
from mindspore_hyper.schedule.actions import P2PTensor, Payload


@pytest.fixture
def transports():
    yield from transport_pair("pr", 5.0)


class ThreadGather:
    """`all_gather(array, dim=0)` among `n` threads (each passes one rank's array)."""

    def __init__(self, n: int):
        self.n, self.parts, self.barrier = n, {}, threading.Barrier(n, timeout=30)

    def for_rank(self, rank: int):
        gather = self

        class _One:
            def all_gather(self, array, dim=0):
                assert dim == 0
                gather.barrier.wait()
                gather.parts[rank] = np.asarray(array)
                gather.barrier.wait()
                out = np.concatenate([gather.parts[r] for r in range(gather.n)], axis=0)
                gather.barrier.wait()
                return out

        return _One()


def run_ranks(checks):
    """`agree(checks[r], ...)` on one thread per rank: each rank's result or exception."""
    gather, results = ThreadGather(len(checks)), {}

    def one(rank):
        try:
            results[rank] = agree(checks[rank], gather.for_rank(rank), rank)
        except Exception as exc:  # noqa: BLE001 -- compared by the test
            results[rank] = exc

    threads = [threading.Thread(target=one, args=(r,)) for r in range(len(checks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def refuse(exc):
    def check():
        raise exc
    return check


def test_every_rank_passes_its_result_when_all_checks_pass():
    assert run_ranks([lambda: "a", lambda: "b", lambda: "c"]) == {0: "a", 1: "b", 2: "c"}


def test_a_check_failing_on_one_rank_raises_its_class_and_message_on_every_rank():
    mine = ValueError("run(): micro_batch_num=4 does not divide input 0's batch dimension 0 (size 6)")
    results = run_ranks([lambda: 1, refuse(mine), lambda: 3])
    assert results[1] is mine  # the refusing rank raises its own exception
    for rank in (0, 2):
        assert type(results[rank]) is ValueError
        assert str(results[rank]) == f"pipeline step refused on job rank 1: ValueError: {mine}"


def test_the_lowest_failing_rank_is_named_where_several_fail():
    results = run_ranks([lambda: 1, refuse(TypeError("bad type")), refuse(ValueError("longer message here"))])
    assert type(results[0]) is TypeError and str(results[0]) == "pipeline step refused on job rank 1: TypeError: bad type"
    assert type(results[1]) is TypeError and type(results[2]) is ValueError  # each failing rank: its own


def test_a_refusal_sent_in_place_of_an_owed_tensor_is_raised_by_the_receiver_and_forwarded(transports):
    t0, t1 = transports
    owed = [P2PTensor(Payload.ACTIVATION, 0, 1, mb) for mb in range(2)]
    t0.abort([(key, 1) for key in owed], ValueError("PipelineStage 0: its Cell returned a DTensor"))
    for key in reversed(owed):  # whichever tensor the peer waits for, it gets the refusal
        with pytest.raises(ValueError, match=r"^pipeline step refused on job rank 0: ValueError: PipelineStage 0: "
                                             r"its Cell returned a DTensor$") as raised:
            t1.recv(key, 0)
    # passed on by rank 1, it still names rank 0 and its message, not rank 1
    grad = P2PTensor(Payload.GRADIENT, 1, 0, 0)
    t1.abort([(grad, 0)], raised.value)
    with pytest.raises(ValueError, match=r"^pipeline step refused on job rank 0: ValueError: PipelineStage 0"):
        t0.recv(grad, 1)
    # a tensor still arrives as a tensor
    t0.send(0, P2PTensor(Payload.ACTIVATION, 0, 1, 5), Tensor(np.ones(3, np.float32)), 1)
    np.testing.assert_array_equal(t1.recv(P2PTensor(Payload.ACTIVATION, 0, 1, 5), 0), np.ones(3, np.float32))


def test_a_class_that_does_not_travel_arrives_as_runtime_error():
    exc = rebuild(99, 3, "KeyError: 'x'")
    assert type(exc) is RuntimeError and str(exc) == "pipeline step refused on job rank 3: KeyError: 'x'"
