"""Shape-dependent GEMM efficiency: the tile and wave quantisation of a tiled GEMM kernel.

A GPU GEMM library splits the M x N output of a GEMM into tiles of tm x tn, one thread block
each, and runs the blocks in waves of one block per streaming multiprocessor (SM). A partial tile
costs as much as a full one (tile quantisation: M is padded to a multiple of tm, N of tn), and a
partial last wave as much as a full one (wave quantisation: the tiles are padded to a multiple of
the SM count). The fraction of the launched work that is useful,

    u = M N / (ceil(ceil(M / tm) ceil(N / tn) batch / SMs) x SMs x tm x tn / batch),

scales the large-GEMM efficiency of the hardware (`Efficiency.matmul`) for each GEMM: a GEMM runs
at peak x matmul x u. Both tile orientations (tm x tn and tn x tm) are tried and the better one
taken. Nothing here is fitted: the SM count and the tile are the hardware's published figures
(NVIDIA's "Matrix Multiplication Background" user's guide, DU-09799-001, sections 2.3 and 3, for
A100: 108 SMs, 256 x 128 the most efficient cuBLAS tile). Not modelled: a library's choice of a
smaller tile for a narrow GEMM (which loses less to quantisation but runs each tile slower), the
K-loop's prologue and epilogue, and split-K; for N or M just above a multiple of the tile the
quantisation is therefore an upper bound of the loss.

The backward of a GEMM of forward shape (batch, M, N, K) runs the input gradient as (batch, M,
K, N) and the weight gradient as (batch, K, N, M) (`backward_shapes`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Tuple

__all__ = ["GemmShape", "GemmTiling", "tile_utilisation", "utilisation", "backward_shapes"]


@dataclass(frozen=True)
class GemmShape:
    """One (batched) GEMM: `batch` products of an M x K by a K x N matrix (an M x N output).

    Attributes:
        batch: independent products of the same shape in one launch (heads of an attention core).
        m, n, k: the output's rows and columns and the reduction length (elements).
        element_bytes: bytes per input element (2 for 16-bit).
    """

    batch: float
    m: float
    n: float
    k: float
    element_bytes: float = 2.0

    def __post_init__(self):
        for name in ("batch", "m", "n", "k", "element_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"GemmShape.{name}={value!r}: expected a positive number")

    @property
    def flops(self) -> float:
        """2 batch M N K (a multiply-add = 2 FLOPs)."""
        return 2.0 * self.batch * self.m * self.n * self.k


@dataclass(frozen=True)
class GemmTiling:
    """How a hardware's GEMM library tiles a GEMM (a hardware preset's `gemm_tiling:`).

    Attributes:
        sms: streaming multiprocessors (thread blocks of one tile running at once).
        tiles: the (tm, tn) output tiles the library chooses from (either orientation is used).
        l2_bandwidth: bytes/s the L2 cache delivers to all SMs, or None: every tile runs at the
            large-GEMM rate. With it, a tile whose main loop loads (tm + tn) tk elements per
            2 tm tn tk FLOPs runs at min(1, intensity x l2_bandwidth / peak) of that rate (the
            tile's own roofline: small tiles reuse less and wait for L2).
    """

    sms: int
    tiles: Tuple[Tuple[int, int], ...]
    l2_bandwidth: Optional[float] = None

    def __post_init__(self):
        if isinstance(self.sms, bool) or not isinstance(self.sms, int) or self.sms < 1:
            raise ValueError(f"gemm_tiling.sms={self.sms!r}: expected an int >= 1")
        tiles = self.tiles
        ok = isinstance(tiles, (list, tuple)) and len(tiles) > 0 and all(
            isinstance(t, (list, tuple)) and len(t) == 2 and all(not isinstance(x, bool) and isinstance(x, int)
                                                                 and x >= 1 for x in t) for t in tiles)
        if not ok:
            raise ValueError(f"gemm_tiling.tiles={tiles!r}: expected a non-empty list of [tm, tn], ints >= 1")
        object.__setattr__(self, "tiles", tuple(tuple(t) for t in tiles))
        bw = self.l2_bandwidth
        if bw is not None and (isinstance(bw, bool) or not isinstance(bw, (int, float)) or bw <= 0):
            raise ValueError(f"gemm_tiling.l2_bandwidth={bw!r}: expected a positive number of bytes/s or None")

    def tile_rate(self, tile: Tuple[int, int], peak_flops: float, element_bytes: float) -> float:
        """The fraction of the large-GEMM rate a tile runs at (1.0 without `l2_bandwidth`)."""
        if self.l2_bandwidth is None:
            return 1.0
        tm, tn = tile
        intensity = 2.0 * tm * tn / ((tm + tn) * element_bytes)  # FLOPs per byte loaded
        return min(1.0, intensity * self.l2_bandwidth / peak_flops)


def tile_utilisation(shape: GemmShape, tiling: GemmTiling, peak_flops: float = 1.0) -> float:
    """The useful fraction u in (0, 1] of the work launched for `shape` (module doc) at the tile
    the library would choose: the best over `tiling.tiles`, both orientations, of the quantisation
    times the tile's rate (`GemmTiling.tile_rate`).

    Args:
        shape: the GEMM.
        tiling: the hardware's tiling.
        peak_flops: the device's peak FLOP/s (used only with `tiling.l2_bandwidth`).
    """
    best = 0.0
    for tm, tn in tiling.tiles:
        rate = tiling.tile_rate((tm, tn), peak_flops, shape.element_bytes)
        for a, b in ((tm, tn), (tn, tm)):
            tiles = math.ceil(shape.m / a) * math.ceil(shape.n / b) * math.ceil(shape.batch)
            launched = math.ceil(tiles / tiling.sms) * tiling.sms * a * b
            best = max(best, rate * shape.batch * shape.m * shape.n / launched)
    return best


def utilisation(shapes: Iterable[GemmShape], tiling: GemmTiling, peak_flops: float = 1.0) -> float:
    """The utilisation of several GEMMs run one after another, sum(F_i) / sum(F_i / u_i) with F_i
    their FLOPs and u_i their `tile_utilisation` (1.0 for no GEMMs)."""
    shapes = tuple(shapes)
    if not shapes:
        return 1.0
    return sum(s.flops for s in shapes) / sum(s.flops / tile_utilisation(s, tiling, peak_flops)
                                              for s in shapes)


def backward_shapes(shape: GemmShape) -> Tuple[GemmShape, GemmShape]:
    """(input gradient, weight gradient) GEMMs of a forward GEMM: (batch, M, K, N) and (batch, K, N, M)."""
    b, e = shape.batch, shape.element_bytes
    return GemmShape(b, shape.m, shape.k, shape.n, e), GemmShape(b, shape.k, shape.n, shape.m, e)
