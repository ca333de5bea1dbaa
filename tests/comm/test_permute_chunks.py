"""`ProcessCollectives.permute_chunks` (ring attention's zigzag exchange) on shared-memory groups of
2 and 4 ranks, one thread per rank: every chunk reaches its new owner, the inverse order brings it
back, refusals name what is wrong."""
import threading
import uuid

import numpy as np
import pytest
from mindspore import Tensor

from mindspore_hyper.comm import ShmCommunicator
from mindspore_hyper.comm.collectives import AxisGroup
from mindspore_hyper.comm.process_collectives import ProcessCollectives


def _zigzag(n):
    """Member r gets chunks r and 2n-1-r of the 2n chunks (ring attention's balanced causal order)."""
    return [c for r in range(n) for c in (r, 2 * n - 1 - r)]


def _on_ranks(n, fn):
    """fn(collectives, group, rank) on n ranks of a new shared-memory group, one thread each."""
    name = "pc" + uuid.uuid4().hex[:10]
    results, errors = [None] * n, []

    def run(rank):
        try:
            with ShmCommunicator(name, rank, n, timeout=20.0) as comm:
                results[rank] = fn(ProcessCollectives(lambda ranks: comm), AxisGroup("cp", tuple(range(n)), (rank,)),
                                   rank)
        except Exception as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    assert not errors, errors
    return results


@pytest.mark.parametrize("n", [2, 4])
def test_chunks_reach_their_new_owners_and_the_inverse_brings_them_back(n):
    order = _zigzag(n)
    inverse = [order.index(c) for c in range(2 * n)]
    chunk = lambda c: np.full((2, 3), c, np.float32)  # noqa: E731  chunk c's values are c

    def run(pc, group, rank):
        mine = [Tensor(chunk(2 * rank)), Tensor(chunk(2 * rank + 1))]
        moved = pc.permute_chunks(mine, order, group)
        back = pc.permute_chunks(moved, inverse, group)
        return [m.asnumpy() for m in moved], [b.asnumpy() for b in back]

    for rank, (moved, back) in enumerate(_on_ranks(n, run)):
        for got, c in zip(moved, (rank, 2 * n - 1 - rank)):
            np.testing.assert_array_equal(got, chunk(c))
        for got, c in zip(back, (2 * rank, 2 * rank + 1)):
            np.testing.assert_array_equal(got, chunk(c))


def test_permute_chunks_refuses_what_is_not_a_permutation():
    pc = ProcessCollectives(lambda ranks: None)
    with pytest.raises(ValueError, match=r"permute_chunks: .*sources is a permutation of range\(2 \* 2\)"):
        pc.permute_chunks([Tensor(np.ones(1, np.float32))] * 2, [0, 1, 1, 3], AxisGroup("cp", (0, 1), (0,)))
