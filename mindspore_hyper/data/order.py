"""The global order of samples: one endless stream over the epochs, the same at every
data-parallel size.

Position `p` (samples consumed since the start) is sample `order(epoch)[p % n]` of epoch
`p // n`, where `order(epoch)` is `range(n)` without shuffling, else the permutation drawn by
numpy's PCG64 generator seeded with `(seed, epoch)` (reproducible across runs, processes and
numpy versions). A step takes positions `[p, p + global_batch)`, across an epoch boundary when
`n` is not a multiple of the batch: no sample is dropped or repeated at an epoch's end. The data
parallel size plays no part: it only decides which rows of a global batch each rank takes.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["SampleOrder"]


class SampleOrder:
    """The epoch orders of `samples` samples (see module docstring); the last epoch's is cached.

    Args:
        samples: samples per epoch (>= 1).
        seed: the shuffle seed (an int >= 0).
        shuffle: False keeps every epoch in index order.
    """

    def __init__(self, samples: int, seed: int, shuffle: bool):
        self.samples, self.seed, self.shuffle = samples, seed, shuffle
        self._epoch: Optional[int] = None
        self._order: Optional[np.ndarray] = None

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The sample indices of `epoch`, in the order they are consumed."""
        if epoch != self._epoch:
            if self.shuffle:
                self._order = np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(self.samples)
            else:
                self._order = np.arange(self.samples)
            self._epoch = epoch
        return self._order

    def indices(self, start: int, count: int) -> np.ndarray:
        """The sample indices at positions `[start, start + count)`."""
        out = np.empty(count, np.int64)
        done = 0
        while done < count:
            epoch, offset = divmod(start + done, self.samples)
            take = min(count - done, self.samples - offset)
            out[done:done + take] = self.epoch_order(epoch)[offset:offset + take]
            done += take
        return out
