"""MindSpore transport: packets travel through MindSpore communication (mint.distributed).

Under msrun (after ``mindspore.communication.init()``), `MindSporeCommunicator` sends all-reduce
packets of the C++ aggregator, and direct all_reduce / all_gather / broadcast, through
``mindspore.mint.distributed`` -- on Ascend that is HCCL, on CPU MindSpore's mccl backend -- over
the whole job or a group of its ranks (`ranks=`, made with `new_group`), so processes may be on
several hosts. MindSpore's CPU backend has no AllToAll, ReduceScatter or send/recv: reduce_scatter
and all_to_all are composed from all_reduce / all_gather (more bytes than the real collectives),
and `shm()` gives the shared-memory group of the whole job (one host) for the rest. bfloat16 is
reduced in float32 and rounded once, and gathered and broadcast as its bytes (as in `shm.py`).

Every MindSpore collective of this transport runs on the calling thread, in the program's order:
`all_reduce_async` requests are packed and sent at the next flush (a handle's wait, a direct
collective of the group, or `flush()`), not by a background thread (`caller_thread_aggregator.py`
says why: two threads' collectives, or two groups' collectives in different orders on different
ranks, make MindSpore fail with "AllReduce failed").

Every MindSpore collective is launched with no mixed-precision type (`_uncast`): called inside a
Cell of type FP16 or BF16 (`to_float`, amp) -- a tensor-parallel forward -- MindSpore would cast
the collective's float tensors to that type, reduce the cast copy and leave the tensor holding this
rank's own input, with no error (all_gather's outputs got the copy's bits).
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional, Sequence

import numpy as np

from mindspore_hyper.comm._common import check_op, contiguous, dtype_name, is_bfloat16
from mindspore_hyper.comm._handles import AggregatorOwner, Closed
from mindspore_hyper.comm.caller_thread_aggregator import CallerThreadAggregator

__all__ = ["MindSporeCommunicator"]

_MS_OPS = {"sum": "sum", "max": "max", "min": "min", "avg": "sum"}


@contextlib.contextmanager
def _uncast() -> Iterator[None]:
    """Inside the block MindSpore casts no kernel input to a running Cell's mixed-precision type:
    the type NOTSET is pushed on MindSpore's stack of Cell types, and popped after (module docstring)."""
    from mindspore._c_expression import MixedPrecisionType
    from mindspore.graph.api import _pynative_executor

    _pynative_executor.set_mixed_precision_type(MixedPrecisionType.NOTSET)
    try:
        yield
    finally:
        _pynative_executor.set_mixed_precision_type(MixedPrecisionType.NOTSET, False)


class MindSporeCommunicator(AggregatorOwner):
    """A group of an initialised MindSpore job (``mindspore.communication.init()``).

    Args:
        ranks: the group's global ranks (member order); None = the whole job. Every member
            must create it (collectively), in the same order of groups.
        aggregation_bytes: super-packet size of all_reduce_async (default: context flag); packets
            are sent at the next flush, on the calling thread (module docstring).
        shm_timeout: timeout of the shared-memory fallback for all_to_all/reduce_scatter/send/recv.
    """

    def __init__(self, aggregation_bytes: Optional[int] = None, shm_timeout: float = 30.0,
                 ranks: Optional[Sequence[int]] = None):
        from mindspore.communication import get_group_size, get_rank

        world_rank, world_size = get_rank(), get_group_size()
        self.ranks = tuple(range(world_size)) if ranks is None else tuple(int(r) for r in ranks)
        if world_rank not in self.ranks or len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"ranks={list(self.ranks)}: expected distinct global ranks including this one "
                             f"({world_rank})")
        self._group = None
        if self.ranks != tuple(range(world_size)):
            from mindspore.mint.distributed import new_group

            self._group = new_group(list(self.ranks))
        self.rank = self.ranks.index(world_rank)
        self.size = len(self.ranks)
        if aggregation_bytes is None:
            from mindspore_hyper.context import get_context

            aggregation_bytes = get_context("comm_aggregation_bytes")
        self.aggregation_bytes = int(aggregation_bytes)
        self.shm_timeout = shm_timeout
        self._agg = None
        self._shm = None
        self.packets_sent = 0
        self.params = None  # TransportParams after calibrate()

    # ----- the transport itself ---------------------------------------------------------------
    def _ms_all_reduce_into(self, arr: np.ndarray, op: str) -> None:
        """All-reduce the C-contiguous array `arr` in place through mint.distributed."""
        import mindspore as ms
        from mindspore.mint import distributed as dist

        if arr.dtype.itemsize == 8:
            # MindSpore's CPU backend fails AllReduce on 64-bit types: gather the raw bits as
            # int32 (a copy, exact) and reduce here.
            bits = arr.reshape(-1).view(np.int32)
            outs = [ms.Tensor(np.empty_like(bits)) for _ in range(self.size)]
            with _uncast():
                dist.all_gather(outs, ms.Tensor(bits), group=self._group)
            st = np.stack([o.asnumpy().view(arr.dtype).reshape(arr.shape) for o in outs])
            if op in ("sum", "avg"):
                st.sum(0, dtype=arr.dtype, out=arr)
            else:
                (np.max if op == "max" else np.min)(st, axis=0, out=arr)
        else:
            t = ms.Tensor.from_numpy(arr)  # shares arr's memory: the result normally lands in place
            with _uncast():
                dist.all_reduce(t, op=_MS_OPS[op], group=self._group)
            res = t.asnumpy()
            if not np.may_share_memory(res, arr):
                arr[...] = res.reshape(arr.shape)
        if op == "avg":
            if arr.dtype.kind == "f":
                arr /= self.size
            else:
                arr[...] = np.trunc(arr / self.size)

    def _packet(self, buf: np.ndarray, op: str) -> None:
        """Callback of the aggregator: all-reduce one packet (a 1-D array) in place."""
        self._ms_all_reduce_into(buf, op)
        self.packets_sent += 1

    def _before_direct(self) -> None:
        if self._agg is not None:
            self._agg.flush()

    # ----- collectives ------------------------------------------------------------------------
    def all_reduce(self, x, op: str = "sum") -> np.ndarray:
        """Reduce over the members; bfloat16 (which the comm library has no kernels for) is reduced
        in float32 and rounded to bfloat16 once, as the shared-memory transport does."""
        check_op(op)
        if is_bfloat16(x):
            return self.all_reduce(np.asarray(x).astype(np.float32), op).astype(np.asarray(x).dtype)
        out = contiguous(x).copy()
        dtype_name(out)
        self._before_direct()
        self._ms_all_reduce_into(out, op)
        return out

    def all_gather(self, x, dim: int = 0) -> np.ndarray:
        """Concatenation along `dim` in member order (equal shapes on every rank)."""
        return np.concatenate(self._gather_all(x), axis=dim)

    def _gather_all(self, x) -> list:
        """Every member's array (equal shapes on every rank), in member order."""
        import mindspore as ms
        from mindspore.mint import distributed as dist

        arr = contiguous(x)
        if is_bfloat16(arr):  # bfloat16 moves as its bytes
            return [a.view(arr.dtype) for a in self._gather_all(arr.view(np.float16))]
        dtype_name(arr)
        self._before_direct()
        wire = arr.view(np.uint8) if arr.dtype == np.bool_ else arr
        outs = [ms.Tensor(np.empty_like(wire)) for _ in range(self.size)]
        with _uncast():
            dist.all_gather(outs, ms.Tensor(wire), group=self._group)
        by_global = sorted(self.ranks)  # new_group numbers its members in ascending global rank
        return [outs[by_global.index(r)].asnumpy().view(arr.dtype) for r in self.ranks]

    def broadcast(self, x, root: int = 0) -> np.ndarray:
        """Every member gets member `root`'s array."""
        import mindspore as ms
        from mindspore.mint import distributed as dist

        arr = contiguous(x)
        if is_bfloat16(arr):  # bfloat16 moves as its bytes
            return self.broadcast(arr.view(np.float16), root).view(arr.dtype)
        self._before_direct()
        t = ms.Tensor(arr.copy())
        with _uncast():
            dist.broadcast(t, self.ranks[root], group=self._group)
        return t.asnumpy()

    def calibrate(self, repeats: int = 10, large_bytes: int = 1 << 20):
        """Collective: measure alpha (1-element all_reduce) and beta (a `large_bytes` all_reduce) of
        MindSpore's transport as seen from Python; the maximum over ranks is kept in `self.params`
        (a TransportParams, usable with `comm.make_cost_model(params=...)`) and returned."""
        import time

        import mindspore as ms
        from mindspore.mint import distributed as dist

        from mindspore_hyper.comm.cost import TransportParams

        def timed(n_elem: int, reps: int) -> float:
            x = np.ones(n_elem, np.float32)
            t = ms.Tensor(x)
            dist.all_reduce(t, group=self._group)
            t.asnumpy()
            start = time.perf_counter()
            for _ in range(reps):
                t = ms.Tensor(x)
                dist.all_reduce(t, group=self._group)
                t.asnumpy()  # waits for the collective
            return (time.perf_counter() - start) / reps

        self._before_direct()
        p = self.size
        with _uncast():
            t_small = timed(1, repeats)
            t_large = timed(large_bytes // 4, max(2, repeats // 3))
        steps = 2.0 * (p - 1)
        alpha = t_small / steps
        beta = max(1e-13, (t_large - t_small) / (steps / p * large_bytes))
        vals = np.array([alpha, beta], np.float32)
        self._ms_all_reduce_into(vals, "max")
        self.params = TransportParams(float(vals[0]), float(vals[1]), 0.0)
        return self.params

    def shm(self):
        """The shared-memory group of the same processes (created collectively on first use)."""
        if self._shm is None:
            from mindspore_hyper.comm.shm import ShmCommunicator

            self._shm = ShmCommunicator.from_env(timeout=self.shm_timeout)
        return self._shm

    def all_to_all(self, x, split_dim: int = 0, concat_dim: int = 0) -> np.ndarray:
        """Member j gets chunk j of every member's `split_dim`, concatenated along `concat_dim`
        (an all_gather of the whole arrays: MindSpore's CPU backend has no AlltoAll)."""
        everyone = self._gather_all(x)
        return np.concatenate([np.array_split(a, self.size, axis=split_dim)[self.rank] for a in everyone],
                              axis=concat_dim)

    def reduce_scatter(self, x, dim: int = 0, op: str = "sum") -> np.ndarray:
        """This member's np.array_split chunk of the reduction (an all_reduce of the whole array:
        MindSpore's CPU backend has no ReduceScatter)."""
        return np.array_split(self.all_reduce(x, op), self.size, axis=dim)[self.rank]

    def send(self, x, peer: int) -> None:
        """Through the shared-memory transport (MindSpore's CPU backend has no send/recv)."""
        self._before_direct()
        self.shm().send(x, peer)

    def recv(self, shape, dtype, peer: int) -> np.ndarray:
        self._before_direct()
        return self.shm().recv(shape, dtype, peer)

    # ----- aggregation ------------------------------------------------------------------------
    def _new_aggregator(self):
        return CallerThreadAggregator(self._packet, self.size, self.aggregation_bytes,
                                      f"MindSporeCommunicator(rank {self.rank})")

    def close(self) -> None:
        """Stop the aggregator (queued requests fail) and the shared-memory group; later calls
        raise CommError."""
        if self._close_aggregator(f"MindSporeCommunicator(rank {self.rank})"):
            if self._shm is not None:
                self._shm.close()
            self._shm = Closed(f"MindSporeCommunicator(rank {self.rank})")
