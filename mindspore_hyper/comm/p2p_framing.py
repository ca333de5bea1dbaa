"""The wire format of a `P2PChannel` message (docs/comm.md): what a message is, the checks of
its limits on both ends, and writing / reading one over a shared-memory communicator.

A message is a tag (a few ints, the name the receiver asks for), optional metadata (a few ints)
and arrays of any supported dtype and shape. On the wire: 32 int64 words holding the
descriptor's length and the descriptor (tag, meta, each array's dtype code and shape; a longer
descriptor's rest follows), then each non-empty array's bytes. The receiver checks every
descriptor (C++, `_core.comm.parse_p2p_descriptor`) against the limits -- at most 8 tag ints, 64
meta ints, 1024 arrays of at most 32 dimensions, `max_message_bytes` of array data -- before it
allocates anything: a malformed message is a `FrameError` naming the peer and the field, and
aborts the communicator (the stream cannot be resynchronised). The sender checks the same limits
(ValueError).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple, Union

import numpy as np

from mindspore_hyper.comm._common import _C

__all__ = ["Message", "Tag", "P2P_DTYPES", "FrameError", "as_ints", "check_array", "check_message",
           "write_message", "read_message", "MAX_TAG", "MAX_META"]

FrameError = _C.FrameError
_LIMITS = _C.P2P_LIMITS  # the framing's limits, from the C++ parser
P2P_DTYPES = tuple(_LIMITS["dtypes"])  # wire code = index
_DTYPES = tuple(np.dtype(name) for name in P2P_DTYPES)
_CODES = {dtype: code for code, dtype in enumerate(_DTYPES)}
MAX_TAG = _LIMITS["max_tag"]  # ints in a tag
MAX_META = _LIMITS["max_meta"]  # ints of metadata
_MAX_ARRAYS = _LIMITS["max_arrays"]
_MAX_DIMS = _LIMITS["max_dims"]
_HEAD = _LIMITS["head_words"]  # int64 words of a message's first write: the descriptor's length, then the descriptor
_INT64 = (-(1 << 63), (1 << 63) - 1)

Tag = Union[int, Tuple[int, ...]]


def as_ints(value, what: str, limit: int, allow_empty: bool) -> Tuple[int, ...]:
    """`value` (an int or a sequence of ints) as a tuple of Python ints; ValueError naming `what`."""
    def is_int(v) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))

    items = (value,) if is_int(value) else tuple(value) if isinstance(value, (tuple, list, np.ndarray)) else None
    if (items is None or not all(is_int(v) and _INT64[0] <= v <= _INT64[1] for v in items) or len(items) > limit
            or not (items or allow_empty)):
        raise ValueError(f"{what}={value!r}: expected {'' if allow_empty else 'an int or '}a sequence of "
                         f"{'' if allow_empty else '1 to '}{limit} int64 values at most")
    return tuple(int(v) for v in items)


def check_array(value, index: int, copy: bool) -> np.ndarray:
    """arrays[index] C-contiguous (a copy if `copy`); TypeError naming the argument for unsupported dtypes."""
    arr = np.asarray(value)
    if arr.dtype not in _CODES:
        raise TypeError(f"arrays[{index}]: dtype {arr.dtype} is not supported; expected one of {', '.join(P2P_DTYPES)}")
    return np.array(arr, order="C", copy=True) if copy else np.ascontiguousarray(arr)


@dataclass(frozen=True)
class Message:
    """One message of a channel.

    Attributes:
        tag: the name a receive asks for (a tuple of ints).
        arrays: the arrays, in the order sent.
        meta: small integer metadata (a tuple of ints, empty when none).
    """

    tag: Tuple[int, ...]
    arrays: Tuple[np.ndarray, ...]
    meta: Tuple[int, ...] = ()


def _descriptor(message: Message) -> np.ndarray:
    words: List[int] = [len(message.tag), *message.tag, len(message.meta), *message.meta, len(message.arrays)]
    for arr in message.arrays:
        words += [_CODES[arr.dtype], arr.ndim, *arr.shape]
    return np.array(words, np.int64)


def check_message(message: Message, max_message_bytes: int) -> int:
    """The message's array bytes; ValueError naming the argument when it breaks the framing's limits."""
    if len(message.arrays) > _MAX_ARRAYS:
        raise ValueError(f"arrays: {len(message.arrays)} arrays; a message holds at most {_MAX_ARRAYS}")
    for i, arr in enumerate(message.arrays):
        if arr.ndim > _MAX_DIMS:  # numpy 2 allows 64
            raise ValueError(f"arrays[{i}]: {arr.ndim} dimensions; at most {_MAX_DIMS}")
    nbytes = sum(arr.nbytes for arr in message.arrays)
    if nbytes > max_message_bytes:
        raise ValueError(f"arrays: {nbytes} bytes in all; the channel's max_message_bytes is {max_message_bytes}")
    return nbytes


def _parse(words: np.ndarray, max_message_bytes: int):
    """(tag, meta, [(dtype, shape) per array]) from a peer's descriptor; FrameError naming the field."""
    tag, meta, layout, _ = _C.parse_p2p_descriptor(words, max_message_bytes)
    return tag, meta, [(_DTYPES[code], shape) for code, shape in layout]


def write_message(comm, message: Message) -> None:
    """Write `message` to the communicator's peer (group rank 1): the head words, the rest of a
    long descriptor, then each non-empty array's bytes."""
    words = _descriptor(message)
    head = np.zeros(_HEAD, np.int64)
    head[0] = words.size
    inline = min(words.size, _HEAD - 1)
    head[1:1 + inline] = words[:inline]
    comm.send(head, 1)
    if words.size > inline:
        comm.send(words[inline:], 1)
    for arr in message.arrays:
        if arr.nbytes:
            comm.send(arr.reshape(-1).view(np.uint8), 1)


def read_message(comm, wait: float, timeout: float, max_message_bytes: int, where: str) -> Message:
    """Read one message from the communicator's peer (group rank 0): its start within `wait`
    seconds, the rest within `timeout` (the communicator's own, restored after the start).

    Args:
        where: who reads from whom, for a FrameError ("rank 1: malformed message from rank 0 on 'x'").

    Raises:
        FrameError: the peer announced a malformed message (names the field); the communicator
            is aborted (the rest of the stream cannot be found).
    """
    comm.timeout = wait
    try:
        head = comm.recv((_HEAD,), np.int64, 0)
    finally:
        comm.timeout = timeout
    try:  # everything the peer announces is checked before anything is allocated for it
        size = _C.p2p_descriptor_length(int(head[0]))
        words = head[1:1 + min(size, _HEAD - 1)]
        if size > _HEAD - 1:
            words = np.concatenate([words, comm.recv((size - (_HEAD - 1),), np.int64, 0)])
        tag, meta, layout = _parse(words, max_message_bytes)
    except FrameError as exc:
        why = f"{where}: {exc}"
        comm.abort(why)
        raise FrameError(why) from None
    arrays = []
    for dtype, shape in layout:
        out = np.empty(shape, dtype)
        if out.nbytes:
            comm.recv_into(out.reshape(-1).view(np.uint8), 0)
        arrays.append(out)
    return Message(tag, tuple(arrays), meta)
