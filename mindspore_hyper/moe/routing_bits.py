"""1-bit routing: the T x E routing mask bit-packed into ceil(T*E/8) bytes (C++ core).

Under expert parallelism a source sends each destination the columns of its routing mask for
that destination's experts; since rows travel grouped by expert in token order, the mask alone
tells the receiver how many rows each of its experts gets from the source (and which tokens
they are), instead of int32 expert indices plus float32 gates per token copy (8*T*k bytes) or a
float routing matrix (4*T*E bytes).
"""
from __future__ import annotations

import numpy as np

from mindspore_hyper import _core
from mindspore_hyper.moe.token_dispatch import DispatchPlan

__all__ = ["pack_routing", "unpack_routing", "packed_routing_bytes", "exchange_routing_mask"]


def packed_routing_bytes(num_tokens: int, num_experts: int) -> int:
    """ceil(T * E / 8)."""
    return (num_tokens * num_experts + 7) // 8


def pack_routing(mask) -> np.ndarray:
    """Pack a [T, E] bool (or 0/1 integer) mask into a uint8 array of ceil(T*E/8) bytes; entry
    (t, e) is bit (t*E + e) % 8, least significant first, of byte (t*E + e) // 8.

    Raises:
        ValueError: not 2-D, or an entry other than 0/1.
    """
    arr = np.asarray(mask)
    if arr.ndim != 2:
        raise ValueError(f"pack_routing: mask must be 2-D [tokens, experts], got shape {arr.shape}")
    if arr.dtype == np.bool_:
        arr = arr.view(np.uint8)
    elif not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"pack_routing: mask must be bool or 0/1 integers, got dtype {arr.dtype}")
    elif arr.size and (arr.min() < 0 or arr.max() > 1):
        raise ValueError("pack_routing: mask entries must be 0 or 1")
    return _core.pack_routing(np.ascontiguousarray(arr, dtype=np.uint8))


def unpack_routing(packed, num_tokens: int, num_experts: int) -> np.ndarray:
    """The [T, E] bool mask of `packed` (ceil(T*E/8) uint8 bytes).

    Raises:
        ValueError: the wrong number of bytes, or non-zero padding bits.
    """
    arr = np.ascontiguousarray(np.asarray(packed, dtype=np.uint8).reshape(-1))
    return _core.unpack_routing(arr, int(num_tokens), int(num_experts)).view(np.bool_)


def exchange_routing_mask(exchange, plan: DispatchPlan, per_member: int, record=None) -> np.ndarray:
    """Send each member of `exchange` (a `ProcessExchange`) the packed mask columns of its experts;
    returns the rows each source sends to each of my experts [members, per_member]. Every member
    holds `plan.num_tokens` tokens (the token dimension splits evenly)."""
    mask = plan.mask()
    pieces = [pack_routing(mask[:, m * per_member:(m + 1) * per_member]) for m in range(exchange.size)]
    nbytes = packed_routing_bytes(plan.num_tokens, per_member)
    if record is not None:
        record(nbytes * exchange.size)
    buf, counts = exchange.comm.all_to_all_v(np.concatenate(pieces), [nbytes] * exchange.size)
    if list(counts) != [nbytes] * exchange.size:
        raise RuntimeError(f"routing mask exchange: received {list(counts)} bytes per member, expected {nbytes} each")
    out = np.zeros((exchange.size, per_member), dtype=np.int64)
    for src in range(exchange.size):
        got = unpack_routing(buf[src * nbytes:(src + 1) * nbytes], plan.num_tokens, per_member)
        out[src] = got.sum(0)
    return out
