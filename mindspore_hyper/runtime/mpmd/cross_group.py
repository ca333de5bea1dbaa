"""Tensors crossing device groups between msrun processes, over the shared-memory transport.

Every process runs the model's code between groups on global tensors; a group's output is
computed by its members and sent by the group's leader (its first rank) to every other process,
and in the backward the gradient of the group's inputs goes the same way. Transfers are
point-to-point over one shared-memory channel per direction (sender -> receiver), each tensor
preceded by a small header (count, dtype, shape). Sends are handed to one sender thread per
process (the `Outbox`), so a process never blocks on a full channel while its peer is busy;
receives block the caller. A peer that died or stalls makes the receiver fail with the
transport's CommTimeout naming the peer, the group and the tensor; a failed send is raised by
the next cross-group operation of the sender.
"""
from __future__ import annotations

import atexit
import queue
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mindspore import Tensor, nn, ops

from mindspore_hyper.comm import CommError
from mindspore_hyper.comm.shm import ShmCommunicator, one_way_channel
from mindspore_hyper.runtime.distributed.world import world

__all__ = ["send_arrays", "recv_arrays", "send_output", "outbox", "Outbox", "SendInputGradient", "RecvInputGradient",
           "RemoteGroupOutput"]

_DTYPES = (np.float32, np.float16, np.float64, np.int32, np.int64, np.bool_, np.uint8, np.int8)
_HEADER = 10  # dtype code, ndim, up to 8 dims


def _channel(src: int, dst: int) -> ShmCommunicator:
    """The one-way channel src -> dst (member 0 sends, member 1 receives), made on first use by
    both ends; the sender's is used only by its Outbox thread, the receiver's by its main thread."""
    key = (src, dst)
    if key not in _CHANNELS:
        w = world()
        _CHANNELS[key] = one_way_channel(w.job, "x", src, dst, w.rank, w.timeout)
    return _CHANNELS[key]


_CHANNELS: Dict[Tuple[int, int], ShmCommunicator] = {}


class Outbox:
    """One sender thread per process: `post` queues arrays for a peer and returns at once."""

    def __init__(self):
        self._queue: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="mpmd-outbox", daemon=True)
        self._thread.start()

    def post(self, arrays: Sequence[np.ndarray], peer: int, what: str) -> None:
        self.check()
        self._queue.put(([np.ascontiguousarray(a) for a in arrays], peer, what))

    def flush(self) -> None:
        """Wait until every posted send was handed to its channel; raise a failed send."""
        self._queue.join()
        self.check()

    def check(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._error is None:
                    _send_now(*item)
            except BaseException as exc:  # noqa: BLE001 - reported to the main thread
                self._error = exc
            finally:
                self._queue.task_done()


_OUTBOX: Optional[Outbox] = None


def outbox() -> Outbox:
    """This process's Outbox (started on first use, drained at exit)."""
    global _OUTBOX
    if _OUTBOX is None:
        _OUTBOX = Outbox()
        atexit.register(_OUTBOX.close)
    return _OUTBOX


def send_arrays(arrays: Sequence[np.ndarray], peer: int, what: str) -> None:
    """Queue `arrays` (count, then header + data each) for global rank `peer`."""
    outbox().post(arrays, peer, what)


def _send_now(arrays: Sequence[np.ndarray], peer: int, what: str) -> None:
    comm, index = _channel(world().rank, peer), 1
    try:
        comm.send(np.array([len(arrays)], np.int64), index)
        for a in arrays:
            a = np.ascontiguousarray(a)
            code = next(i for i, d in enumerate(_DTYPES) if a.dtype == d)
            if a.ndim > _HEADER - 2:
                raise ValueError(f"{what}: a {a.ndim}-d tensor; at most {_HEADER - 2} dimensions cross groups")
            header = np.zeros(_HEADER, np.int64)
            header[:2 + a.ndim] = [code, a.ndim, *a.shape]
            comm.send(header, index)
            if a.size:
                comm.send(a, index)
    except CommError as exc:
        raise type(exc)(f"{what}: sending to rank {peer} (this is rank {world().rank}): {exc}") from None


def recv_arrays(peer: int, what: str) -> List[np.ndarray]:
    """Receive the arrays `send_arrays` sent from global rank `peer` (blocks)."""
    outbox().check()
    comm, index = _channel(peer, world().rank), 0
    try:
        count = int(comm.recv((1,), np.int64, index)[0])
        out = []
        for _ in range(count):
            header = comm.recv((_HEADER,), np.int64, index)
            dtype, ndim = _DTYPES[int(header[0])], int(header[1])
            shape = tuple(int(d) for d in header[2:2 + ndim])
            out.append(comm.recv(shape, dtype, index) if int(np.prod(shape)) else np.zeros(shape, dtype))
        return out
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


class SendInputGradient(nn.Cell):
    """Identity on a group input in the leader; its backward sends the input's gradient (whole,
    as every member holds it) to the processes outside the group."""

    def __init__(self, peers: Sequence[int], what: str):
        super().__init__()
        self.peers, self.what = tuple(peers), what

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        grad = dout.asnumpy()
        for peer in self.peers:
            send_arrays([grad], peer, self.what)
        return (dout,)


class RecvInputGradient(nn.Cell):
    """Identity on a group input outside the group; its backward receives the input's gradient
    from the group's leader (the local gradient, which is zero, is replaced)."""

    def __init__(self, leader: int, what: str):
        super().__init__()
        self.leader, self.what = leader, what

    def construct(self, x):
        return x

    def bprop(self, x, out, dout):
        (grad,) = recv_arrays(self.leader, self.what)
        return (_tensor(grad, dout),)


class RemoteGroupOutput(nn.Cell):
    """A group's call in a process outside the group: receives the output from the group's leader.

    Called as `(*inputs, *parameters)`: the group's Parameters (this process's unused copies)
    are inputs only so that the output takes part in autograd exactly where the members' real
    output does; the backward gives zeros (the real gradients are the members' and arrive
    through `RecvInputGradient`).
    """

    def __init__(self, leader: int, what: str):
        super().__init__()
        self.leader, self.what = leader, what

    def construct(self, *args):
        arrays = recv_arrays(self.leader, self.what)  # [structure flag, outputs...]
        tensors = tuple(Tensor(a) for a in arrays[1:])
        return tensors[0] if int(arrays[0][0]) == 0 else tensors

    def bprop(self, *args):
        return tuple(ops.zeros_like(a) for a in args[:-2])
