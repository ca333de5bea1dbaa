"""In-process transport: one Python process holds every rank's buffer (simulation mode).

`InProcessCommunicator(size)` runs the C++ algorithms with one thread per virtual rank over heap
channels, so the algorithm choice (from the topology's alpha-beta model), the chunked ring, the
recursive doubling, the hierarchy and the aggregator are the real ones; results are exact
(integer) or equal to a numpy reference up to floating-point reassociation.

Every collective takes a list with one numpy array per rank (index = rank in the group) and
returns a new list of per-rank results; inputs are not modified.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from mindspore_hyper.comm._common import _C, check_op, contiguous, dtype_name, split_counts
from mindspore_hyper.comm._handles import EMPTY_AGGREGATOR_STATS, AsyncHandle, Closed
from mindspore_hyper.comm.cost import TransportParams, apply_overrides
from mindspore_hyper.comm.topology import PRESETS, Topology, load_topology

__all__ = ["InProcessCommunicator"]

_PRESET_DEFAULT_DEVICES = {"supernode384": 384, "node8": 16, "ring": 8}


def _resolve_topology(topology, size: int, devices: Optional[Sequence[int]]) -> Optional[Topology]:
    if topology is False:
        return None
    if isinstance(topology, Topology):
        return topology
    if topology is None:
        from mindspore_hyper.context import get_context

        topology = get_context("topology")
    if isinstance(topology, str) and topology in PRESETS:
        need = max(size, (max(devices) + 1) if devices else 0)
        return Topology.preset(topology, max(need, _PRESET_DEFAULT_DEVICES[topology]))
    return load_topology(topology)


def _check_per_rank(values, arg: str, size: int) -> None:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise TypeError(f"{arg}: expected a list with one entry per rank, got {type(values).__name__}")
    if len(values) != size:
        raise ValueError(f"{arg} has {len(values)} entries, expected {size} (one per rank)")


class InProcessCommunicator:
    """All ranks of one group in this process.

    Args:
        size: number of ranks.
        topology: preset name, YAML path, Topology, None (the context flag ``topology``) or False
            (no topology: a uniform group, transport costs only).
        devices: the topology device of each rank (default ``range(size)``).
        aggregation_bytes: super-packet size of `all_reduce_async` (default: context flag
            ``comm_aggregation_bytes``).
        max_delay: seconds after which a partly filled packet is sent anyway.
        timeout: seconds without progress before a collective fails with CommTimeout.
        channel_bytes: ring-buffer bytes per directed pair (default 1MB, less for large groups).
    """

    def __init__(self, size: int, topology=None, devices: Optional[Sequence[int]] = None,
                 aggregation_bytes: Optional[int] = None, max_delay: float = 5e-3, timeout: float = 60.0,
                 channel_bytes: Optional[int] = None):
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"size={size!r}: expected a positive int")
        self.size = size
        self.topology = _resolve_topology(topology, size, devices)
        self.devices = list(devices) if devices is not None else list(range(size))
        if len(self.devices) != size:
            raise ValueError(f"devices has {len(self.devices)} entries for a group of {size}")
        if channel_bytes is None:
            channel_bytes = 1 << 20 if size <= 16 else max(64 << 10, (256 << 20) // (size * size))
        if aggregation_bytes is None:
            from mindspore_hyper.context import get_context

            aggregation_bytes = get_context("comm_aggregation_bytes")
        self.aggregation_bytes = int(aggregation_bytes)
        self.max_delay = float(max_delay)
        # With a topology the model uses the hardware costs only (what the simulated cluster
        # would spend); without one, nominal in-process costs until calibrate() measures them.
        params = TransportParams() if self.topology is not None else TransportParams(2e-6, 2e-10, 2.5e-10)
        self._g = _C.InProcCommunicator(size, self.topology.cpp if self.topology is not None else None,
                                 self.devices if self.topology is not None else [], int(channel_bytes),
                                 float(timeout), params)
        for r in range(size):
            apply_overrides(self._g.model(r))
        # Every rank's arrays are here: agreement is checked in Python (same message as the C++
        # check, without a ring exchange of descriptors through `size` threads).
        self._g.set_validate(False)

    # ----- helpers ----------------------------------------------------------------------------
    def _check(self, arrays, arg: str = "arrays") -> List[np.ndarray]:
        """The per-rank list `arrays` as C-contiguous arrays; ValueError naming `arg` unless one per rank."""
        _check_per_rank(arrays, arg, self.size)
        return [contiguous(a) for a in arrays]

    @staticmethod
    def _agree(xs: List[np.ndarray], kind: str, op: Optional[str] = None, root: Optional[int] = None,
               sizes: bool = True) -> None:
        """Raise CommMismatch naming rank 0 and the first rank that disagrees (dtype, size)."""
        def describe(x):
            text = f"{kind}({dtype_name(x)}"
            if sizes:
                text += f", {x.size} elements"
            if op is not None:
                text += f", op {op}"
            if root is not None:
                text += f", root {root}"
            return text + ")"

        for r in range(1, len(xs)):
            if xs[r].dtype != xs[0].dtype or (sizes and xs[r].size != xs[0].size):
                raise _C.CommMismatch(f"mismatched collective across ranks: rank 0 calls {describe(xs[0])} but "
                                      f"rank {r} calls {describe(xs[r])}")

    def set_validate(self, enabled: bool) -> None:
        """Also run the C++ cross-rank agreement check (a descriptor all-gather) before every
        collective; off by default in-process, where the Python check sees every rank's array."""
        self._g.set_validate(bool(enabled))

    def _flush_pending(self) -> None:
        if self._g.has_aggregation():
            self._g.flush()

    @property
    def last_algorithm(self) -> str:
        """The algorithm the last collective used (e.g. 'ring', 'recursive_doubling', 'hierarchical')."""
        return self._g.last_algorithm()

    @property
    def ring(self) -> List[int]:
        """Ranks in the ring order chosen from the topology."""
        return self._g.ring()

    def model(self, rank: int = 0):
        """The C++ CostModel rank `rank` chooses algorithms with (set_threshold / force_algorithm)."""
        return self._g.model(rank)

    def set_threshold(self, kind: str, nbytes: Optional[float]) -> None:
        for r in range(self.size):
            self._g.model(r).set_threshold(kind, -1.0 if nbytes is None else float(nbytes))

    def force_algorithm(self, kind: str, algorithm: Optional[str]) -> None:
        for r in range(self.size):
            self._g.model(r).force_algorithm(kind, algorithm or "auto")


    def calibrate(self, repeats: int = 10):
        """Measure this transport's alpha/beta/gamma and use them in the model; returns them."""
        return self._g.calibrate(repeats)

    # ----- collectives ------------------------------------------------------------------------
    def all_reduce(self, arrays: Sequence[np.ndarray], op: str = "sum", algorithm: str = "auto") -> List[np.ndarray]:
        """Element-wise reduction (sum, max, min, avg) of the ranks' arrays; every rank gets it."""
        check_op(op)
        xs = [a.copy() for a in self._check(arrays)]
        self._agree(xs, "all_reduce", op=op)
        self._flush_pending()
        self._g.all_reduce(xs, [dtype_name(x) for x in xs], [op] * self.size, algorithm)
        return xs

    def all_gather(self, arrays: Sequence[np.ndarray], dim: int = 0) -> List[np.ndarray]:
        """Concatenation of every rank's array along `dim` (sizes along `dim` may differ)."""
        xs = self._check(arrays)
        self._agree(xs, "all_gather", sizes=False)
        moved = [np.ascontiguousarray(np.moveaxis(x, dim, 0)) for x in xs]
        rest = moved[0].shape[1:]
        for r, m in enumerate(moved):
            if m.shape[1:] != rest:
                raise ValueError(f"all_gather: rank {r} has shape {xs[r].shape}, rank 0 has {xs[0].shape}; "
                                 f"only dim {dim} may differ")
        counts = [m.size for m in moved]
        rows = sum(m.shape[0] for m in moved)
        outs = [np.empty((rows,) + rest, dtype=m.dtype) for m in moved]
        self._flush_pending()
        self._g.all_gather_v(moved, outs, [counts] * self.size, [dtype_name(m) for m in moved])
        return [np.moveaxis(o, 0, dim) for o in outs]

    def reduce_scatter(self, arrays: Sequence[np.ndarray], dim: int = 0, op: str = "sum") -> List[np.ndarray]:
        """Reduce the ranks' arrays and give rank r the r-th part along `dim` (np.array_split parts)."""
        check_op(op)
        xs = self._check(arrays)
        self._agree(xs, "reduce_scatter", op=op)
        for r, x in enumerate(xs):
            if x.shape != xs[0].shape:
                raise _C.CommMismatch(f"reduce_scatter: rank 0 passes shape {xs[0].shape} but rank {r} passes {x.shape}")
        moved = [np.ascontiguousarray(np.moveaxis(x, dim, 0)) for x in xs]
        rows = moved[0].shape[0]
        rest = moved[0].shape[1:]
        inner = int(np.prod(rest)) if rest else 1
        parts = split_counts(rows, self.size)
        counts = [p * inner for p in parts]
        outs = [np.empty((parts[r],) + rest, dtype=moved[r].dtype) for r in range(self.size)]
        self._flush_pending()
        self._g.reduce_scatter(moved, outs, [counts] * self.size, [dtype_name(m) for m in moved], [op] * self.size)
        return [np.moveaxis(o, 0, dim) for o in outs]

    def all_to_all(self, arrays: Sequence[np.ndarray], split_dim: int = 0, concat_dim: int = 0) -> List[np.ndarray]:
        """Rank r splits its array along `split_dim` into `size` parts (np.array_split) and sends
        part j to rank j; rank j concatenates what it receives along `concat_dim` in rank order."""
        xs = self._check(arrays)
        self._agree(xs, "all_to_all", sizes=False)
        for r, x in enumerate(xs):
            if x.shape != xs[0].shape:
                raise _C.CommMismatch(f"all_to_all: rank 0 passes shape {xs[0].shape} but rank {r} passes {x.shape}; "
                                      "every rank must pass the same shape")
        chunks = [np.array_split(x, self.size, axis=split_dim) for x in xs]
        sends = [np.concatenate([np.ascontiguousarray(c).ravel() for c in cs]) for cs in chunks]
        send_counts = [[c.size for c in cs] for cs in chunks]
        self._flush_pending()
        res = self._g.all_to_all_v(sends, send_counts, [dtype_name(x) for x in xs])
        outs = []
        for j, (buf, recv_counts) in enumerate(res):
            flat = buf.view(xs[j].dtype)
            pieces, off = [], 0
            for r in range(self.size):
                shape = chunks[r][j].shape
                pieces.append(flat[off:off + recv_counts[r]].reshape(shape))
                off += recv_counts[r]
            outs.append(np.concatenate(pieces, axis=concat_dim))
        return outs

    def all_to_all_v(self, arrays: Sequence[np.ndarray], send_counts: Sequence[Sequence[int]]):
        """Uneven all-to-all of flat arrays: rank r sends send_counts[r][j] elements (in order) to
        rank j. Returns, per rank, (received 1-D array in source order, counts per source)."""
        xs = [x.ravel() for x in self._check(arrays)]
        _check_per_rank(send_counts, "send_counts", self.size)
        self._agree(xs, "all_to_all", sizes=False)
        for r, (x, c) in enumerate(zip(xs, send_counts)):
            if len(c) != self.size or sum(c) != x.size:
                raise ValueError(f"all_to_all_v: rank {r} sends {list(c)} elements from an array of {x.size}")
        self._flush_pending()
        res = self._g.all_to_all_v(xs, [list(map(int, c)) for c in send_counts], [dtype_name(x) for x in xs])
        return [(buf.view(xs[j].dtype).copy(), list(rc)) for j, (buf, rc) in enumerate(res)]

    def broadcast(self, arrays: Sequence[np.ndarray], root: int = 0, algorithm: str = "auto") -> List[np.ndarray]:
        """Every rank gets rank `root`'s array (the others' arrays give shape and dtype)."""
        xs = [a.copy() for a in self._check(arrays)]
        self._agree(xs, "broadcast", root=int(root))
        self._flush_pending()
        self._g.broadcast(xs, [dtype_name(x) for x in xs], int(root), algorithm)
        return xs

    def send_recv(self, array: np.ndarray, src: int, dst: int) -> np.ndarray:
        """Point-to-point: rank `src` sends `array`; returns what rank `dst` received."""
        x = contiguous(array)
        out = np.empty_like(x)
        self._flush_pending()
        self._g.send_recv(int(src), int(dst), x, out, dtype_name(x))
        return out

    def barrier(self) -> None:
        self._flush_pending()
        self._g.barrier()

    # ----- aggregation ------------------------------------------------------------------------
    def all_reduce_async(self, arrays: Sequence[np.ndarray], op: str = "sum") -> AsyncHandle:
        """Queue an all-reduce of copies of the ranks' arrays in the aggregator; packed with others
        into super-packets of `aggregation_bytes` per (dtype, op), sent when full, on flush() or
        after `max_delay`. Returns a handle whose wait() gives the per-rank results."""
        check_op(op)
        xs = self._check(arrays)
        if not self._g.has_aggregation():
            self._g.enable_aggregation(self.aggregation_bytes, self.max_delay)
        return AsyncHandle(self._g.submit(xs, op))

    def flush(self) -> None:
        """Send every queued request now and wait for them."""
        self._flush_pending()

    def aggregator_stats(self, rank: int = 0) -> dict:
        """{'requests', 'packets', 'in_place', 'bypassed', 'batches', 'bytes'} of rank `rank`'s aggregator."""
        if not self._g.has_aggregation():
            return dict(EMPTY_AGGREGATOR_STATS)
        return self._g.aggregator_stats(rank)

    def close(self) -> None:
        """Stop the aggregators (queued requests fail) and the rank threads; later calls raise CommError."""
        if not isinstance(self._g, Closed):
            self._g.close()
            self._g = Closed(f"InProcessCommunicator(size={self.size})")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
