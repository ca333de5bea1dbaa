"""A pipeline step's refusal on one process, raised on every process of the job (under msrun).

A pipeline rank that refuses a step (bad inputs, a stage returning what cannot travel, any error
in its stage) would leave its peers waiting for a tensor until the communication timeout. Two
paths make the refusal reach every rank promptly, each rank raising the same exception class
with the refusing rank's message (prefixed by where it came from):

- before any transfer, `agree` runs the step's checks on every process and all-gathers an
  ok/error flag (one tiny all-gather per step; the message travels only when a check failed);
- during the step, the refusing rank sends `abort_meta` messages in place of the tensors it
  still owed (`ShmTransport.abort`); a receive that gets one raises `rebuild` of it, and that
  rank forwards it the same way, so it travels along the pipeline to every rank of the chain.

The exception classes that travel are `KINDS` (another class arrives as RuntimeError).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple, TypeVar

import numpy as np

__all__ = ["KINDS", "ABORT_FLAG", "encode", "rebuild", "abort_meta", "read_abort", "agree"]

KINDS = (ValueError, TypeError, RuntimeError, TimeoutError)
ABORT_FLAG = 1  # first meta int of a message that stands for a refused step, not a tensor
_ORIGIN = "_hyper_pipeline_refusal"  # attribute of a rebuilt exception: (job rank that refused, its text)

T = TypeVar("T")


def _kind(exc: BaseException) -> int:
    """The index in KINDS of the first class `exc` is an instance of (RuntimeError otherwise)."""
    return next((i for i, cls in enumerate(KINDS) if isinstance(exc, cls)), KINDS.index(RuntimeError))


def encode(exc: BaseException, rank: int) -> Tuple[int, int, str]:
    """(kind, origin rank, text) of `exc`: a rebuilt one keeps its origin and text."""
    received = getattr(exc, _ORIGIN, None)
    if received is not None:
        return (_kind(exc),) + received
    return _kind(exc), int(rank), f"{type(exc).__name__}: {exc}"


def rebuild(kind: int, origin: int, text: str) -> BaseException:
    """The exception a rank raises for rank `origin`'s refusal (class KINDS[kind]; its message
    names the refusing rank and carries its text)."""
    cls = KINDS[kind] if 0 <= kind < len(KINDS) else RuntimeError
    exc = cls(f"pipeline step refused on job rank {origin}: {text}")
    setattr(exc, _ORIGIN, (int(origin), text))
    return exc


def abort_meta(exc: BaseException, rank: int) -> Tuple[Tuple[int, ...], np.ndarray]:
    """The meta ints and the text array of the message that stands for `exc` on a channel."""
    kind, origin, text = encode(exc, rank)
    return (ABORT_FLAG, kind, origin), np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()


def read_abort(meta: Sequence[int], arrays: Sequence[np.ndarray]) -> Optional[BaseException]:
    """The refusal a received message stands for, or None for a tensor."""
    if len(meta) < 3 or int(meta[0]) != ABORT_FLAG:
        return None
    return rebuild(int(meta[1]), int(meta[2]), bytes(np.asarray(arrays[0], dtype=np.uint8)).decode("utf-8", "replace"))


def agree(check: Callable[[], T], communicator, rank: int) -> T:
    """`check()` on every process of `communicator`, then an all-gather of whether it passed:
    every process raises when any did (its own exception where it failed, else `rebuild` of
    the lowest failing rank's).

    Args:
        check: the step's checks on this process; its result is returned where all passed.
        communicator: the job's numpy communicator (`all_gather(array, dim=0)`).
        rank: this process's rank in the communicator (named in the message).

    Raises:
        The exception of `check` here, or of the lowest failing rank elsewhere (same class).
    """
    try:
        result, failure = check(), None
    except Exception as exc:  # noqa: BLE001 -- every process must learn of it before raising
        result, failure = None, exc
    kind, origin, text = encode(failure, rank) if failure is not None else (-1, rank, "")
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()
    flags = communicator.all_gather(np.array([[kind, origin, data.size]], dtype=np.int64), dim=0)
    failed = [i for i in range(len(flags)) if flags[i, 0] >= 0]
    if not failed:
        return result
    padded = np.zeros((1, max(1, int(flags[:, 2].max()))), np.uint8)  # equal shapes on every process
    padded[0, :data.size] = data
    texts = communicator.all_gather(padded, dim=0)  # every process takes part before any raises
    if failure is not None:
        raise failure
    first = failed[0]
    raise rebuild(int(flags[first, 0]), int(flags[first, 1]),
                  bytes(texts[first, :int(flags[first, 2])]).decode("utf-8", "replace"))
