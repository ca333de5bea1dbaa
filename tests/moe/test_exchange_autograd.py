"""MoE's token exchanges (`moe/exchange.py`: msrun's `RowExchange`, the C++ library's in-process
`_LibraryAllToAllV`) differentiate the same through `mindspore.value_and_grad` and through
MindSpore's `run_backward` (torch-style `loss.backward()`), which could not run their former
custom-bprop Cells. Their forwards and backwards only move rows, so the gradients are exact: each
is written in numpy below."""
import numpy as np
from mindspore import Parameter, Tensor

from mindspore_hyper.comm.library_collectives import _group
from mindspore_hyper.moe.exchange import RowExchange, _LibraryAllToAllV
from autograd_paths import both_ways

HIDDEN = 3


class _Peer:
    """Member 0 of a group of 2 (this process) and a scripted member 1: call by call, the rows
    member 1 sends here; what this member sends to member 1 is kept in `to_peer`."""

    def __init__(self, from_peer):
        self.from_peer, self.to_peer = list(from_peer), []

    def all_to_all_v(self, flat, send_counts):
        mine, theirs = flat[:send_counts[0]], flat[send_counts[0]:send_counts[0] + send_counts[1]]
        self.to_peer.append(theirs.copy())
        peer = self.from_peer.pop(0).reshape(-1)
        return np.concatenate([mine, peer]), [mine.size, peer.size]


def test_row_exchange_moves_rows_and_their_gradient_back_both_ways():
    """This member sends 2 rows to itself and 3 to member 1, gets 4 from member 1: the received rows
    are its own 2 then member 1's 4; the gradient of its rows is its own 2 rows' gradient then what
    member 1 sends back for the 3 rows it got."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, HIDDEN)).astype(np.float32)
    peer_rows = rng.standard_normal((4, HIDDEN)).astype(np.float32)
    peer_grad = rng.standard_normal((3, HIDDEN)).astype(np.float32)  # member 1's gradient of our 3 rows
    c = rng.standard_normal((6, HIDDEN)).astype(np.float32)
    w = Parameter(Tensor(np.ones((5, HIDDEN), np.float32)), name="w")
    peers = []

    def loss():
        comm = _Peer([peer_rows, peer_grad])
        peers.append(comm)
        sent = Tensor(x) * w
        moved = comm.all_to_all_v(np.ascontiguousarray(sent.asnumpy().reshape(-1)), [2 * HIDDEN, 3 * HIDDEN])[0]
        out = RowExchange(comm, [2, 3], [2, 4], HIDDEN, moved)(sent)
        np.testing.assert_array_equal(out.asnumpy(), np.concatenate([x[:2], peer_rows]))
        return (out * Tensor(c)).sum()

    by_value_and_grad, by_run_backward = both_ways(loss, [w])
    want = x * np.concatenate([c[:2], peer_grad])  # one float32 product per element, as numpy's
    np.testing.assert_array_equal(by_value_and_grad[0], want)
    np.testing.assert_array_equal(by_run_backward[0], want)
    for comm in peers:  # forward: our last 3 rows to member 1; backward: the gradient of its 4 rows
        np.testing.assert_array_equal(comm.to_peer[1].reshape(-1, HIDDEN), c[2:])


def test_library_exchange_moves_rows_and_their_gradient_back_both_ways():
    """Two members in this process: member 0 sends 1 row to itself and 2 to member 1, member 1
    sends 3 to member 0 and none to itself; the gradients are the outputs' weights moved back."""
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((3, HIDDEN)).astype(np.float32) for _ in range(2)]
    counts = [[1, 2], [3, 0]]
    cs = [rng.standard_normal((4, HIDDEN)).astype(np.float32), rng.standard_normal((2, HIDDEN)).astype(np.float32)]
    ws = [Parameter(Tensor(np.ones((3, HIDDEN), np.float32)), name=f"w{i}") for i in range(2)]

    def loss():
        outs = _LibraryAllToAllV(_group(2), counts, HIDDEN)(Tensor(xs[0]) * ws[0], Tensor(xs[1]) * ws[1])
        np.testing.assert_array_equal(outs[0].asnumpy(), np.concatenate([xs[0][:1], xs[1]]))
        np.testing.assert_array_equal(outs[1].asnumpy(), xs[0][1:])
        return (outs[0] * Tensor(cs[0])).sum() + (outs[1] * Tensor(cs[1])).sum()

    by_value_and_grad, by_run_backward = both_ways(loss, ws)
    want = [xs[0] * np.concatenate([cs[0][:1], cs[1]]), xs[1] * cs[0][1:]]
    for got in (by_value_and_grad, by_run_backward):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
