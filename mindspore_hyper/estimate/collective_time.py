"""Alpha-beta time of one collective over the hardware's network levels (pure Python).

A group of `size` ranks `stride` apart (the ranks of one mesh axis: tensor innermost, then
context, data, pipeline outermost) spans the levels its members fall into. Per level i, f_i is
how many level-(i-1) domains (devices at level 0) of the group one level-i domain holds, so
size = f_0 x f_1 x ...; alpha_i = latency_i + message overhead, beta_i = 1 / (bandwidth_i x
network efficiency). With n the bytes of the formula and n_i = n / (f_0 ... f_{i-1}) what is left
after the inner levels reduced or split it (hierarchical algorithms, as NCCL's and HCCL's):

* all_reduce:      sum_i 2 (f_i - 1) alpha_i + 2 (f_i - 1) / f_i  n_i beta_i
* all_gather, reduce_scatter (n = the full, unsplit buffer):
                   sum_i (f_i - 1) alpha_i + (f_i - 1) / f_i  n_i beta_i
* all_to_all (n = what one rank sends in total): the share of peers first reached at level i,
  (P_i - P_{i-1}) / P with P_i = f_0 ... f_i:  sum_i (P_i - P_{i-1}) (alpha_i + n beta_i / P)
* send_recv (two ranks `stride` apart): alpha + n beta of the level the pair spans.

Every collective of two or more ranks also pays the hardware's `peer_wait` once (0 on the
presets; the `cpu` profile's measured wait for peers that share the cores). `transfer_seconds`
is the send_recv without it: a pipeline's stage-to-stage transfer, whose receiver's wait for a
late sender the schedule simulation already times.

With one level this is the ring formula of `mindspore_hyper.comm.cost` (2(p-1)a + 2(p-1)/p n b
for all_reduce), which the tests check against the C++ cost model.
"""
from __future__ import annotations

import math
from typing import Tuple

from mindspore_hyper.estimate.hardware import Hardware

__all__ = ["COLLECTIVES", "group_fanouts", "collective_seconds", "transfer_seconds", "levels_spanned"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def group_fanouts(hardware: Hardware, size: int, stride: int = 1) -> Tuple[int, ...]:
    """f_i per level for a group of `size` ranks `stride` apart (device ids r, r + stride, ...).

    Raises:
        ValueError: the group needs more devices than the hardware's largest domain.
    """
    if size < 1 or stride < 1:
        raise ValueError(f"size={size}, stride={stride}: expected ints >= 1")
    if size > 1 and size * stride > hardware.max_devices:
        raise ValueError(f"a group of {size} ranks {stride} apart spans {size * stride} devices; hardware "
                         f"{hardware.name!r} has {hardware.max_devices}")
    fanouts, inside = [], 1
    for level in hardware.levels:
        members = size if stride * size <= level.devices else max(1, min(size, level.devices // stride))
        fanouts.append(members // inside)
        inside = members
    return tuple(fanouts)


def levels_spanned(hardware: Hardware, fanouts: Tuple[int, ...]) -> Tuple[str, ...]:
    """Names of the levels a group with these fan-outs communicates over."""
    return tuple(level.name for level, f in zip(hardware.levels, fanouts) if f > 1)


def collective_seconds(kind: str, nbytes: float, hardware: Hardware, fanouts: Tuple[int, ...]) -> float:
    """Seconds of one collective (formulas in the module doc); a group of one rank costs 0.

    Args:
        kind: one of COLLECTIVES.
        nbytes: the formula's n in bytes.
        hardware: levels and efficiency.
        fanouts: from `group_fanouts` (for send_recv: of the two-rank group).

    Raises:
        ValueError: unknown kind or negative bytes.
    """
    if kind not in COLLECTIVES:
        raise ValueError(f"kind={kind!r}: expected one of {', '.join(COLLECTIVES)}")
    if nbytes < 0:
        raise ValueError(f"nbytes={nbytes!r}: expected >= 0")
    eff = hardware.efficiency
    total, inner, seconds = math.prod(fanouts), 1, eff.peer_wait
    if total <= 1:
        return 0.0
    if kind == "send_recv":
        return eff.peer_wait + transfer_seconds(nbytes, hardware, fanouts)
    for level, f in zip(hardware.levels, fanouts):
        if f <= 1:
            continue
        alpha = level.latency + eff.message_overhead
        beta = 1.0 / (level.bandwidth * eff.network)
        share = nbytes / inner
        if kind == "all_reduce":
            seconds += 2 * (f - 1) * alpha + 2 * (f - 1) / f * share * beta
        elif kind in ("all_gather", "reduce_scatter"):
            seconds += (f - 1) * alpha + (f - 1) / f * share * beta
        else:  # all_to_all
            peers = inner * f - inner
            seconds += peers * (alpha + nbytes * beta / total)
        inner *= f
    return seconds


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
    if nbytes < 0:
        raise ValueError(f"nbytes={nbytes!r}: expected >= 0")
    eff, seconds = hardware.efficiency, 0.0
    for level, f in zip(hardware.levels, fanouts):
        if f > 1:
            alpha = level.latency + eff.message_overhead
            beta = 1.0 / (level.bandwidth * eff.network)
            seconds = alpha + nbytes * beta
    return seconds
