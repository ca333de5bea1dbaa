"""Shared-memory transport between processes on one host (POSIX shared memory + atomics).

Each process creates one `ShmCommunicator(name, rank, size)` with the same `name` (rank 0 creates the
segment, the others attach; all block until everyone is there). The segment's name is not `name`
but `segment_name(name, token)`: a readable prefix of `name` and a keyed hash of all of it with
the job token (`job_token`), so it has a fixed length for any group and cannot be predicted by
another user; a rank attaches only to a segment of its own user with mode 0600 (docs/comm.md,
Security model). Collectives take this rank's numpy array. A peer that dies or stalls makes the waiting ranks fail with `CommTimeout` within
`timeout` seconds of no progress (a dead peer is noticed within ~20 ms); ranks disagreeing on a
collective's kind, dtype or sizes fail with `CommMismatch` naming both. The segment's name is
removed from /dev/shm as soon as every rank attached, so nothing is left behind after a normal
exit or a crash of any rank.

Under msrun, `ShmCommunicator.from_env()` derives name/rank/size from msrun's environment.
"""
from __future__ import annotations

import hashlib
import os
import re
import zlib
from typing import Optional, Sequence

import numpy as np

from mindspore_hyper.comm._common import _C, check_op, contiguous, dtype_name, normalize_dim, split_counts
from mindspore_hyper.comm._common import is_bfloat16 as _is_bfloat16
from mindspore_hyper.comm._handles import AggregatorOwner, Closed
from mindspore_hyper.comm.job_token import job_token

__all__ = ["ShmCommunicator", "one_way_channel", "cleanup_stale_segments", "segment_name", "SEGMENT_PREFIX",
           "DEFAULT_MAX_MESSAGE_BYTES"]

SEGMENT_PREFIX = "mshyper_"
DEFAULT_MAX_MESSAGE_BYTES = 1 << 30
DEFAULT_BLANK_AGE_S = 60.0  # seconds; an older version wrote the header milliseconds after creating the name
_MAX_DIMS = 32  # numpy's limit: the shape descriptors all_gather exchanges
_READABLE = 32  # characters of the group name kept readable in the segment name
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def segment_name(name: str, token: str) -> str:
    """The /dev/shm name of group `name` in the job of `token`: SEGMENT_PREFIX, the first 32
    characters of `name` (others than letters, digits, '_', '.', '-' as '_'), '_', and 32 hex
    digits of the BLAKE2b hash of the whole name keyed with the token: at most 73 characters."""
    digest = hashlib.blake2b(name.encode(), key=bytes.fromhex(token)[:64], digest_size=16).hexdigest()
    return f"{SEGMENT_PREFIX}{_UNSAFE.sub('_', name[:_READABLE])}_{digest}"


def cleanup_stale_segments(prefix: str = SEGMENT_PREFIX, blank_age_s: float = DEFAULT_BLANK_AGE_S) -> int:
    """Remove this user's leftovers named `prefix*` from /dev/shm; never one of a live process.

    Leftovers: segments whose creating process is gone, creation temporaries
    (`<segment>.<pid>.<n>.init`) whose pid is gone, and blank segments (no header: an older
    version's rank 0 died between creating the name and writing the header) whose inode has not
    changed for more than `blank_age_s` seconds (this version never publishes a blank segment).

    Args:
        prefix: the names to look at (a leading '/' is ignored).
        blank_age_s: seconds after which a blank segment counts as abandoned (inf: never).

    Returns:
        How many names were removed.

    Raises:
        CommError: `blank_age_s` is negative or NaN.
    """
    return _C.cleanup_stale_segments(prefix, float(blank_age_s))


class ShmCommunicator(AggregatorOwner):
    """This process's member of a shared-memory group.

    Args:
        name: group name shared by all ranks (unique per job, any length); the segment is
            /dev/shm/`segment_name(name, token)`.
        rank, size: this rank and the number of processes.
        timeout: seconds without progress before CommTimeout (also bounds the rendezvous).
        channel_bytes: ring-buffer bytes per directed pair of ranks.
        aggregation_bytes: super-packet size of all_reduce_async (default: context flag).
        max_delay: seconds after which a partly filled packet is sent.
        max_message_bytes: the most bytes of one message: a send of more raises CommError; a
            peer announcing more (a send's header, one all_to_all part) raises FrameError and
            aborts the group before anything is allocated for it. Same value on every rank.
        token: the job token (default: `job_token()`, shared by the processes of this job).

    Raises:
        ValueError: empty `name`, or `max_message_bytes` not positive.
        CommError: the segment exists and is another group's or another user's (names it).
    """

    def __init__(self, name: str, rank: int, size: int, timeout: float = 30.0, channel_bytes: int = 256 << 10,
                 aggregation_bytes: Optional[int] = None, max_delay: float = 5e-3,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, token: Optional[str] = None):
        if not name:
            raise ValueError(f"name={name!r}: expected a non-empty name")
        if not int(max_message_bytes) > 0:
            raise ValueError(f"max_message_bytes={max_message_bytes!r}: expected a positive number of bytes")
        self.name = name
        if int(rank) == 0 and float(timeout) > 0:  # (a bad timeout is refused by the constructor below)
            # segments left by crashed runs whose peers never attached (their creator is gone), and
            # blank ones older than this group's timeout (as the constructor judges its own name)
            cleanup_stale_segments(blank_age_s=float(timeout))
        seg = segment_name(name, job_token(float(timeout)) if token is None else token)
        self._g = _C.ShmCommunicator(seg, int(rank), int(size), int(channel_bytes), float(timeout))
        self._g.max_message_bytes = int(max_message_bytes)
        if aggregation_bytes is None:
            from mindspore_hyper.context import get_context

            aggregation_bytes = get_context("comm_aggregation_bytes")
        self.aggregation_bytes = int(aggregation_bytes)
        self.max_delay = float(max_delay)
        self._agg = None
        from mindspore_hyper.comm.cost import apply_overrides

        apply_overrides(self._g.model)

    @classmethod
    def from_env(cls, name: Optional[str] = None, **kwargs) -> "ShmCommunicator":
        """Under msrun: rank from RANK_ID, size from MS_WORKER_NUM, name from the master port."""
        rank = int(os.environ.get("RANK_ID", os.environ.get("MS_NODE_ID", "0")))
        size = int(os.environ.get("MS_WORKER_NUM", os.environ.get("RANK_SIZE", "1")))
        if name is None:
            name = "msrun_" + os.environ.get("MS_SCHED_PORT", "0") + "_" + os.environ.get("MS_SCHED_HOST", "local")
        return cls(name, rank, size, **kwargs)

    # ----- properties -------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._g.rank

    @property
    def size(self) -> int:
        return self._g.size

    @property
    def timeout(self) -> float:
        return self._g.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._g.timeout = float(seconds)

    @property
    def direct_min_bytes(self) -> float:
        """Ring all-reduces of at least this many bytes read the predecessor's buffer directly
        (cross-memory attach, one copy instead of two); -1 disables. Same value on every rank."""
        return self._g.direct_min_bytes

    @direct_min_bytes.setter
    def direct_min_bytes(self, nbytes: float) -> None:
        self._g.direct_min_bytes = float(nbytes)

    @property
    def last_algorithm(self) -> str:
        return self._g.last_algorithm

    @property
    def model(self):
        """The C++ CostModel of this rank (set_threshold / force_algorithm; same on every rank!)."""
        return self._g.model

    @property
    def segment_name(self) -> str:
        """The /dev/shm name of this group's segment ('/' first)."""
        return self._g.segment_name

    def abort(self, why: str) -> None:
        """Mark the group broken: every rank's next wait fails fast with CommTimeout naming `why`
        (a rank that cannot continue the streams, e.g. after a malformed message)."""
        self._g.abort(str(why))

    def calibrate(self, repeats: int = 20):
        """Collective: measure alpha/beta/gamma of the shm transport, use them for algorithm choice."""
        self._before_direct()
        return self._g.calibrate(repeats)

    def _before_direct(self) -> None:
        if self._agg is not None:
            self._agg.flush()  # packets and direct collectives must not interleave in the streams

    # ----- collectives ------------------------------------------------------------------------
    def all_reduce(self, x, op: str = "sum", algorithm: str = "auto", out: Optional[np.ndarray] = None) -> np.ndarray:
        """Reduce over ranks; returns a new array, or writes into `out` (may be `x` itself: in place).
        bfloat16 (no kernel in the library): reduced in float32, rounded to bfloat16 once."""
        check_op(op)
        if _is_bfloat16(x):
            reduced = self.all_reduce(np.asarray(x).astype(np.float32), op, algorithm).astype(np.asarray(x).dtype)
            if out is None:
                return reduced
            np.copyto(out, reduced)
            return out
        if out is None:
            out = contiguous(x).copy()
        else:
            if not (isinstance(out, np.ndarray) and out.flags.c_contiguous and out.shape == np.shape(x)
                    and out.dtype == np.asarray(x).dtype):
                raise ValueError("out must be a C-contiguous array of the input's shape and dtype")
            if out is not x:
                np.copyto(out, x)
        self._before_direct()
        self._g.all_reduce(out, dtype_name(out), op, algorithm)
        return out

    def _gather_shapes(self, shape: tuple) -> list:
        """Every rank's array shape (a collective)."""
        desc = np.full(1 + _MAX_DIMS, -1, np.int64)
        desc[0] = len(shape)
        desc[1:1 + len(shape)] = shape
        out = np.empty(desc.size * self.size, np.int64)
        self._g.all_gather(desc, out, "int64")
        return [tuple(int(v) for v in row[1:1 + row[0]]) for row in out.reshape(self.size, desc.size)]

    def all_gather(self, x, dim: int = 0) -> np.ndarray:
        """Concatenate every rank's array along `dim`. Sizes along `dim` may differ; the other
        dimensions must agree (CommMismatch on every rank otherwise). bfloat16 moves as its bytes."""
        arr = contiguous(x)
        if _is_bfloat16(arr):
            return self.all_gather(arr.view(np.float16), dim).view(arr.dtype)
        dim = normalize_dim(dim, arr.ndim, "all_gather")
        moved = np.ascontiguousarray(np.moveaxis(arr, dim, 0))
        self._before_direct()
        shapes = self._gather_shapes(arr.shape)
        for r, shape in enumerate(shapes):
            if len(shape) != len(shapes[0]) or shape[:dim] + shape[dim + 1:] != shapes[0][:dim] + shapes[0][dim + 1:]:
                raise _C.CommMismatch(f"all_gather: rank 0 passes shape {shapes[0]} but rank {r} passes {shape}; "
                                      f"only dim {dim} may differ")
        inner = int(np.prod(moved.shape[1:])) if moved.ndim > 1 else 1
        rows = [shape[dim] for shape in shapes]
        out = np.empty((sum(rows),) + moved.shape[1:], dtype=moved.dtype)
        self._g.all_gather_v(moved, out, [r * inner for r in rows], dtype_name(moved))
        return np.moveaxis(out, 0, dim)

    def reduce_scatter(self, x, dim: int = 0, op: str = "sum") -> np.ndarray:
        """Reduce over ranks; this rank gets its np.array_split part along `dim` (bfloat16: reduced in
        float32, rounded to bfloat16 once)."""
        check_op(op)
        if _is_bfloat16(x):
            return self.reduce_scatter(np.asarray(x).astype(np.float32), dim, op).astype(np.asarray(x).dtype)
        moved = np.ascontiguousarray(np.moveaxis(contiguous(x), dim, 0))
        rest = moved.shape[1:]
        inner = int(np.prod(rest)) if rest else 1
        parts = split_counts(moved.shape[0], self.size)
        out = np.empty((parts[self.rank],) + rest, dtype=moved.dtype)
        self._before_direct()
        self._g.reduce_scatter(moved, out, [p * inner for p in parts], dtype_name(moved), op)
        return np.moveaxis(out, 0, dim)

    def all_to_all(self, x, split_dim: int = 0, concat_dim: int = 0) -> np.ndarray:
        """Split along `split_dim` into `size` parts (np.array_split), part j to rank j; concatenate
        the received parts along `concat_dim` in rank order. Every rank must pass the same shape."""
        arr = contiguous(x)
        split_dim = normalize_dim(split_dim, arr.ndim, "all_to_all")
        concat_dim = normalize_dim(concat_dim, arr.ndim, "all_to_all")
        chunks = np.array_split(arr, self.size, axis=split_dim)
        send = np.concatenate([np.ascontiguousarray(c).ravel() for c in chunks])
        self._before_direct()
        # ranks' shapes and axes must agree: the transport's cross-rank check compares this key
        key = zlib.crc32(repr((arr.shape, split_dim, concat_dim)).encode()) + 1
        buf, counts = self._g.all_to_all_v(send, [c.size for c in chunks], dtype_name(arr), key)
        flat = buf.view(arr.dtype)
        expect = chunks[self.rank].shape
        pieces, off = [], 0
        for r in range(self.size):
            if counts[r] != int(np.prod(expect)):
                raise _C.CommMismatch(f"all_to_all: rank {r} sent {counts[r]} elements to rank {self.rank}, which "
                                      f"expects {int(np.prod(expect))} (shape {expect}); ranks passed different shapes")
            pieces.append(flat[off:off + counts[r]].reshape(expect))
            off += counts[r]
        return np.concatenate(pieces, axis=concat_dim)

    def all_to_all_v(self, x, send_counts: Sequence[int]):
        """Uneven all-to-all of a flat array: send_counts[j] elements (in order) to rank j.
        Returns (received 1-D array in source-rank order, counts per source)."""
        arr = contiguous(x).ravel()
        if len(send_counts) != self.size or sum(send_counts) != arr.size:
            raise ValueError(f"all_to_all_v: send_counts {list(send_counts)} do not split {arr.size} elements "
                             f"over {self.size} ranks")
        self._before_direct()
        buf, counts = self._g.all_to_all_v(arr, [int(c) for c in send_counts], dtype_name(arr))
        return buf.view(arr.dtype).copy(), list(counts)

    def broadcast(self, x, root: int = 0, algorithm: str = "auto") -> np.ndarray:
        if _is_bfloat16(x):  # bfloat16 moves as its bytes
            return self.broadcast(contiguous(x).view(np.float16), root, algorithm).view(np.asarray(x).dtype)
        out = contiguous(x).copy()
        self._before_direct()
        self._g.broadcast(out, dtype_name(out), int(root), algorithm)
        return out

    def send(self, x, peer: int) -> None:
        arr = contiguous(x)
        self._before_direct()
        self._g.send(arr, dtype_name(arr), int(peer))

    def recv(self, shape, dtype, peer: int) -> np.ndarray:
        return self.recv_into(np.empty(shape, dtype=dtype), peer)

    def recv_into(self, out: np.ndarray, peer: int) -> np.ndarray:
        """Receive from `peer` into the C-contiguous array `out` (its size and dtype as sent); returns it."""
        self._before_direct()
        self._g.recv(out, dtype_name(out), int(peer))
        return out

    def barrier(self) -> None:
        self._before_direct()
        self._g.barrier()

    # ----- aggregation ------------------------------------------------------------------------
    def _new_aggregator(self):
        return self._g.make_aggregator(self.aggregation_bytes, self.max_delay)

    def close(self) -> None:
        """Stop the aggregator (queued requests fail) and unmap the segment; later calls raise
        CommError. Also happens at garbage collection."""
        if self._close_aggregator(f"ShmCommunicator {self.name!r}"):
            self._g = Closed(f"ShmCommunicator {self.name!r}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def one_way_channel(job: str, tag: str, source: int, target: int, me: int, timeout: float,
                    **kwargs) -> "ShmCommunicator":
    """The two-member communicator carrying `source` -> `target` (global ranks; member 0 sends,
    member 1 receives), named by job, user tag and direction so that concurrent jobs and the
    pipeline / MPMD / multimodal channels never share a segment. Both ends call it.

    Raises:
        ValueError: `me` is not one of the two ends.
    """
    if me not in (source, target) or source == target:
        raise ValueError(f"channel {source} -> {target}: rank {me} is not one of its two ends")
    return ShmCommunicator(f"{job}_{tag}{source}to{target}", 0 if me == source else 1, 2, timeout=timeout, **kwargs)
