"""A network as levels of domains: devices inside a node on NVLink / HCCS, nodes on InfiniBand /
RoCE, ... -- the topology of a cluster too large for a device graph (thousands of devices), as
the step-time estimator sees it (`estimate.Hardware.levels`, configs/hardware/*.yaml).

Level i groups `devices` devices into one domain (a node for level 0, the whole cluster for the
last); each domain size divides the next. Within a level every device sends `bandwidth` bytes/s
each way and a message step costs `latency` seconds. `Topology.from_levels` builds the device
graph of a small cluster of such levels (node8 is two levels: 8 devices at 1 us / 56 GB/s, 16 at
10 us / 12.5 GB/s); `cost.hierarchical_time` is the alpha-beta time of a collective over the
levels a group spans, `group_fanouts` says how a group spreads over them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Tuple

__all__ = ["Level", "group_fanouts", "levels_spanned"]


@dataclass(frozen=True)
class Level:
    """One level of the network (NVLink inside a node, InfiniBand between nodes, ...).

    Attributes:
        name: the level's name.
        devices: devices in one domain of this level (8 for a node); a collective whose group fits
            one domain of a lower level never uses this one.
        bandwidth: bytes/s one device can send at this level (each direction).
        latency: seconds per message step at this level (alpha).
    """

    name: str
    devices: int
    bandwidth: float
    latency: float


def group_fanouts(levels: Sequence[Level], size: int, stride: int = 1, network: str = "the network") -> Tuple[int, ...]:
    """f_i per level for a group of `size` ranks `stride` apart (device ids r, r + stride, ...):
    how many level-(i-1) domains (devices at level 0) of the group one level-i domain holds, so
    that size = f_0 x f_1 x ...

    Args:
        levels: the network's levels, innermost first.
        size: ranks in the group.
        stride: device ids between neighbouring ranks of the group.
        network: the network's name in errors.

    Raises:
        ValueError: the group needs more devices than the largest domain.
    """
    if size < 1 or stride < 1:
        raise ValueError(f"size={size}, stride={stride}: expected ints >= 1")
    if size > 1 and size * stride > levels[-1].devices:
        raise ValueError(f"a group of {size} ranks {stride} apart spans {size * stride} devices; {network} has "
                         f"{levels[-1].devices}")
    fanouts, inside = [], 1
    for level in levels:
        members = size if stride * size <= level.devices else max(1, min(size, level.devices // stride))
        fanouts.append(members // inside)
        inside = members
    return tuple(fanouts)


def levels_spanned(levels: Sequence[Level], fanouts: Sequence[int]) -> Tuple[str, ...]:
    """Names of the levels a group with these fan-outs communicates over."""
    return tuple(level.name for level, f in zip(levels, fanouts) if f > 1)
