"""Moving token rows between the members of an expert group: the uneven AllToAll of dispatch
and combine.

Rows travel as segments: a source sends, for every expert slot, the rows of the token copies
routed to it (possibly none). The three exchanges offer one interface, so a dispatch scheme runs
its plan on whichever the mode needs: `start(sends[source key][address][slot], counts ...)` and
`finish()` -> received[dest key][source address][slot], `exchange_counts` and `exchange_bytes`
for the metadata, `address`/`member_of` for the members' names.

`InProcessExchange` (simulation: every member in this process) hands the segment tensors over,
so autograd carries the gradients back; `LibraryExchange` (simulation with
`sim_collectives="library"`) moves them through the C++ library's in-process `all_to_all_v`.
`ProcessExchange` (msrun: one member per process) packs a source's segments for each destination
into one buffer and sends them with the communication library's uneven all-to-all
(`all_to_all_v` of the shared-memory transport); its backward is the reverse all-to-all of the
gradient rows. The receivers learn the segment sizes first from a small metadata exchange:
per-expert counts (int64), or with `routing_bits` the bit-packed token x expert mask
(`mindspore_hyper.moe.routing_bits`).
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from mindspore import Tensor, ops
from mindspore.common import _Function

from mindspore_hyper.comm.inprocess_collectives import nbytes_of

__all__ = ["Segments", "InProcessExchange", "LibraryExchange", "ProcessExchange", "RowExchange", "move_rows",
           "split_rows"]

# Segments[member][expert] -> rows Tensor or None; "member" is the peer (source or destination)
Segments = Dict[int, Dict[int, Optional[Tensor]]]


class RowExchange:
    """The autograd face of one uneven all-to-all of rows [N, H] whose forward already moved
    (`moved`, e.g. on the background thread); backward: the reverse all-to-all. Calling it on
    the sent rows `x` gives the received rows as one node of MindSpore's PyNative autograd graph
    (`_RowExchangeNode`, a custom autograd function, not a Cell with a custom `bprop`): both
    `mindspore.value_and_grad` and `run_backward` (torch-style `loss.backward()`) differentiate it.

    Args:
        comm: the group's communicator (numpy `all_to_all_v(x, send_counts)`).
        send_rows: rows to each member, in member order.
        recv_rows: rows from each member, in member order.
        hidden: H.
        moved: the received rows, flat, as the forward exchange returned them.
    """

    def __init__(self, comm, send_rows: Sequence[int], recv_rows: Sequence[int], hidden: int, moved: np.ndarray):
        self.comm, self.hidden, self.moved = comm, hidden, moved
        self.send_rows, self.recv_rows = list(send_rows), list(recv_rows)

    def __call__(self, x: Tensor) -> Tensor:
        return _RowExchangeNode.apply(x, self)

    def forward(self, x: Tensor) -> Tensor:
        """The received rows [sum(recv_rows), H] in x's dtype."""
        return Tensor(self.moved.reshape(-1, self.hidden), dtype=x.dtype)

    def backward(self, dout: Tensor) -> Tensor:
        """The received rows' gradient sent back to their sources: the sent rows' gradient."""
        back = move_rows(self.comm, dout.asnumpy(), self.recv_rows, self.send_rows, self.hidden)
        return Tensor(back.reshape(-1, self.hidden), dtype=dout.dtype)


class _RowExchangeNode(_Function):
    """A `RowExchange` as one autograd node."""

    @staticmethod
    def forward(ctx, x, exchange):  # pylint: disable=arguments-differ
        ctx.exchange = exchange
        return exchange.forward(x)

    @staticmethod
    def backward(ctx, dout):  # pylint: disable=arguments-differ
        return ctx.exchange.backward(dout), None


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


def split_rows(flat: Tensor, sizes: Sequence[int]) -> List[Optional[Tensor]]:
    """`flat` [sum(sizes), ...] cut into pieces of `sizes` rows (None for 0) by one Split op
    (Python slicing of a Tensor costs a StridedSlice with heavy per-call overhead each)."""
    nonzero = [int(n) for n in sizes if n]
    if not nonzero:
        return [None] * len(sizes)
    pieces = iter([flat] if len(nonzero) == 1 else ops.split(flat, nonzero, 0))
    return [next(pieces) if n else None for n in sizes]


class InProcessExchange:
    """Every member of the expert groups is in this process (see module docstring): segments
    change hands, addressed by the members' token keys; `start` hands them over (the counts,
    `width`, `move`, `run` and `wait` are the process exchange's). `record(nbytes)` is told what
    the first device sends to the others."""

    last_output = None  # nothing to chain (see `ProcessExchange.chained`)

    def __init__(self, ex, axes, record=None):
        self.ex, self.axes, self.record = ex, axes, record
        self._received = None

    def address(self, key, member: int):
        """How member `member` of token key `key`'s expert group is addressed: its token key."""
        return self.axes.key_of_member(self.ex, key, member)

    def member_of(self, address) -> int:
        return self.axes.member(self.ex, address)

    def start(self, sends: Dict, send_counts=None, recv_counts=None, dtype=None, width=None, move=None,
              run=None) -> None:
        self._received = self.exchange(sends)

    def start_back(self, sends: Dict, dtype=None, run=None) -> None:
        """The reverse exchange (combine): the same hand-over."""
        self.start(sends)

    def finish(self, wait=None) -> Dict:
        received, self._received = self._received, None
        return received

    def exchange_counts(self, counts: Dict, record=None) -> Dict:
        """{key: send counts [members, k]} -> {key: recv counts [members, k]}: handed over (in
        process nothing needs to travel first, so nothing is recorded)."""
        recv = {key: np.zeros_like(c) for key, c in counts.items()}
        for src, c in counts.items():
            for m in range(c.shape[0]):
                recv[self.address(src, m)][self.member_of(src)] = c[m]
        return recv

    def exchange_bytes(self, data: Dict, record=None) -> Dict:
        """{key: {address: bytes}} -> {key: {source address: bytes}}: handed over (not recorded)."""
        out: Dict = {key: {} for key in data}
        for src, by_dst in data.items():
            for dst, b in by_dst.items():
                out[dst][src] = b
        return out

    def exchange(self, sends: Dict) -> Dict:
        """sends[src][dst][expert] -> received[dst][src][expert]; the bytes the first device
        sends to the others are recorded."""
        recording_source = self.ex.keys(self.axes.token)[0]
        received: Dict = {}
        sent = 0
        for src, by_dst in sends.items():
            for dst, segs in by_dst.items():
                received.setdefault(dst, {})[src] = segs
                if src == recording_source and dst != src:
                    sent += sum(nbytes_of(s) for s in segs.values() if s is not None)
        if self.record is not None:
            self.record(sent)
        return received


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
    last_output: Optional[Tensor] = None  # the last `receive`'s exchanged rows, for `chained`
    _started: Optional[tuple] = None  # (key, rows sent, send counts, width, future) of the exchange under way
    _counts: Optional[tuple] = None  # (send, recv) row counts of the last finished exchange

    # -- the schemes' interface (see `InProcessExchange`) -----------------------------------------
    @staticmethod
    def address(key, member: int) -> int:
        """How member `member` of the expert group is addressed: its member index."""
        return member

    @staticmethod
    def member_of(address: int) -> int:
        return address

    def start(self, sends: Dict, send_counts: Dict, recv_counts: Optional[Dict] = None, dtype=None,
              width: Optional[int] = None, move=None, run=None) -> None:
        """Flatten this member's sends {key: {member: {slot: rows}}} (chained to the previous
        exchange) and start moving them: `run(job)` -> Future (None: now, on this thread). The
        job moves them with the known `recv_counts` {key: counts}, or is `move(flat rows)` ->
        (recv counts, moved rows) when the receivers learn the counts in it. `width`: the rows'
        columns if not H."""
        (key, by_dest), = sends.items()
        rows = self if width is None else replace(self, hidden=width)
        counts = send_counts[key]
        flat = self.chained(rows.flatten(by_dest, counts, dtype), self.last_output)
        moving = flat.asnumpy()
        if move is None:
            recv = recv_counts[key]

            def move():
                return recv, rows.move(moving, counts, recv)
        else:
            job = move

            def move():
                return job(moving)
        if run is None:
            future: Future = Future()
            future.set_result(move())
        else:
            future = run(move)
        self._started = (key, flat, counts, rows, future)

    def start_back(self, sends: Dict, dtype=None, run=None) -> None:
        """The reverse of the last finished exchange (combine): its counts swapped."""
        key = next(iter(sends))
        send, recv = self._counts
        self.start(sends, {key: recv}, {key: send}, dtype, run=run)

    def finish(self, wait=None) -> Dict:
        """{key: received[source member][slot]} of the exchange under way (`wait(future)`: its result)."""
        key, flat, counts, rows, future = self._started
        self._started = None
        recv, moved = future.result() if wait is None else wait(future)
        received = rows.receive(flat, moved, counts, recv)
        self.last_output = rows.last_output
        self._counts = (counts, recv)
        return {key: received}

    def exchange_counts(self, counts: Dict, record=None) -> Dict:
        """{key: send counts [members, k]} -> {key: recv counts [members, k]} (int64, recorded)."""
        (key, send), = counts.items()
        if record is not None:
            record(send.size * 8)
        return {key: self.counts(send)}

    def exchange_bytes(self, data: Dict, record=None) -> Dict:
        """{key: {member: uint8 bytes}} -> {key: {source member: uint8 bytes}} (recorded)."""
        (key, by_dest), = data.items()
        parts = [by_dest.get(m, np.zeros(0, np.uint8)) for m in range(self.size)]
        packed = np.concatenate(parts)
        if record is not None:
            record(int(packed.size))
        buf, got = self.comm.all_to_all_v(packed, [int(p.size) for p in parts])
        ends = np.cumsum(got)
        return {key: {src: buf[ends[src] - got[src]:ends[src]] for src in range(self.size)}}

    @staticmethod
    def chained(flat: Tensor, previous: Optional[Tensor]) -> Tensor:
        """`flat` made to depend (times 0) on the previous exchange's output, so every process
        runs the backward AllToAlls in the same (reverse) order even when an exchange received
        no rows here (its output otherwise unused: its backward would be skipped here only)."""
        return flat if previous is None else flat + previous.sum() * 0.0

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

    def move_counted(self, flat: np.ndarray, send_counts: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """The rows' all-to-all with each destination's row counts per expert slot in the same
        message (int64 header before its rows, reinterpreted in the rows' dtype): one
        rendezvous instead of a counts exchange and then the rows. Returns (recv_counts
        [members, slots], the received rows flat in source order)."""
        dtype = np.dtype(flat.dtype)
        if 8 % dtype.itemsize:
            raise ValueError(f"expert all-to-all: cannot carry int64 counts in rows of {dtype}")
        header = np.ascontiguousarray(send_counts.astype(np.int64)).view(dtype)  # [members, slots * 8 / itemsize]
        width = header.shape[1]
        rows = np.ascontiguousarray(flat).reshape(-1)
        ends = np.cumsum(send_counts.sum(1)) * self.hidden
        parts, start = [], 0
        for m in range(self.size):
            parts += [header[m], rows[start:ends[m]]]
            start = ends[m]
        if self.record is not None:
            self.record(rows.nbytes)
        buf, counts = self.comm.all_to_all_v(np.concatenate(parts), [width + int(n) * self.hidden
                                                                     for n in send_counts.sum(1)])
        recv_counts = np.empty((self.size, send_counts.shape[1]), np.int64)
        pieces, pos = [], 0
        for src, n in enumerate(counts):
            recv_counts[src] = buf[pos:pos + width].copy().view(np.int64)
            pieces.append(buf[pos + width:pos + int(n)])
            pos += int(n)
        moved = np.concatenate(pieces)
        if moved.size != int(recv_counts.sum()) * self.hidden:
            raise RuntimeError(f"expert all-to-all: received {moved.size} elements, the counts say "
                               f"{int(recv_counts.sum()) * self.hidden}")
        return recv_counts, moved

    def receive(self, flat: Tensor, moved: np.ndarray, send_counts: np.ndarray, recv_counts: np.ndarray) -> Segments:
        """The differentiable result of the exchange of `flat` (already `moved`): received[src][slot]."""
        cell = RowExchange(self.comm, send_counts.sum(1).tolist(), recv_counts.sum(1).tolist(), self.hidden, moved)
        self.last_output = cell(flat)
        pieces = split_rows(self.last_output, recv_counts.reshape(-1).tolist())
        per = recv_counts.shape[1]
        return {src: {s: pieces[src * per + s] for s in range(per)} for src in range(self.size)}


class _LibraryAllToAllV:
    """The uneven all-to-all of every member's rows through the C++ library's in-process
    transport (`InProcessCommunicator.all_to_all_v`); backward: the reverse one. Called on the
    members' rows, it is one autograd node (`_LibraryAllToAllVNode`) that both
    `mindspore.value_and_grad` and `run_backward` (`loss.backward()`) differentiate."""

    def __init__(self, group, send_rows: List[List[int]], hidden: int):
        self.group, self.send_rows, self.hidden = group, send_rows, hidden

    def move(self, xs, counts) -> tuple:
        """Member i's rows xs[i] split counts[i][j] rows to member j: each member's received rows."""
        arrays = [np.ascontiguousarray(x.asnumpy().reshape(-1)) for x in xs]
        res = self.group.all_to_all_v(arrays, [[r * self.hidden for r in row] for row in counts])
        return tuple(Tensor(buf.reshape(-1, self.hidden), dtype=xs[0].dtype) for buf, _ in res)

    def __call__(self, *xs) -> tuple:
        return _LibraryAllToAllVNode.apply(self, *xs)

    def backward(self, douts) -> tuple:
        """The received rows' gradients moved back: the sent rows' gradients."""
        n = len(self.send_rows)
        back = [[self.send_rows[j][i] for j in range(n)] for i in range(n)]  # member i sends back what it got
        return self.move(douts, back)


class _LibraryAllToAllVNode(_Function):
    """A `_LibraryAllToAllV` as one autograd node."""

    @staticmethod
    def forward(ctx, exchange, *xs):  # pylint: disable=arguments-differ
        ctx.exchange = exchange
        return exchange.move(xs, exchange.send_rows)

    @staticmethod
    def backward(ctx, *douts):  # pylint: disable=arguments-differ
        return (None,) + ctx.exchange.backward(douts)


class LibraryExchange(InProcessExchange):
    """Every member in this process, rows moved by the communication library's in-process
    transport (simulation with `sim_collectives="library"`), one all-to-all per expert group
    (`record(nbytes)`: the first group's member 0's bytes)."""

    def __init__(self, ex, axes, hidden: int, record=None):
        super().__init__(ex, axes, record)
        self.hidden = hidden

    def exchange(self, sends: Dict) -> Dict:
        """sends[src key][dst key][slot] -> received[dst key][src key][slot]."""
        axes, ex = self.axes, self.ex
        groups: Dict[tuple, List] = {}
        for key in sends:  # expert groups: keys that differ only on the expert axes
            rest = tuple(c for a, c in zip(axes.token, key) if a not in axes.expert)
            groups.setdefault(rest, []).append(key)
        received = {}
        for i, members in enumerate(groups.values()):
            members.sort(key=lambda k: axes.member(ex, k))
            received.update(self._group_exchange(sends, members, self.record if i == 0 else None))
        return received

    def _group_exchange(self, sends: Dict, members: Sequence, record) -> Dict:
        """sends[src][dst][slot] over the group `members` (keys, member order) ->
        received[dst][src][slot]."""
        from mindspore_hyper.comm.library_collectives import _group

        n = len(members)
        flats, counts, sizes = [], [], {}
        dtype = None
        for src in members:
            parts, row = [], []
            for dst in members:
                segs = sends[src].get(dst, {})
                rows = 0
                for slot in sorted(segs):
                    t = segs[slot]
                    sizes[(src, dst, slot)] = 0 if t is None else int(t.shape[0])
                    if t is not None:
                        parts.append(t)
                        dtype = t.dtype
                        rows += int(t.shape[0])
                row.append(rows)
            flats.append(parts)
            counts.append(row)
        if dtype is None:  # nothing moves at all
            return {dst: {src: {slot: None for slot in sends[src].get(dst, {})} for src in members} for dst in members}
        flats = [_concat(parts, self.hidden, dtype) for parts in flats]
        if record is not None:
            record(sum(counts[0][j] for j in range(1, n)) * self.hidden * dtype.itemsize)
        outs = _LibraryAllToAllV(_group(n), counts, self.hidden)(*flats) if n > 1 else (flats[0],)
        received: Dict = {}
        for j, dst in enumerate(members):
            where = [(src, slot) for src in members for slot in sorted(sends[src].get(dst, {}))]
            pieces = split_rows(outs[j], [sizes[(src, dst, slot)] for src, slot in where])
            for (src, slot), piece in zip(where, pieces):
                received.setdefault(dst, {}).setdefault(src, {})[slot] = piece
        return received
