"""The dispatch all-to-all carrying each destination's per-expert row counts in the rows'
message (`ProcessExchange.move_counted`) gives the same counts and rows as a counts exchange
followed by the rows (`counts` + `move`); members run as threads over an in-memory transport."""
import threading

import numpy as np
import pytest

from mindspore_hyper.moe.exchange import ProcessExchange


class _Group:
    """An uneven all-to-all among `size` threads: member i's slice j goes to member j."""

    def __init__(self, size):
        self.size, self.barrier = size, threading.Barrier(size)
        self.sent = [None] * size

    def member(self, index):
        group = self

        class Comm:
            def all_to_all_v(self, arr, counts):
                ends = np.cumsum(counts)
                group.sent[index] = np.split(arr.copy(), ends[:-1])
                group.barrier.wait()
                got = [group.sent[src][index] for src in range(group.size)]
                group.barrier.wait()
                return np.concatenate(got), [len(g) for g in got]

        return Comm()


def _run(size, hidden, slots, dtype, seed):
    rng = np.random.default_rng(seed)
    send = [rng.integers(0, 4, (size, slots)) for _ in range(size)]
    rows = [rng.normal(size=(int(s.sum()), hidden)).astype(dtype) for s in send]
    out = {}

    def member(i, way):
        group = groups[way]
        ex = ProcessExchange(group.member(i), i, size, hidden)
        if way == "counted":
            out[(way, i)] = ex.move_counted(rows[i], send[i])
        else:
            recv = ex.counts(send[i])
            out[(way, i)] = recv, ex.move(rows[i], send[i], recv)

    groups = {"counted": _Group(size), "separate": _Group(size)}
    for way in groups:
        threads = [threading.Thread(target=member, args=(i, way)) for i in range(size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    return send, rows, out


@pytest.mark.parametrize("size,slots,dtype", [(2, 3, np.float32), (3, 1, np.float16), (1, 2, np.float64)])
def test_counted_exchange_equals_counts_then_rows(size, slots, dtype):
    hidden = 5
    send, rows, out = _run(size, hidden, slots, dtype, seed=size)
    for i in range(size):
        counts, moved = out[("counted", i)]
        ref_counts, ref_moved = out[("separate", i)]
        np.testing.assert_array_equal(counts, ref_counts)
        np.testing.assert_array_equal(counts, np.stack([send[src][i] for src in range(size)]))
        np.testing.assert_array_equal(moved, ref_moved.reshape(-1))
        assert moved.dtype == np.dtype(dtype)


def test_rows_whose_dtype_cannot_carry_int64_are_refused():
    ex = ProcessExchange(None, 0, 1, 2)
    with pytest.raises(ValueError, match="cannot carry int64 counts in rows of"):
        ex.move_counted(np.zeros((1, 2), np.dtype("V3")), np.ones((1, 1), np.int64))
