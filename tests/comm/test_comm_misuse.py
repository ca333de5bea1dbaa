"""Misuse corpus of the communication library: wrong list lengths, wrong dtypes, non-contiguous
buffers, dropped handles, double wait, wrong shapes between ranks, use after close, bad
arguments -- for InProcessCommunicator, ShmCommunicator (two ranks on two threads) and the aggregator. Each
ends in a Python exception whose type and message name the problem (or, where the input is
legal, in the right result), never a crash or a hang. The raw C++ entry points, where a missed
check would crash, run in a subprocess."""
import gc

import numpy as np
import pytest
from comm_helpers import on_both_ranks, run_isolated, shm_group_pair

from mindspore_hyper.comm import CommError, CommMismatch, InProcessCommunicator, ShmCommunicator

UNSUPPORTED = [np.bool_, np.complex64, np.int16, np.uint32, object]


@pytest.fixture
def inproc():
    g = InProcessCommunicator(2, topology=False, max_delay=3600.0)
    yield g
    g.close()


# ----- InProcessCommunicator ------------------------------------------------------------------------
@pytest.mark.parametrize("call", [
    lambda g: g.all_reduce([np.ones(3, np.float32)]),
    lambda g: g.all_gather([np.ones(3, np.float32)] * 3),
    lambda g: g.reduce_scatter([np.ones(4, np.float32)]),
    lambda g: g.all_to_all([np.ones(4, np.float32)]),
    lambda g: g.broadcast([np.ones(3, np.float32)] * 5),
    lambda g: g.all_reduce_async([np.ones(3, np.float32)]),
])
def test_inproc_wrong_list_length(inproc, call):
    with pytest.raises(ValueError, match=r"arrays has \d entries, expected 2 \(one per rank\)"):
        call(inproc)


def test_inproc_wrong_send_counts(inproc):
    xs = [np.arange(4, dtype=np.float32)] * 2
    with pytest.raises(ValueError, match=r"send_counts has 1 entries, expected 2"):
        inproc.all_to_all_v(xs, [[2, 2]])
    with pytest.raises(ValueError, match=r"all_to_all_v: rank 1 sends \[1, 1\] elements from an array of 4"):
        inproc.all_to_all_v(xs, [[2, 2], [1, 1]])


@pytest.mark.parametrize("dtype", UNSUPPORTED)
def test_inproc_unsupported_dtype(inproc, dtype):
    xs = [np.ones(3, dtype=dtype)] * 2
    name = np.dtype(dtype).name
    with pytest.raises(TypeError, match=f"dtype {name} is not supported by the comm library"):
        inproc.all_reduce(xs)
    with pytest.raises(TypeError, match=f"dtype {name} is not supported by the comm library"):
        inproc.all_reduce_async(xs)


def test_inproc_dtypes_or_sizes_differ_between_ranks(inproc):
    with pytest.raises(CommMismatch, match=r"rank 0 calls all_reduce\(float32, 3 elements, op sum\) but rank 1 "
                                           r"calls all_reduce\(int32, 3 elements, op sum\)"):
        inproc.all_reduce([np.ones(3, np.float32), np.ones(3, np.int32)])
    with pytest.raises(CommMismatch, match="rank 0 passes shape \\(4,\\) but rank 1 passes \\(2, 2\\)"):
        inproc.reduce_scatter([np.ones(4, np.float32), np.ones((2, 2), np.float32)])
    with pytest.raises(ValueError, match="only dim 0 may differ"):
        inproc.all_gather([np.ones((2, 3), np.float32), np.ones((2, 4), np.float32)])
    with pytest.raises(CommMismatch, match=r"all_to_all: rank 0 passes shape \(4, 2\) but rank 1 passes \(5, 2\)"):
        inproc.all_to_all([np.ones((4, 2), np.float32), np.ones((5, 2), np.float32)])
    h = inproc.all_reduce_async([np.ones(3, np.float32), np.ones(5, np.float32)])
    inproc.flush()
    with pytest.raises(CommMismatch, match="aggregated all_reduce requests differ across ranks"):
        h.wait(10)
    # the group stays usable
    for y in inproc.all_reduce([np.ones(2, np.float32)] * 2):
        np.testing.assert_array_equal(y, [2, 2])


def test_inproc_non_contiguous_inputs_are_copied(inproc):
    base = [np.arange(12, dtype=np.float32).reshape(3, 4) * (r + 1) for r in range(2)]
    views = [b[:, ::2] for b in base]  # strided
    for y in inproc.all_reduce(views):
        np.testing.assert_array_equal(y, views[0] + views[1])
    h = inproc.all_reduce_async([v.T for v in views])
    inproc.flush()
    for y in h.wait(10):
        np.testing.assert_array_equal(y, (views[0] + views[1]).T)


def test_inproc_dropped_handles_and_double_wait(inproc):
    for i in range(20):
        inproc.all_reduce_async([np.full(64, i, np.float32)] * 2)  # dropped at once
    kept = inproc.all_reduce_async([np.full(3, 1, np.int32), np.full(3, 2, np.int32)], "max")
    gc.collect()
    inproc.flush()
    first = kept.wait(10)
    second = kept.wait(10)  # waiting again returns the same results
    for a, b in zip(first, second):
        assert a is b
        np.testing.assert_array_equal(a, [2, 2, 2])
    assert inproc.aggregator_stats()["requests"] == 21


def test_inproc_bad_arguments(inproc):
    with pytest.raises(ValueError, match="op='prod': expected one of sum, max, min, avg"):
        inproc.all_reduce([np.ones(2, np.float32)] * 2, op="prod")
    with pytest.raises(CommError, match="unknown all_reduce algorithm 'fast'"):
        inproc.all_reduce([np.ones(2, np.float32)] * 2, algorithm="fast")
    with pytest.raises(CommError, match=r"broadcast: root 5 outside \[0, 2\)"):
        inproc.broadcast([np.ones(2, np.float32)] * 2, root=5)
    with pytest.raises(ValueError, match=r"src 1 and dst 1 must be two different ranks in \[0, 2\)"):
        inproc.send_recv(np.ones(2, np.float32), 1, 1)
    h = inproc.all_reduce_async([np.ones(2, np.float32)] * 2)
    with pytest.raises(ValueError, match="timeout must be a number of seconds or None, got nan"):
        h.wait(float("nan"))
    with pytest.raises(CommError, match="timed out|not completed within"):
        h.wait(0.01)  # never flushed: a bounded wait ends with CommTimeout
    with pytest.raises(CommError, match="timeout must be > 0 seconds"):
        InProcessCommunicator(2, topology=False, timeout=float("nan"))
    with pytest.raises(CommError, match="max_delay must be >= 0 seconds"):
        InProcessCommunicator(2, topology=False, max_delay=-1.0).all_reduce_async([np.ones(1, np.float32)] * 2)


def test_inproc_use_after_close():
    g = InProcessCommunicator(2, topology=False, max_delay=3600.0)
    pending = g.all_reduce_async([np.ones(2, np.float32)] * 2)  # queued, never flushed
    g.close()
    with pytest.raises(CommError, match="aggregator closed before the request was sent|aggregator was closed"):
        pending.wait(10)
    for call in (lambda: g.all_reduce([np.ones(2, np.float32)] * 2),
                 lambda: g.all_reduce_async([np.ones(2, np.float32)] * 2),
                 lambda: g.flush(), lambda: g.barrier(), lambda: g.aggregator_stats()):
        with pytest.raises(CommError, match=r"InProcessCommunicator\(size=2\) is closed"):
            call()
    g.close()  # closing twice is harmless


# ----- ShmCommunicator: two ranks on two threads ----------------------------------------------------
@pytest.mark.parametrize("dtype", UNSUPPORTED)
def test_shm_unsupported_dtype(shm_pair, dtype):
    g = shm_pair[0]
    name = np.dtype(dtype).name
    with pytest.raises(TypeError, match=f"dtype {name} is not supported by the comm library"):
        g.all_reduce(np.ones(3, dtype=dtype))
    with pytest.raises(TypeError, match=f"all_reduce_async: x: dtype {name} is not supported"):
        g.all_reduce_async(np.ones(3, dtype=dtype))
    with pytest.raises(TypeError, match=rf"all_reduce_async_many: arrays\[1\]: dtype {name} is not supported"):
        g.all_reduce_async_many([np.ones(3, np.float32), np.ones(3, dtype=dtype)])
    assert g.aggregator_stats()["requests"] == 0  # a rejected batch queues nothing


def test_shm_not_an_array(shm_pair):
    with pytest.raises(TypeError, match=r"all_reduce_async_many: arrays\[1\]: expected an array-like of numbers, "
                                        r"got list"):
        shm_pair[0].all_reduce_async_many([np.ones(2), [[1, 2], [3]]])  # ragged
    with pytest.raises(TypeError, match=r"all_reduce_async_many: arrays\[0\]: dtype object is not supported"):
        shm_pair[0].all_reduce_async_many([{"a": 1}])


def test_shm_shapes_and_dtypes_differ_between_ranks(shm_pair):
    res = on_both_ranks(shm_pair, lambda g: g.all_reduce(np.ones(3 + g.rank, np.float32)))
    for r in res:
        assert isinstance(r, CommMismatch)
        assert "rank 0 calls all_reduce(float32, 3 elements, op sum) but rank 1 calls all_reduce(float32, 4 elements" \
            in str(r)
    res = on_both_ranks(shm_pair, lambda g: g.all_reduce(np.ones(3, np.float32 if g.rank else np.int32)))
    assert all(isinstance(r, CommMismatch) and "int32" in str(r) and "float32" in str(r) for r in res)

    def aggregated(g):
        h = g.all_reduce_async(np.ones(3 + g.rank, np.float32))
        g.flush()
        return h.wait(10)

    res = on_both_ranks(shm_pair, aggregated)
    assert all(isinstance(r, CommMismatch) and "differ across ranks" in str(r) for r in res)
    # the group stays usable
    for y in on_both_ranks(shm_pair, lambda g: g.all_reduce(np.full(2, g.rank, np.int64))):
        np.testing.assert_array_equal(y, [1, 1])


@pytest.mark.parametrize("call, message", [
    (lambda g: g.all_gather(np.ones((2, 3 + g.rank), np.float32)),
     "all_gather: rank 0 passes shape (2, 3) but rank 1 passes (2, 4); only dim 0 may differ"),
    (lambda g: g.all_gather(np.ones((2, 3) if g.rank else (2, 3, 1), np.float32)),
     "all_gather: rank 0 passes shape (2, 3, 1) but rank 1 passes (2, 3)"),
    (lambda g: g.all_to_all(np.ones((4 + g.rank, 2), np.float32)),
     "rank 0 calls all_to_all(float32, 8 elements) but rank 1 calls all_to_all(float32, 10 elements)"),
    (lambda g: g.all_to_all(np.ones((4, 2) if g.rank else (2, 4), np.float32)),
     "all_to_all(float32, 8 elements) (with different array shapes or dims)"),
    (lambda g: g.all_to_all(np.ones((4, 2), np.float32), concat_dim=g.rank),
     "(with different array shapes or dims)"),
    (lambda g: g.reduce_scatter(np.ones((4, 2 + g.rank), np.float32)),
     "rank 0 calls reduce_scatter(float32, 8 elements, op sum) but rank 1 calls reduce_scatter(float32, 12 elements"),
    (lambda g: g.broadcast(np.ones(3 + g.rank, np.float32), root=1),
     "rank 0 calls broadcast(float32, 3 elements, root 1) but rank 1 calls broadcast(float32, 4 elements, root 1)"),
])
def test_shm_collective_shapes_differ_between_ranks(shm_pair, call, message):
    res = on_both_ranks(shm_pair, call)
    for r in res:  # every rank fails alike, nobody waits for a timeout
        assert isinstance(r, CommMismatch) and message in str(r), res
    for y in on_both_ranks(shm_pair, lambda g: g.all_reduce(np.ones(2, np.float32))):  # still usable
        np.testing.assert_array_equal(y, [2, 2])


def test_dim_out_of_range(shm_pair, inproc):
    with pytest.raises(ValueError, match="all_gather: dim 2 is out of range for an array of 2 dimensions"):
        shm_pair[0].all_gather(np.ones((2, 2)), dim=2)
    with pytest.raises(ValueError, match="all_to_all: dim -3 is out of range for an array of 2 dimensions"):
        shm_pair[0].all_to_all(np.ones((2, 2)), split_dim=-3)
    with pytest.raises(np.AxisError):
        inproc.all_gather([np.ones((2, 2))] * 2, dim=5)


def test_shm_aggregated_batch_against_a_direct_collective(shm_pair):
    def step(g):
        if g.rank == 0:
            h = g.all_reduce_async(np.ones(3, np.float32))
            g.flush()
            return h.wait(10)
        return g.all_reduce(np.ones(3, np.float32))

    res = on_both_ranks(shm_pair, step)
    assert isinstance(res[0], CommMismatch) and "rank 0 calls an aggregated all_reduce batch but rank 1 calls " \
        "all_reduce(float32, 3 elements, op sum)" in str(res[0]), res
    assert isinstance(res[1], CommMismatch) and "rank 0 calls an aggregated all_reduce batch but rank 1 calls " \
        "all_reduce(float32, 3 elements, op sum)" in str(res[1]), res
    for y in on_both_ranks(shm_pair, lambda g: g.all_reduce(np.ones(2, np.float32))):  # still usable
        np.testing.assert_array_equal(y, [2, 2])


def test_shm_non_contiguous_input_and_bad_out(shm_pair):
    x = np.arange(20, dtype=np.float64).reshape(4, 5)[:, 1::2]
    for y in on_both_ranks(shm_pair, lambda g: g.all_reduce(x)):
        np.testing.assert_array_equal(y, 2 * x)
    with pytest.raises(ValueError, match="out must be a C-contiguous array of the input's shape and dtype"):
        shm_pair[0].all_reduce(np.ones(4, np.float32), out=np.ones(8, np.float32)[::2])


def test_shm_dropped_handles_and_double_wait(shm_pair):
    def work(g):
        for i in range(30):
            g.all_reduce_async(np.full(100, i, np.float32))  # dropped
        h = g.all_reduce_async_many([np.full(4, g.rank + i, np.int32) for i in range(3)], "min")
        gc.collect()
        g.flush()
        return h.wait(10), h.wait(10)

    for first, second in on_both_ranks(shm_pair, work):
        for i, (a, b) in enumerate(zip(first, second)):
            assert a is b
            np.testing.assert_array_equal(a, np.full(4, i, np.int32))


def test_shm_raw_buffers_are_checked(shm_pair):
    g = shm_pair[0]._g
    with pytest.raises(ValueError, match="ShmCommunicator.all_reduce: buf: buffer must be C-contiguous"):
        g.all_reduce(np.ones(8, np.float32)[::2], "float32", "sum", "auto")
    with pytest.raises(ValueError, match="buffer items have 4 bytes but dtype float64 has 8"):
        g.all_reduce(np.ones(8, np.float32), "float64", "sum", "auto")
    with pytest.raises(CommError, match="unsupported dtype 'bfloat16'"):
        g.all_reduce(np.ones(8, np.float32), "bfloat16", "sum", "auto")
    with pytest.raises(CommError, match="unsupported reduce op 'prod'"):
        g.all_reduce(np.ones(8, np.float32), "float32", "prod", "auto")
    with pytest.raises(ValueError, match="ShmCommunicator.all_reduce: buf: needs a writable buffer"):
        g.all_reduce(b"readonly bytes", "uint8", "sum", "auto")


def test_shm_bad_construction():
    with pytest.raises(ValueError, match="name='': expected a non-empty name"):
        ShmCommunicator("", 0, 1)
    with pytest.raises(ValueError, match="max_message_bytes=0: expected a positive number of bytes"):
        ShmCommunicator("misuse_limit", 0, 1, max_message_bytes=0)
    with pytest.raises(CommError, match=r"rank 3 outside \[0, 2\)"):
        ShmCommunicator("misuse_rank", 3, 2, timeout=1.0)
    with pytest.raises(CommError, match=r"group size 0 outside \[1, 256\]"):
        ShmCommunicator("misuse_size", 0, 0, timeout=1.0)
    with pytest.raises(CommError, match="timeout must be > 0 seconds"):
        ShmCommunicator("misuse_timeout", 0, 1, timeout=float("nan"))


def test_shm_use_after_close():
    g0, g1 = shm_group_pair(max_delay=3600.0)
    pending = g0.all_reduce_async(np.ones(2, np.float32))  # queued; rank 1 never submits
    g0.close()
    with pytest.raises(CommError, match="aggregator closed before the request was sent|aggregator was closed"):
        pending.wait(10)
    for call in (lambda: g0.all_reduce(np.ones(2, np.float32)), lambda: g0.all_reduce_async(np.ones(2)),
                 lambda: g0.all_reduce_async_many([np.ones(2)]), lambda: g0.flush(), lambda: g0.barrier(),
                 lambda: g0.rank, lambda: g0.aggregator_stats()):
        with pytest.raises(CommError, match=f"ShmCommunicator {g0.name!r} is closed"):
            call()
    g0.close()
    # rank 1 is not left waiting for its timeout: the closed rank aborted the group
    with pytest.raises(CommError, match="aborted|closed with 1 requests unfinished"):
        g1.all_reduce(np.ones(2, np.float32))
    g1.close()


# ----- the aggregator itself ------------------------------------------------------------------
def test_aggregator_packet_size_below_one_element_is_refused():
    g0, g1 = shm_group_pair(aggregation_bytes=4)
    try:
        with pytest.raises(CommError, match="packet_bytes must be >= 8"):
            g0.all_reduce_async(np.ones(2, np.float32))
    finally:
        g0.close()
        g1.close()


def test_raw_entry_points_never_crash_in_a_subprocess():
    # Wrong list lengths and counts at the raw C++ entry points (a missed check would read or
    # write past a buffer): each must end in an exception.
    out = run_isolated("""
        import numpy as np
        from mindspore_hyper.comm import InProcessCommunicator, ShmCommunicator
        g = InProcessCommunicator(3, topology=False)
        g.all_reduce_async([np.ones(4, np.float32)] * 3)
        f = np.ones(4, np.float32)
        calls = [
            lambda: g._g.submit([f, f], "sum"),
            lambda: g._g.submit([f] * 4, "sum"),
            lambda: g._g.all_reduce([f] * 3, ["float32"] * 3, ["sum"], "auto"),
            lambda: g._g.all_gather_v([f] * 3, [np.ones(12, np.float32)] * 3, [[4, 4]] * 3, ["float32"] * 3),
            lambda: g._g.all_gather_v([f] * 3, [np.ones(2, np.float32)] * 3, [[4, 4, 4]] * 3, ["float32"] * 3),
            lambda: g._g.reduce_scatter([f] * 3, [f] * 3, [[4, 4, 4]] * 3, ["float32"] * 3, ["sum"] * 3),
            lambda: g._g.all_to_all_v([f] * 3, [[4, 4, 4]] * 3, ["float32"] * 3),
            lambda: g._g.broadcast([f] * 2, ["float32"] * 3, 0, "auto"),
            lambda: g._g.send_recv(-1, 0, f, f, "float32"),
            lambda: g._g.aggregator_stats(9),
            lambda: g._g.model(-5),
        ]
        for i, call in enumerate(calls):
            try:
                call()
                print(i, "NO ERROR")
            except Exception as exc:
                print(i, type(exc).__name__, exc)
        s = ShmCommunicator("rawmisuse", 0, 1, timeout=5.0)
        for call in (lambda: s._g.all_gather_v(f, np.ones(2, np.float32), [4], "float32"),
                     lambda: s._g.reduce_scatter(f, f, [40], "float32", "sum"),
                     lambda: s._g.all_to_all_v(f, [4, 4], "float32")):
            try:
                call()
                print("shm NO ERROR")
            except ValueError as exc:
                print("shm ValueError", exc)
        print("DONE")
    """)
    lines = out.splitlines()
    assert lines[-1] == "DONE" and not [line for line in lines if "NO ERROR" in line], out
    assert sum("ValueError" in line for line in lines) >= 12, out
    assert "IndexError" in out  # aggregator_stats(9) / model(-5): out of range, reported
