"""Moving token rows between the members of an expert group: the uneven AllToAll of dispatch
and combine.

Rows travel as segments: a source sends, for every expert, the rows of the token copies routed to
it (possibly none). `InProcessExchange` (simulation: every member in this process) hands the
segment tensors over, so autograd carries the gradients back. `ProcessExchange` (msrun: one
member per process) packs a source's segments for each destination into one buffer and sends
them with the communication library's uneven all-to-all (`all_to_all_v` of the shared-memory
transport); its backward is the reverse all-to-all of the gradient rows. The receivers learn the
segment sizes first from a small metadata exchange: per-expert counts (int64), or with
`routing_bits` the bit-packed token x expert mask (`mindspore_hyper.moe.routing_bits`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
from mindspore import Tensor, nn, ops

__all__ = ["Segments", "InProcessExchange", "ProcessExchange", "RowExchange"]

# Segments[member][expert] -> rows Tensor or None; "member" is the peer (source or destination)
Segments = Dict[int, Dict[int, Optional[Tensor]]]


class RowExchange(nn.Cell):
    """One uneven all-to-all of rows [N, H] over a communicator; backward: the reverse one.

    Args:
        comm: the group's communicator (numpy `all_to_all_v(x, send_counts)`).
        send_rows: rows to each member, in member order.
        recv_rows: rows from each member, in member order.
        hidden: H.
        record: called with the bytes this member sends forward (the backward moves as many).
    """

    def __init__(self, comm, send_rows: Sequence[int], recv_rows: Sequence[int], hidden: int, record=None,
                 ready: Optional[np.ndarray] = None):
        super().__init__()
        self.comm, self.hidden, self.record = comm, hidden, record
        self.send_rows, self.recv_rows = list(send_rows), list(recv_rows)
        self.ready = ready  # the forward's result, already moved in the background

    def _move(self, x: Tensor, send_rows: List[int], recv_rows: List[int]) -> Tensor:
        buf = move_rows(self.comm, x.asnumpy(), send_rows, recv_rows, self.hidden)
        return Tensor(buf.reshape(-1, self.hidden), dtype=x.dtype)

    def construct(self, x):
        if self.ready is not None:
            return Tensor(self.ready.reshape(-1, self.hidden), dtype=x.dtype)
        if self.record is not None:
            self.record(int(np.prod(x.shape)) * x.dtype.itemsize)
        return self._move(x, self.send_rows, self.recv_rows)

    def bprop(self, x, out, dout):
        return (self._move(dout, self.recv_rows, self.send_rows),)


def move_rows(comm, rows: np.ndarray, send_rows: Sequence[int], recv_rows: Sequence[int], hidden: int) -> np.ndarray:
    """The numpy uneven all-to-all of rows [N, H]: send_rows[j] rows to member j; returns the
    received rows flat, in source order (checked against recv_rows)."""
    arr = np.ascontiguousarray(rows.reshape(-1))
    buf, counts = comm.all_to_all_v(arr, [int(r) * hidden for r in send_rows])
    expect = [int(r) * hidden for r in recv_rows]
    if list(counts) != expect:
        raise RuntimeError(f"expert all-to-all: received {list(counts)} elements per member, expected {expect}")
    return buf


def _concat(parts: List[Tensor], hidden: int, dtype) -> Tensor:
    parts = [p for p in parts if p is not None]
    if not parts:
        return ops.zeros((0, hidden), dtype)
    return parts[0] if len(parts) == 1 else ops.concat(parts, 0)


def _split(flat: Tensor, sizes: Sequence[int]) -> List[Optional[Tensor]]:
    out, start = [], 0
    for n in sizes:
        out.append(flat[start:start + n] if n else None)
        start += n
    return out


class InProcessExchange:
    """Every member of the group is in this process: segments change hands (see module docstring).
    `record(nbytes)` is told what each member would send (member 0's share)."""

    def __init__(self, record=None):
        self.record = record

    def exchange(self, sends: Dict, recording_source) -> Dict:
        """sends[src][dst][expert] -> received[dst][src][expert]; the bytes `recording_source`
        sends to the others are recorded."""
        received: Dict = {}
        sent = 0
        for src, by_dst in sends.items():
            for dst, segs in by_dst.items():
                received.setdefault(dst, {})[src] = segs
                if src == recording_source and dst != src:
                    sent += sum(_nbytes(s) for s in segs.values() if s is not None)
        if self.record is not None:
            self.record(sent)
        return received


def _nbytes(t: Tensor) -> int:
    return int(np.prod(t.shape)) * t.dtype.itemsize


@dataclass
class ProcessExchange:
    """This process is member `index` of `size` (see module docstring).

    Attributes:
        comm: the group's communicator (shared-memory transport: `all_to_all_v`).
        index: this process's member index.
        size: members in the group.
        hidden: H.
        record: told the row bytes this member sends.
    """

    comm: object
    index: int
    size: int
    hidden: int
    record: object = None

    def counts(self, send_counts: np.ndarray) -> np.ndarray:
        """send_counts [members, experts per member] (rows to each destination's experts) ->
        recv_counts [members, experts per member] (rows from each source to mine)."""
        flat = np.ascontiguousarray(send_counts.astype(np.int64).reshape(-1))
        per = send_counts.shape[1]
        buf, _ = self.comm.all_to_all_v(flat, [per] * self.size)
        return buf.reshape(self.size, per)

    def flatten(self, segs: Segments, counts: np.ndarray, dtype) -> Tensor:
        """segs[member][slot] -> one [rows, H] tensor in (member, slot) order."""
        order = [segs.get(d, {}).get(s) for d in range(self.size) for s in range(counts.shape[1])]
        return _concat(order, self.hidden, dtype)

    def move(self, flat: np.ndarray, send_counts: np.ndarray, recv_counts: np.ndarray) -> np.ndarray:
        """The rows' all-to-all in numpy (safe on a background thread: no MindSpore op)."""
        if self.record is not None:
            self.record(flat.nbytes)
        return move_rows(self.comm, flat, send_counts.sum(1), recv_counts.sum(1), self.hidden)

    def receive(self, flat: Tensor, moved: np.ndarray, send_counts: np.ndarray, recv_counts: np.ndarray) -> Segments:
        """The differentiable result of the exchange of `flat` (already `moved`): received[src][slot]."""
        cell = RowExchange(self.comm, send_counts.sum(1).tolist(), recv_counts.sum(1).tolist(), self.hidden,
                           ready=moved)
        pieces = _split(cell(flat), recv_counts.reshape(-1).tolist())
        per = recv_counts.shape[1]
        return {src: {s: pieces[src * per + s] for s in range(per)} for src in range(self.size)}
