"""Alpha-beta time of one collective over the hardware's network levels: the communication
library's model of a network of levels (`comm.levels`, `comm.cost.hierarchical_time`, formulas
there) with the hardware's efficiency factors.

A group of `size` ranks `stride` apart (the ranks of one mesh axis: tensor innermost, then
context, data, pipeline outermost) spans the levels its members fall into (`group_fanouts`).
Per level, alpha = latency + the hardware's message overhead and beta = 1 / (bandwidth x network
efficiency). Every collective of two or more ranks also pays the hardware's `peer_wait` once (0
on the presets; the `cpu` profile's measured wait for peers that share the cores).
`transfer_seconds` is the send_recv without it: a pipeline's stage-to-stage transfer, whose
receiver's wait for a late sender the schedule simulation already times.

With one level this is the ring formula of the C++ cost model (2(p-1)a + 2(p-1)/p n b for
all_reduce), which the tests check against it.
"""
from __future__ import annotations

from typing import Tuple

from mindspore_hyper.comm import levels
from mindspore_hyper.comm.cost import HIERARCHICAL_KINDS, hierarchical_time, transfer_time
from mindspore_hyper.estimate.hardware import Hardware

__all__ = ["COLLECTIVES", "group_fanouts", "collective_seconds", "transfer_seconds", "levels_spanned"]

COLLECTIVES = HIERARCHICAL_KINDS


def group_fanouts(hardware: Hardware, size: int, stride: int = 1) -> Tuple[int, ...]:
    """f_i per level for a group of `size` ranks `stride` apart (`comm.levels.group_fanouts`).

    Raises:
        ValueError: the group needs more devices than the hardware's largest domain.
    """
    return levels.group_fanouts(hardware.levels, size, stride, network=f"hardware {hardware.name!r}")


def levels_spanned(hardware: Hardware, fanouts: Tuple[int, ...]) -> Tuple[str, ...]:
    """Names of the levels a group with these fan-outs communicates over."""
    return levels.levels_spanned(hardware.levels, fanouts)


def _alphas_betas(hardware: Hardware) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """Each level's alpha (latency + message overhead) and beta (1 / achieved bandwidth)."""
    eff = hardware.efficiency
    return (tuple(level.latency + eff.message_overhead for level in hardware.levels),
            tuple(1.0 / (level.bandwidth * eff.network) for level in hardware.levels))


def collective_seconds(kind: str, nbytes: float, hardware: Hardware, fanouts: Tuple[int, ...]) -> float:
    """Seconds of one collective (`comm.cost.hierarchical_time` plus the peer wait); a group of
    one rank costs 0.

    Args:
        kind: one of COLLECTIVES.
        nbytes: the formula's n in bytes.
        hardware: levels and efficiency.
        fanouts: from `group_fanouts` (for send_recv: of the two-rank group).

    Raises:
        ValueError: unknown kind or negative bytes.
    """
    return hierarchical_time(kind, nbytes, *_alphas_betas(hardware), fanouts, fixed=hardware.efficiency.peer_wait)


def transfer_seconds(nbytes: float, hardware: Hardware, fanouts: Tuple[int, ...]) -> float:
    """Seconds of one point-to-point transfer between two ranks: alpha + n beta of the outermost
    level the pair spans, without the peer wait (module doc); 0 within one device.

    Args:
        nbytes: the message in bytes.
        hardware: levels and efficiency.
        fanouts: `group_fanouts` of the two-rank group.

    Raises:
        ValueError: negative bytes.
    """
    return transfer_time(nbytes, *_alphas_betas(hardware), fanouts)
