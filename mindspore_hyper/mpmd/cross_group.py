"""Tensors crossing device groups between msrun processes, over `comm.p2p` channels.

Every process runs the model's code between groups on global tensors; a group's output is
computed by its members and sent by the group's leader (its first rank) to every other process,
and in the backward the gradient of the group's inputs goes the same way. Transfers are
point-to-point over one `P2PChannel` per direction (sender -> receiver; user "x" of the rank's
`comm.channel_pool`), in the order sent, each a message of arrays. Sends return at once (the
channel's thread writes them, so a process never blocks on a full channel while its peer is
busy); receives block the caller. A peer that died
or stalls makes the receiver fail with the transport's CommTimeout naming the peer, the group
and the tensor; a failed send is raised by the next cross-group operation of the sender.
"""
from __future__ import annotations

import atexit
from typing import List, Optional, Sequence

import numpy as np
from mindspore import Tensor, ops
from mindspore.common import _Function

from mindspore_hyper.comm import CommError
from mindspore_hyper.comm.channel_pool import ChannelPool, channel_pool
from mindspore_hyper.comm.gradient_identity import identity_with_gradient
from mindspore_hyper.comm.p2p import P2PChannel
from mindspore_hyper.runtime.distributed.world import world

__all__ = ["send_arrays", "recv_arrays", "send_output", "outbox", "Outbox", "SendInputGradient", "RecvInputGradient",
           "RemoteGroupOutput"]

_TAG = 0  # one stream per direction: received in the order sent
_USER = "x"  # the channels' user name in the pool


class Outbox:
    """This process's sends: `post` queues arrays for a peer and returns at once (each peer's
    channel writes them in its own thread)."""

    def __init__(self):
        self._pool: Optional[ChannelPool] = None  # the world's rank's, once a channel was asked for

    def channel(self, src: int, dst: int) -> P2PChannel:
        """The one-way channel src -> dst, made on first use by each end (the receiving end waits
        there until the sending end's first send attached)."""
        w = world()
        if self._pool is None:
            self._pool = channel_pool(w.job, w.rank)
        return self._pool.channel(_USER, src, dst, w.timeout)

    def post(self, arrays: Sequence[np.ndarray], peer: int, what: str) -> None:
        self.check()
        try:
            # not copied, as before this channel: group outputs and gradients are not changed in place
            self.channel(world().rank, peer).send(_TAG, arrays, copy=False)
        except TypeError as exc:
            raise TypeError(f"{what}: {exc}") from None

    def flush(self) -> None:
        """Wait until every posted send was handed to its channel; raise a failed send."""
        for channel in self._sending():
            channel.flush()

    def check(self) -> None:
        for channel in self._sending():
            channel.check()

    def close(self) -> None:
        """Write what is posted, then close every cross-group channel of this process."""
        if self._pool is not None:
            self._pool.close(_USER)

    def _sending(self) -> List[P2PChannel]:
        return [] if self._pool is None else [c for c in self._pool.channels(_USER) if c.sending]


_OUTBOX: Optional[Outbox] = None


def outbox() -> Outbox:
    """This process's Outbox (made on first use; its channels are drained and closed at exit)."""
    global _OUTBOX
    if _OUTBOX is None:
        _OUTBOX = Outbox()
        atexit.register(_OUTBOX.close)
    return _OUTBOX


def send_arrays(arrays: Sequence[np.ndarray], peer: int, what: str) -> None:
    """Queue `arrays` (one message) for global rank `peer`."""
    outbox().post(arrays, peer, what)


def recv_arrays(peer: int, what: str) -> List[np.ndarray]:
    """Receive the arrays `send_arrays` sent from global rank `peer` (blocks)."""
    outbox().check()
    try:
        return list(outbox().channel(peer, world().rank).recv(_TAG).arrays)
    except CommError as exc:
        raise type(exc)(f"{what}: waiting for rank {peer} (this is rank {world().rank}): {exc}") from None


def send_output(out, peers: Sequence[int], what: str) -> None:
    """Send a group's output (a Tensor or a tuple/list of Tensors) to `peers`, in order."""
    single = isinstance(out, Tensor)
    outputs = (out,) if single else tuple(out)
    if not all(isinstance(o, Tensor) for o in outputs):
        raise TypeError(f"{what}: a group's output must be a Tensor or a tuple of Tensors to cross processes, got "
                        f"{type(out).__name__}")
    arrays = [np.array([0 if single else 1], np.int64)] + [o.asnumpy() for o in outputs]
    for peer in peers:
        send_arrays(arrays, peer, what)


def _tensor(a: np.ndarray, like: Tensor) -> Tensor:
    return Tensor(a, dtype=like.dtype)


class _Identity:
    """Identity on a tensor whose backward does something besides passing the gradient on
    (`backward(dout)` -> the input's gradient). A call is one node of MindSpore's PyNative
    autograd graph (`comm/gradient_identity.py`), which both `mindspore.value_and_grad` and
    `run_backward` (torch-style `loss.backward()`) differentiate."""

    def __call__(self, x: Tensor) -> Tensor:
        return identity_with_gradient(x, self.backward)


class SendInputGradient(_Identity):
    """Identity on a group input in the leader; its backward sends the input's gradient (whole,
    as every member holds it) to the processes outside the group."""

    def __init__(self, peers: Sequence[int], what: str):
        self.peers, self.what = tuple(peers), what

    def backward(self, dout: Tensor) -> Tensor:
        grad = dout.asnumpy()
        for peer in self.peers:
            send_arrays([grad], peer, self.what)
        return dout


class RecvInputGradient(_Identity):
    """Identity on a group input outside the group; its backward receives the input's gradient
    from the group's leader (the local gradient, which is zero, is replaced)."""

    def __init__(self, leader: int, what: str):
        self.leader, self.what = leader, what

    def backward(self, dout: Tensor) -> Tensor:
        (grad,) = recv_arrays(self.leader, self.what)
        return _tensor(grad, dout)


class RemoteGroupOutput:
    """A group's call in a process outside the group: receives the output from the group's leader.

    Called as `(*inputs, *parameters)`: the group's Parameters (this process's unused copies)
    are inputs only so that the output takes part in autograd exactly where the members' real
    output does; the backward gives zeros (the real gradients are the members' and arrive
    through `RecvInputGradient`). A call is one autograd node (`_RemoteOutputNode`, as `_Identity`).
    """

    def __init__(self, leader: int, what: str):
        self.leader, self.what = leader, what

    def __call__(self, *args):
        return _RemoteOutputNode.apply(self, *args)

    def receive(self):
        """The group's output from its leader: a Tensor or a tuple of Tensors."""
        arrays = recv_arrays(self.leader, self.what)  # [structure flag, outputs...]
        tensors = tuple(Tensor(a) for a in arrays[1:])
        return tensors[0] if int(arrays[0][0]) == 0 else tensors


class _RemoteOutputNode(_Function):
    """A `RemoteGroupOutput` call as one autograd node: zero gradients for its arguments."""

    @staticmethod
    def forward(ctx, remote, *args):  # pylint: disable=arguments-differ
        ctx.args = args
        return remote.receive()

    @staticmethod
    def backward(ctx, *dout):  # pylint: disable=arguments-differ
        return (None,) + tuple(ops.zeros_like(a) for a in ctx.args)
