"""Deadlock check: run every rank's action list against the others and report a wait cycle.

Compute actions never block (their local inputs are checked by the order rule). A receive blocks
until the matching send has run. Sends are either *buffered* (the send returns once the tensor is
handed to the transport: isend, a sender thread, a mailbox) or *rendezvous* (the send returns only
when the receiver takes the tensor). The runtime contract is buffered: with rendezvous sends the
textbook 1F1B order deadlocks in its first steady step (rank i sends an activation to rank i+1
while rank i+1 sends a gradient to rank i), which is why pipeline runtimes post sends
asynchronously.
"""
from __future__ import annotations

from typing import List, Sequence, Set, Tuple

from mindspore_hyper.schedule.actions import Action, ActionKind, P2PTensor
from mindspore_hyper.schedule.errors import ScheduleError

__all__ = ["check_deadlock"]


def check_deadlock(actions: Sequence[Sequence[Action]], sends: str = "buffered") -> None:
    """Raise ScheduleError("deadlock") naming the ranks and actions of a wait cycle, if there is one.

    Sends and receives must already pair up (the pairing rule), so every blocked rank waits for a
    peer that is itself blocked, and following the waits from any blocked rank reaches a cycle.

    Args:
        actions: per rank, the ordered actions.
        sends: "buffered" or "rendezvous" (see the module docstring).
    """
    pc = [0] * len(actions)
    sent: Set[P2PTensor] = set()
    progress = True
    while progress:
        progress = False
        for rank in range(len(actions)):
            while pc[rank] < len(actions[rank]) and _step(actions, pc, sent, rank, sends):
                progress = True
    blocked = [r for r in range(len(actions)) if pc[r] < len(actions[r])]
    if blocked:
        _raise_cycle(actions, pc, blocked[0], sends)


def _step(actions: Sequence[Sequence[Action]], pc: List[int], sent: Set[P2PTensor], rank: int, sends: str) -> bool:
    """Advance `rank` by one action if it can run now; return whether it did."""
    a = actions[rank][pc[rank]]
    if a.kind is ActionKind.RECV and sends == "buffered":
        if a.tensor not in sent:
            return False
    elif a.kind is ActionKind.SEND and sends == "buffered":
        sent.add(a.tensor)
    elif a.kind in (ActionKind.SEND, ActionKind.RECV):
        peer = a.peer
        partner = actions[peer][pc[peer]] if pc[peer] < len(actions[peer]) else None
        opposite = ActionKind.RECV if a.kind is ActionKind.SEND else ActionKind.SEND
        if partner is None or partner.kind is not opposite or partner.tensor != a.tensor:
            return False
        pc[peer] += 1
    pc[rank] += 1
    return True


def _raise_cycle(actions: Sequence[Sequence[Action]], pc: List[int], start: int, sends: str) -> None:
    path: List[int] = []
    rank = start
    while rank not in path:
        path.append(rank)
        rank = actions[rank][pc[rank]].peer
    cycle = path[path.index(rank):]
    links: List[Tuple[int, int, str]] = [(r, pc[r], str(actions[r][pc[r]])) for r in cycle]
    text = "; ".join(f"rank {r} blocks at #{i} '{a}' waiting for rank {actions[r][i].peer}" for r, i, a in links)
    ranks = " -> ".join(str(r) for r in cycle + [cycle[0]])
    raise ScheduleError("deadlock", f"wait cycle {ranks} with {sends} sends: {text}", cycle=tuple(links))
