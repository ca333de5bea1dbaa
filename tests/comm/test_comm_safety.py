"""Regression tests of the communication library's memory and thread safety (issue 11, item 6):
dropped handles, buffer exports, per-rank list lengths,
buffer sizes against counts, and shm segments of the same name. Cases that crashed or hung
before the fix run in a subprocess."""
import os
import threading
import time
import uuid

import numpy as np
import pytest
from comm_helpers import on_both_ranks, run_isolated, segment_path

from mindspore_hyper.comm import CommError, InProcessCommunicator, ShmCommunicator

# Above glibc's largest mmap threshold (32MB): such an array's memory is unmapped when it is
# freed, so a write into it after the free is a certain SIGSEGV rather than silent corruption.
BIG = 10 << 20  # float32 elements (40MB)


def test_dropped_handles_then_flush_complete_safely_on_shm():
    out = run_isolated(f"""
        import gc, uuid
        import numpy as np
        from mindspore_hyper.comm import ShmCommunicator
        # packets of 64MB, sent on flush only: every request below waits in the queue
        g = ShmCommunicator("d" + uuid.uuid4().hex[:12], 0, 1, timeout=10.0, aggregation_bytes=64 << 20, max_delay=3600.0)
        kept = [g.all_reduce_async(np.full(100, i, np.float32)) for i in range(10)]
        g.all_reduce_async(np.ones({BIG}, np.float32))  # handle dropped at once
        for i in range(50):
            g.all_reduce_async(np.full(1000, i, np.float32))  # packed, handles dropped
        gc.collect()
        g.flush()
        assert all((h.wait() == i).all() for i, h in enumerate(kept))
        print("stats", g.aggregator_stats())
        g.close()
        print("OK")
    """)
    assert "OK" in out


def test_dropped_handles_then_flush_complete_safely_in_process():
    out = run_isolated(f"""
        import gc
        import numpy as np
        from mindspore_hyper.comm import InProcessCommunicator
        g = InProcessCommunicator(2, topology=False, aggregation_bytes=64 << 20, max_delay=3600.0)
        g.all_reduce_async([np.ones({BIG}, np.float32)] * 2)  # handle dropped at once
        kept = g.all_reduce_async([np.ones(10, np.float32), np.full(10, 2, np.float32)])
        gc.collect()
        g.flush()
        assert all((y == 3).all() for y in kept.wait())
        g.close()
        print("OK")
    """)
    assert "OK" in out


def test_caller_may_reuse_its_array_right_after_submitting():
    g = InProcessCommunicator(2, topology=False, max_delay=3600.0)
    x = [np.full(5, 1, np.float32), np.full(5, 2, np.float32)]
    h = g.all_reduce_async(x)
    x[0][:] = 100  # the request holds its own copy
    g.flush()
    for y in h.wait():
        np.testing.assert_array_equal(y, np.full(5, 3, np.float32))
    g.close()


def test_buffer_stays_exported_while_a_collective_uses_it(shm_pair):
    # Rank 0 blocks in all_reduce (waiting for rank 1) with the GIL released; meanwhile its
    # bytearray must not be resizable, or the C++ side would write into freed memory.
    out = run_isolated("""
        import threading, time, uuid
        from mindspore_hyper.comm import ShmCommunicator
        name = "x" + uuid.uuid4().hex[:12]
        groups = [None, None]
        t = threading.Thread(target=lambda: groups.__setitem__(1, ShmCommunicator(name, 1, 2, timeout=20.0)))
        t.start()
        groups[0] = ShmCommunicator(name, 0, 2, timeout=20.0)
        t.join()
        buf = bytearray(b"\\x01" * 64)
        t = threading.Thread(target=lambda: groups[0]._g.all_reduce(buf, "uint8", "sum", "auto"))
        t.start()
        time.sleep(0.3)
        try:
            buf.extend(b"\\x00" * (1 << 20))
            print("RESIZED")
        except BufferError:
            print("LOCKED")
        other = bytearray(b"\\x02" * 64)
        groups[1]._g.all_reduce(other, "uint8", "sum", "auto")
        t.join()
        assert bytes(buf[:64]) == b"\\x03" * 64 and bytes(other) == b"\\x03" * 64
        print("OK")
    """)
    assert "LOCKED" in out and "OK" in out


CHECKED_CALLS = [
    ("g._g.submit([np.ones(4, np.float32)], 'sum')", "InProcCommunicator.submit: arrays has 1 entries, expected 2"),
    ("g._g.all_reduce([np.ones(4, np.float32)] * 2, ['float32'], ['sum'] * 2, 'auto')",
     "InProcCommunicator.all_reduce: dtypes has 1 entries, expected 2"),
    ("g._g.broadcast([np.ones(4, np.float32)], ['float32'] * 2, 0, 'auto')",
     "InProcCommunicator.broadcast: bufs has 1 entries, expected 2"),
    ("g._g.all_gather_v([np.ones(2, np.float32)] * 2, [np.ones(4, np.float32)] * 2, [[2, 2]], ['float32'] * 2)",
     "InProcCommunicator.all_gather_v: counts has 1 entries, expected 2"),
    ("g._g.all_gather_v([np.ones(2, np.float32)] * 2, [np.ones(4, np.float32)] * 2, [[2, 2], [2]], ['float32'] * 2)",
     "InProcCommunicator.all_gather_v: counts[1] has 1 entries, expected 2"),
    ("g._g.reduce_scatter([np.ones(4, np.float32)] * 2, [np.ones(2, np.float32)] * 2, [[2, 2]] * 2, ['float32'] * 2,"
     " ['sum'])", "InProcCommunicator.reduce_scatter: ops has 1 entries, expected 2"),
    ("g._g.all_to_all_v([np.ones(4, np.float32)] * 2, [[2, 2]], ['float32'] * 2)",
     "InProcCommunicator.all_to_all_v: send_counts has 1 entries, expected 2"),
    # counts larger than the buffers: the C++ side would read / write past them
    ("g._g.all_gather_v([np.ones(2, np.float32)] * 2, [np.ones(1, np.float32)] * 2, [[2, 2]] * 2, ['float32'] * 2)",
     "InProcCommunicator.all_gather_v: outs[0]: buffer holds 1 elements but the counts need 4"),
    ("g._g.reduce_scatter([np.ones(4, np.float32)] * 2, [np.ones(2, np.float32)] * 2, [[200, 2]] * 2,"
     " ['float32'] * 2, ['sum'] * 2)",
     "InProcCommunicator.reduce_scatter: ins[0]: buffer holds 4 elements but the counts need 202"),
    ("g._g.all_to_all_v([np.ones(4, np.float32)] * 2, [[2, 2000]] * 2, ['float32'] * 2)",
     "InProcCommunicator.all_to_all_v: ins[0]: buffer holds 4 elements but the counts need 2002"),
    ("g._g.all_reduce([np.ones(4, np.float64)] * 2, ['float32'] * 2, ['sum'] * 2, 'auto')",
     "buffer items have 8 bytes but dtype float32 has 4"),
    ("g._g.send_recv(0, 7, np.ones(4, np.float32), np.ones(4, np.float32), 'float32')",
     "src 0 and dst 7 must be two different ranks in [0, 2)"),
]


@pytest.fixture(scope="module")
def checked_call_outcomes():
    """Each CHECKED_CALLS call's outcome ("<exception type> <message>" or "NO ERROR"), all run in
    one fresh interpreter (a crash there fails the tests with the output up to the crashing call;
    one interpreter start-up instead of one per call)."""
    calls = "".join(f"""
        try:
            print("CALL {i}", flush=True)
            {call}
            print("OUTCOME {i} NO ERROR")
        except Exception as exc:
            print("OUTCOME {i}", type(exc).__name__, str(exc).replace(chr(10), " "))
        """ for i, (call, _) in enumerate(CHECKED_CALLS))
    out = run_isolated(f"""
        import numpy as np
        from mindspore_hyper.comm import InProcessCommunicator
        g = InProcessCommunicator(2, topology=False)
        g.all_reduce_async([np.ones(4, np.float32)] * 2)  # makes the aggregators
        {calls}
    """)
    outcomes = {}
    for line in out.splitlines():
        if line.startswith("OUTCOME "):
            index, _, outcome = line[len("OUTCOME "):].partition(" ")
            outcomes[int(index)] = outcome
    return outcomes


@pytest.mark.parametrize("index", range(len(CHECKED_CALLS)), ids=[c for c, _ in CHECKED_CALLS])
def test_per_rank_lists_and_counts_are_checked_before_use(checked_call_outcomes, index):
    call, message = CHECKED_CALLS[index]
    out = checked_call_outcomes[index]
    assert out.startswith("ValueError ") and message in out, (call, out)


def test_shm_counts_are_checked_against_the_buffers():
    g = ShmCommunicator("c" + uuid.uuid4().hex[:12], 0, 1, timeout=5.0)
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match=r"ShmCommunicator.all_gather_v: out: buffer holds 3 elements but the counts need 4"):
        g._g.all_gather_v(x, np.ones(3, np.float32), [4], "float32")
    with pytest.raises(ValueError, match=r"ShmCommunicator.reduce_scatter: counts has 2 entries, expected 1"):
        g._g.reduce_scatter(x, np.ones(4, np.float32), [2, 2], "float32", "sum")
    with pytest.raises(ValueError, match=r"ShmCommunicator.all_to_all_v: in: buffer holds 4 elements but the counts need 400"):
        g._g.all_to_all_v(x, [400], "float32")
    with pytest.raises(ValueError, match=r"ShmCommunicator.all_gather: out: buffer holds 3 elements but the counts need 4"):
        g._g.all_gather(x, np.ones(3, np.float32), "float32")
    g.close()


def test_in_process_per_rank_arguments_are_checked():
    g = InProcessCommunicator(3, topology=False)
    with pytest.raises(ValueError, match=r"arrays has 2 entries, expected 3 \(one per rank\)"):
        g.all_reduce_async([np.ones(2, np.float32)] * 2)
    with pytest.raises(ValueError, match=r"send_counts has 2 entries, expected 3 \(one per rank\)"):
        g.all_to_all_v([np.arange(3, dtype=np.float32)] * 3, [[1, 1, 1]] * 2)
    with pytest.raises(TypeError, match="arrays: expected a list with one entry per rank"):
        g.all_reduce(5)
    g.close()


def test_a_live_shm_segment_of_the_same_name_is_an_error_not_deleted():
    name = "s" + uuid.uuid4().hex[:12]
    first = {}
    forming = threading.Thread(target=lambda: first.__setitem__(0, ShmCommunicator(name, 0, 2, timeout=20.0)))
    forming.start()  # group A's rank 0 waits for its rank 1: its segment is in /dev/shm
    seg = segment_path(name)
    deadline = time.time() + 10
    while not os.path.exists(seg) and time.time() < deadline:
        time.sleep(0.01)
    message = ""
    while "is being created" in message or not message:  # A's rank 0 may still be initialising its header
        with pytest.raises(CommError, match=f"segment {seg[len('/dev/shm'):]} already exists and") as refused:
            ShmCommunicator(name, 0, 2, timeout=2.0)  # group B, same name
        message = str(refused.value)
        assert time.time() < deadline + 10, message
    assert f"belongs to the live process {os.getpid()}" in message
    first[1] = ShmCommunicator(name, 1, 2, timeout=20.0)  # A's rank 1 still finds A's segment
    forming.join()
    sums = on_both_ranks([first[0], first[1]], lambda g: g.all_reduce(np.full(3, g.rank + 1, np.float32)))
    for s in sums:
        np.testing.assert_array_equal(s, np.full(3, 3, np.float32))
    for g in (first[0], first[1]):
        g.close()


def test_batched_submission_reduces_in_place_and_matches_numpy(shm_pair):
    rng = np.random.default_rng(3)
    data = [[rng.standard_normal(n).astype(np.float32) for n in (1024, 7, 1024, 3, 1024)] for _ in range(2)]
    data[0].append(np.arange(6, dtype=np.int32).reshape(2, 3))
    data[1].append(np.arange(6, dtype=np.int32).reshape(2, 3) * 10)

    def submit(g):
        h = g.all_reduce_async_many(data[g.rank], "sum")
        g.flush()
        assert len(h) == len(data[g.rank])
        return h.wait(), g.aggregator_stats()

    (res0, stats0), (res1, _) = on_both_ranks(shm_pair, submit)
    for i in range(len(data[0])):
        ref = data[0][i] + data[1][i]
        assert res0[i].shape == ref.shape and res0[i].dtype == ref.dtype
        np.testing.assert_allclose(res0[i], ref, rtol=1e-6)
        np.testing.assert_array_equal(res0[i], res1[i])
    assert stats0["requests"] == 6
    # float32 (7 and 3 elements are not multiples of 8 bytes: packed copies) and int32 packets
    assert stats0["packets"] >= 2 and stats0["bytes"] == sum(a.nbytes for a in data[0])


def test_requests_back_to_back_in_one_block_are_reduced_in_place(shm_pair):
    def submit(g):
        h = g.all_reduce_async_many([np.full(256, g.rank + i, np.float32) for i in range(100)])
        g.flush()
        return h.wait(), g.aggregator_stats()

    (res, stats), _ = on_both_ranks(shm_pair, submit)
    for i, y in enumerate(res):
        np.testing.assert_array_equal(y, np.full(256, 2 * i + 1, np.float32))
    assert stats["packets"] >= 1 and stats["in_place"] == stats["packets"]
