"""The expert exchange of a dry run: token rows as shapes, one member held.

The dry run computes one device of the expert group and routes by the balanced assumption
(`router.balanced_choice`) or a given histogram (`router.histogram_choice`): either way every
device's tokens choose the same expert slots, so what member m sends to this member is what this
member sends to itself. The dispatch's received segments, counts and
metadata are therefore this member's own sends to itself, with the shapes (and bytes) a real
exchange would deliver; the combine (`start_back`) returns from each member the rows this member
sent it (under a skewed histogram members hold unequal loads, so what a member sends back is not
what this member returns to itself). The flat dispatch records every member's bytes itself
(`member_loads`, as in simulation); a `record` given here is told this member's.
"""
from __future__ import annotations

from typing import Dict

import numpy as np

from mindspore_hyper.comm.inprocess_collectives import nbytes_of
from mindspore_hyper.dtensor.meta import meta
from mindspore_hyper.moe.exchange import InProcessExchange

__all__ = ["ShapeExchange"]


def _fresh(segments: Dict) -> Dict:
    """Segments as new MetaTensors of the same shapes (received rows are new tensors)."""
    return {slot: None if rows is None else meta(tuple(rows.shape), rows.dtype, getattr(rows, "grad_path", False))
            for slot, rows in segments.items()}


class ShapeExchange(InProcessExchange):
    """The exchange interface of `moe.exchange` for a dry run (see module docstring): the
    in-process exchange's hand-over (`start_back`, `finish`), one member held, members addressed
    by index as under msrun.

    Args:
        ex: the dry run's Execution.
        axes: the call's token and expert axes.
        record: told the bytes this member sends to the others.
    """

    def __init__(self, ex, axes, record=None):
        super().__init__(ex, axes, record)
        self.index = axes.member(ex, ex.keys(axes.token)[0])
        self._dispatched: Dict = {}  # the last `start`'s segments by destination member

    @staticmethod
    def address(key, member: int) -> int:
        return member

    @staticmethod
    def member_of(address: int) -> int:
        return address

    def start(self, sends: Dict, send_counts=None, recv_counts=None, dtype=None, width=None, move=None,
              run=None) -> None:
        (key, by_dest), = sends.items()
        own = by_dest.get(self.index, {})
        sent = sum(nbytes_of(rows) for member, segs in by_dest.items() if member != self.index
                   for rows in segs.values() if rows is not None)
        if self.record is not None:
            self.record(sent)
        self._dispatched = by_dest
        self._received = {key: {member: _fresh(own) for member in range(self.axes.members)}}

    def start_back(self, sends: Dict, dtype=None, run=None) -> None:
        """The combine: the expert outputs go back (recorded as in `start`), and each member
        returns the rows this member dispatched to it, in the outputs' `dtype`."""
        dispatched = self._dispatched
        self.start(sends)
        (key, _), = sends.items()
        self._received = {key: {member: {
            slot: None if rows is None else meta(tuple(rows.shape), rows.dtype if dtype is None else dtype,
                                                 getattr(rows, "grad_path", False))
            for slot, rows in dispatched.get(member, {}).items()} for member in range(self.axes.members)}}

    def exchange_counts(self, counts: Dict, record=None) -> Dict:
        (key, send), = counts.items()
        if record is not None:
            record(send.size * 8)
        return {key: np.tile(send[self.index], (send.shape[0], 1))}

    def exchange_bytes(self, data: Dict, record=None) -> Dict:
        (key, by_dest), = data.items()
        own = by_dest.get(self.index, np.zeros(0, np.uint8))
        if record is not None:
            record(int(sum(np.asarray(p).size for p in by_dest.values())))
        return {key: {src: own for src in range(self.axes.members)}}
