"""The expert exchange's buffers in the memory accounting (every mode alike).

A flat dispatch sends every token copy a device routes out of one send buffer (the gathered
rows, to every member, itself included) and receives its experts' rows into a receive buffer;
both are alive from the dispatch until the experts take their input. The combine sends the
experts' outputs back (its send buffer: the rows the experts produced), receives every copy of
this device's tokens back (its receive buffer) and weights each copy by its gate (the weighted
copies) before the per-token sum; these are alive from the experts' output to the combine's sum.
In bytes, with H the hidden size and b the rows' bytes per element (the tokens' dtype for the
dispatch, the experts' output dtype for the combine), c the copies a device routes and n the rows
its experts receive:

    dispatch = (c + n) x H x b,        combine = (n + 2 c) x H x b.

They are counted as transient bytes (allocated, then freed: `Accounting.allocate`/`free`), so
they raise the live bytes and the peak while alive and are not held for the backward. Under a
routing assumption each expert member has its own n (`member_loads.MemberLoads`); otherwise the
figures are the representative device's.
"""
from __future__ import annotations

from typing import Dict, Tuple, Union

__all__ = ["dispatch_buffer_bytes", "combine_buffer_bytes", "allocate", "free"]

Amount = Union[int, Dict[Tuple[int, ...], int]]  # bytes for the representative, or ranks -> bytes


def dispatch_buffer_bytes(copies: int, received: int, hidden: int, itemsize: int) -> int:
    """The dispatch's send and receive buffers: `copies` rows sent and `received` rows received
    of `hidden` elements of `itemsize` bytes (see module docstring)."""
    return (copies + received) * hidden * itemsize


def combine_buffer_bytes(received: int, copies: int, hidden: int, itemsize: int) -> int:
    """The combine's send buffer (the experts' `received` output rows), receive buffer and
    weighted copies (`copies` rows each), `hidden` elements of `itemsize` bytes a row."""
    return (received + 2 * copies) * hidden * itemsize


def allocate(accounting, amount: Amount) -> None:
    """Count `amount` (bytes, or ranks -> bytes per program) as live."""
    if isinstance(amount, dict):
        accounting.allocate_by_ranks(amount)
    else:
        accounting.allocate(amount)


def free(accounting, amount: Amount) -> None:
    """Release what `allocate(accounting, amount)` counted."""
    if isinstance(amount, dict):
        accounting.free_by_ranks(amount)
    else:
        accounting.free(amount)
