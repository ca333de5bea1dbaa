"""What a ShardedLoader reads: `as_source(obj)` turns the user's data into one of two kinds.

- **Random access** (`RandomAccessSource`): a `TokenFile`, a tuple of equally long numpy arrays
  (the columns), any object with `__len__` and `__getitem__(i)` returning an array or a tuple of
  arrays (what `mindspore.dataset.GeneratorDataset` takes as a random-accessible source), or a
  bare `GeneratorDataset` built on such a source (its source is read directly: the loader does the
  shuffling and sharding, the GeneratorDataset's own shuffle and sampler are not used). The
  loader reads exactly the samples it needs, in any order.
- **Stream** (`StreamSource`): any other `mindspore.dataset` pipeline (MindRecord, TFRecord,
  `.map` transforms, ...), unbatched: the loader batches. It is read in its own order, which must
  be the same in each fresh iterator (no shuffle, or a fixed `mindspore.dataset.config.set_seed`);
  a resumed position is reached by reading and dropping the samples before it in the epoch, and
  the loader cannot reshuffle it (`shuffle=True` is refused).
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Tuple

import numpy as np

from mindspore_hyper.data.token_file import TokenFile

__all__ = ["RandomAccessSource", "StreamSource", "as_source"]


def _columns(item: Any) -> Tuple[np.ndarray, ...]:
    """One sample as a tuple of numpy arrays (a single array is one column)."""
    if isinstance(item, (tuple, list)):
        return tuple(np.asarray(c) for c in item)
    return (np.asarray(item),)


class RandomAccessSource:
    """Samples read by index (see module docstring).

    Args:
        data: a TokenFile, a tuple of numpy arrays of one length, or an object with `__len__`
            and `__getitem__`.
    """

    random_access = True

    def __init__(self, data: Any):
        self.data = data
        if isinstance(data, tuple) and data and all(isinstance(c, np.ndarray) for c in data):
            lengths = {len(c) for c in data}
            if len(lengths) != 1:
                raise ValueError(f"source: the columns have different lengths {[len(c) for c in data]}")
        self.samples = len(data[0]) if self._is_columns() else len(data)
        if self.samples < 1:
            raise ValueError("source: the dataset holds no sample")

    def _is_columns(self) -> bool:
        return isinstance(self.data, tuple) and bool(self.data) and all(isinstance(c, np.ndarray) for c in self.data)

    def rows(self, indices: np.ndarray) -> Tuple[np.ndarray, ...]:
        """The samples at `indices` stacked, one array per column."""
        if isinstance(self.data, TokenFile):
            return self.data.batch(indices)
        if self._is_columns():
            return tuple(c[indices] for c in self.data)
        items = [_columns(self.data[int(i)]) for i in indices]
        return tuple(np.stack(column) for column in zip(*items))

    def fingerprint(self) -> Dict[str, Any]:
        """What identifies the samples (checked when a saved position is loaded)."""
        if isinstance(self.data, TokenFile):
            return self.data.fingerprint()
        kind = "arrays" if self._is_columns() else type(self.data).__name__
        return {"kind": kind, "samples": self.samples}


class StreamSource:
    """A `mindspore.dataset` pipeline read in its own order (see module docstring).

    Args:
        dataset: an unbatched `mindspore.dataset.Dataset`.
    """

    random_access = False

    def __init__(self, dataset: Any):
        import mindspore.dataset as ds

        if isinstance(dataset, ds.BatchDataset):
            raise ValueError("source: the mindspore.dataset pipeline is batched (.batch()); give it unbatched, the "
                             "loader makes the global batch (global_batch=) and each rank's part")
        self.dataset = dataset
        self.samples = int(dataset.get_dataset_size())
        if self.samples < 1:
            raise ValueError("source: the mindspore.dataset pipeline holds no sample")

    def stream(self, start: int) -> Iterator[Tuple[np.ndarray, ...]]:
        """The samples of one epoch from position `start` on (the ones before it are read and dropped)."""
        for i, row in enumerate(self.dataset.create_tuple_iterator(num_epochs=1, output_numpy=True)):
            if i >= start:
                yield tuple(np.asarray(c) for c in row)

    def fingerprint(self) -> Dict[str, Any]:
        """What identifies the samples (checked when a saved position is loaded)."""
        return {"kind": f"mindspore.dataset.{type(self.dataset).__name__}", "samples": self.samples}


def as_source(data: Any):
    """The RandomAccessSource or StreamSource reading `data` (see module docstring).

    Raises:
        TypeError: `data` is none of the accepted kinds (named).
        ValueError: an empty dataset, a batched pipeline, columns of different lengths.
    """
    if isinstance(data, (RandomAccessSource, StreamSource)):
        return data
    if isinstance(data, TokenFile) or (isinstance(data, tuple) and data
                                       and all(isinstance(c, np.ndarray) for c in data)):
        return RandomAccessSource(data)
    if type(data).__module__.startswith("mindspore.dataset"):
        import mindspore.dataset as ds

        if isinstance(data, ds.GeneratorDataset) and hasattr(data.source, "__getitem__") \
                and hasattr(data.source, "__len__"):
            return RandomAccessSource(data.source)
        if isinstance(data, ds.Dataset):
            return StreamSource(data)
    if hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return RandomAccessSource(data)
    raise TypeError(f"source: expected a TokenFile, a tuple of numpy arrays, a random-access object (__len__ and "
                    f"__getitem__) or a mindspore.dataset pipeline, got {type(data).__name__}")
