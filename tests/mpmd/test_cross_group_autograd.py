"""mpmd's autograd nodes (cross-group transfers of `mpmd/cross_group.py`, the backward timing marks
of `mpmd/group_runner.py`) differentiate the same through `mindspore.value_and_grad` and through
MindSpore's `run_backward` (torch-style `loss.backward()`), which could not run their former
custom-bprop Cells. One process: the point-to-point sends and receives are replaced by a
recording stand-in; every gradient is an exact copy or zero, written in numpy below."""
import numpy as np
from mindspore import Parameter, Tensor

from mindspore_hyper.mpmd import cross_group
from mindspore_hyper.mpmd.cross_group import RecvInputGradient, RemoteGroupOutput, SendInputGradient
from mindspore_hyper.mpmd.group_runner import _BackwardEnd, _GradientArrival
from autograd_paths import both_ways

X = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
C = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)


class _Wire:
    """Stands in for the p2p channels: what was sent, and the arrays to receive, in order."""

    def __init__(self, monkeypatch, incoming):
        self.sent, self.incoming = [], list(incoming)
        monkeypatch.setattr(cross_group, "send_arrays", lambda arrays, peer, what: self.sent.append((peer, arrays)))
        monkeypatch.setattr(cross_group, "recv_arrays", lambda peer, what: self.incoming.pop(0))


def test_send_input_gradient_sends_it_and_passes_it_on(monkeypatch):
    wire = _Wire(monkeypatch, [])
    w = Parameter(Tensor(np.ones((2, 3), np.float32)), name="w")
    loss = lambda: (SendInputGradient((2, 3), "input of g")(w * Tensor(X)) * Tensor(C)).sum()  # noqa: E731
    by_value_and_grad, by_run_backward = both_ways(loss, [w])
    for got in (by_value_and_grad[0], by_run_backward[0]):
        np.testing.assert_array_equal(got, X * C)  # one float32 product, as numpy's
    assert [peer for peer, _ in wire.sent] == [2, 3, 2, 3]  # to both peers, once per backward
    for _, (grad,) in wire.sent:
        np.testing.assert_array_equal(grad, C)


def test_recv_input_gradient_replaces_the_local_one(monkeypatch):
    remote = np.full((2, 3), 0.5, np.float32)  # the gradient the group's leader sends
    _Wire(monkeypatch, [[remote], [remote]])
    w = Parameter(Tensor(np.ones((2, 3), np.float32)), name="w")
    loss = lambda: (RecvInputGradient(0, "input of g")(w * Tensor(X)) * Tensor(C)).sum()  # noqa: E731
    by_value_and_grad, by_run_backward = both_ways(loss, [w])
    for got in (by_value_and_grad[0], by_run_backward[0]):
        np.testing.assert_array_equal(got, X * remote)


def test_remote_group_output_is_received_and_gives_zero_gradients(monkeypatch):
    out = np.arange(6, dtype=np.float32).reshape(2, 3)
    flag = np.array([0], np.int64)  # a single Tensor output
    _Wire(monkeypatch, [[flag, out], [flag, out]])
    w = Parameter(Tensor(np.ones((2, 3), np.float32)), name="w")
    remote = RemoteGroupOutput(0, "output of g")

    def loss():
        got = remote(w * Tensor(X), w)
        np.testing.assert_array_equal(got.asnumpy(), out)
        return (got * Tensor(C)).sum() + (w * Tensor(X)).sum()  # w's own path: gradient x

    by_value_and_grad, by_run_backward = both_ways(loss, [w])
    for got in (by_value_and_grad[0], by_run_backward[0]):
        np.testing.assert_array_equal(got, X)  # the remote output adds zero


def test_timing_marks_report_in_the_backward_and_pass_the_gradient_on():
    reports = []
    w = Parameter(Tensor(np.ones((2, 3), np.float32)), name="w")
    anchor = Parameter(Tensor(np.zeros((), np.float32)), name="anchor")
    x = Tensor(X)  # a group input that needs no gradient: the end mark still runs (it reads anchor)

    def loss():
        start = _BackwardEnd(lambda: reports.append("end"))(x, anchor)
        out = _GradientArrival(lambda: reports.append("arrival"))(start * w)
        return (out * Tensor(C)).sum()

    by_value_and_grad, by_run_backward = both_ways(loss, [w, anchor])
    for got in (by_value_and_grad, by_run_backward):
        np.testing.assert_array_equal(got[0], X * C)
        assert got[1] == 0.0
    assert reports == ["arrival", "end"] * 2  # the output's gradient first, the input's last
