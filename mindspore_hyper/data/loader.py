"""`ShardedLoader`: global batches of a dataset in a seeded order, each process reading its part,
resumable from a checkpoint at any data-parallel size (docs/training.md, "Data loader").

Each `next(loader)` takes the next `global_batch` positions of the global order (`order.py`: one
stream over the epochs, shuffled per epoch from the seed) and returns the batch as a tuple of
columns (a token file gives `(input_ids, labels)`). Which rows a process reads (`part`):

- "global" (default): the whole global batch, in every mode. This is what
  `ParallelModel.train_step` takes in simulation and under msrun alike: the model cuts each
  rank's rows out of it (`DataShard` names the same rows).
- "rank": only this process's rows of the global batch (under msrun one block of
  `global_batch // dp_size` rows; in simulation the process holds every rank, so all rows): for
  loops that feed each rank its own data. The rows are exactly those the model would cut.

The position (`state_dict()`: samples consumed, epoch, seed, shuffle, the dataset's fingerprint)
is global, so a run saved at one data-parallel size resumes at another without a sample repeated
or skipped; `save_checkpoint(..., extra_state={"data": loader})` stores it with the model.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np

from mindspore_hyper.data.data_shard import DataShard
from mindspore_hyper.data.order import SampleOrder
from mindspore_hyper.data.sources import as_source
from mindspore_hyper.data.state import LoaderState
from mindspore_hyper.data.token_file import TokenFile

__all__ = ["ShardedLoader", "PARTS", "OUTPUTS"]

PARTS = ("global", "rank")
OUTPUTS = ("tensor", "numpy")


class ShardedLoader:
    """Batches of `source` for a data-parallel job (see module docstring).

    Args:
        source: a TokenFile, a tuple of numpy arrays, a random-access object (`__len__`,
            `__getitem__`), a `mindspore.dataset.GeneratorDataset` over one, or an unbatched
            `mindspore.dataset` pipeline (read as a stream: see `sources.py`).
        global_batch: samples per step over all data-parallel ranks.
        model: the ParallelModel the batches feed: the data-parallel size and this process's
            block are read from its strategy and held ranks. None: `dp_size`/`dp_rank`, or one rank.
        dp_size: the data-parallel size without a model (default 1).
        dp_rank: this process's block without a model; None: it holds every block.
        part: "global" or "rank" (module docstring).
        shuffle: shuffle each epoch from `seed`; None: True for a random-access source, False for
            a stream (which cannot be reshuffled: True is refused).
        seed: the shuffle seed (int >= 0).
        num_epochs: stop (StopIteration) before the first batch that would go past this many
            epochs; None: endless.
        output: "tensor" (mindspore Tensors) or "numpy".

    Raises:
        ValueError: a global batch the data-parallel size does not divide, bad arguments (named),
            shuffle=True on a stream; see also `TokenFile` and `as_source`.
        TypeError: a source of no accepted kind.
    """

    def __init__(self, source: Any, global_batch: int, *, model: Any = None, dp_size: Optional[int] = None,
                 dp_rank: Optional[int] = None, part: str = "global", shuffle: Optional[bool] = None, seed: int = 0,
                 num_epochs: Optional[int] = None, output: str = "tensor"):
        if model is not None and (dp_size is not None or dp_rank is not None):
            raise ValueError("model=, dp_size=/dp_rank=: give the model (its data axis decides) or the sizes, not both")
        self.shard = DataShard.of_model(model) if model is not None else \
            DataShard(1 if dp_size is None else dp_size, dp_rank, "dp_size")
        self.shard.check(global_batch)
        if part not in PARTS:
            raise ValueError(f"part={part!r}: expected one of {PARTS}")
        if output not in OUTPUTS:
            raise ValueError(f"output={output!r}: expected one of {OUTPUTS}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r}: expected an int >= 0")
        if num_epochs is not None and (isinstance(num_epochs, bool) or not isinstance(num_epochs, int)
                                       or num_epochs < 1):
            raise ValueError(f"num_epochs={num_epochs!r}: expected an int >= 1 or None")
        self.source = as_source(source)
        if shuffle is None:
            shuffle = self.source.random_access
        if shuffle and not self.source.random_access:
            raise ValueError("shuffle=True: a streamed mindspore.dataset pipeline cannot be reshuffled per epoch by "
                             "the loader (and resumed exactly); give a random-access source (a GeneratorDataset over "
                             "a source with __getitem__, arrays, a TokenFile) or shuffle=False")
        self.global_batch, self.part, self.seed, self.shuffle = global_batch, part, seed, bool(shuffle)
        self.num_epochs, self.output = num_epochs, output
        self.order = SampleOrder(self.source.samples, seed, self.shuffle)
        self.consumed = 0
        self.last_indices: Optional[np.ndarray] = None  # global sample indices of the last global batch
        self._stream: Optional[Iterator] = None
        self._stream_at: Tuple[int, int] = (-1, -1)  # (epoch, offset) the stream yields next

    # -- what it reads ---------------------------------------------------------------------------
    @property
    def samples_per_epoch(self) -> int:
        return self.source.samples

    @property
    def epoch(self) -> int:
        """The epoch the next sample comes from."""
        return self.consumed // self.source.samples

    @property
    def rows(self) -> slice:
        """The rows of each global batch this process gets."""
        return self.shard.rows(self.global_batch, self.part)

    @property
    def tokens_per_batch(self) -> Optional[int]:
        """Tokens a global batch holds (input positions) for a token file; None for other sources."""
        data = getattr(self.source, "data", None)
        return self.global_batch * data.seq_len if isinstance(data, TokenFile) else None

    # -- iteration -------------------------------------------------------------------------------
    def __iter__(self) -> "ShardedLoader":
        return self

    def __next__(self) -> Tuple[Any, ...]:
        if self.num_epochs is not None and self.consumed + self.global_batch > self.num_epochs * self.source.samples:
            raise StopIteration
        indices = self.order.indices(self.consumed, self.global_batch)
        rows = self.rows
        if self.source.random_access:
            columns = self.source.rows(indices[rows])
        else:
            columns = self._stream_rows(rows)
        self.last_indices = indices
        self.consumed += self.global_batch
        if self.output == "numpy":
            return tuple(columns)
        from mindspore import Tensor

        return tuple(Tensor.from_numpy(np.ascontiguousarray(c)) for c in columns)

    def _stream_rows(self, rows: slice) -> Tuple[np.ndarray, ...]:
        """The global batch's `rows` read from the stream (every sample of the batch is read, in order)."""
        kept = []
        for i in range(self.global_batch):
            epoch, offset = divmod(self.consumed + i, self.source.samples)
            if self._stream is None or self._stream_at != (epoch, offset):
                self._stream = self.source.stream(offset)
            row = next(self._stream, None)
            if row is None:
                raise ValueError(f"source: the mindspore.dataset pipeline ended after {offset} samples of epoch "
                                 f"{epoch}, but its get_dataset_size() is {self.source.samples}")
            self._stream_at = (epoch, offset + 1) if offset + 1 < self.source.samples else (epoch + 1, 0)
            if offset + 1 == self.source.samples:
                self._stream = None  # the next epoch starts a fresh iterator
            if rows.start <= i < rows.stop:
                kept.append(row)
        return tuple(np.stack(column) for column in zip(*kept))

    # -- position --------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """The position as JSON-ready data (see state.py); the same on every rank."""
        return LoaderState(self.consumed, self.epoch, self.seed, self.shuffle, self.source.fingerprint(),
                           self.global_batch, self.shard.size).to_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resume from a `state_dict()`, saved at any data-parallel size and global batch: the next
        batch starts at the first sample not consumed.

        Raises:
            ValueError: a malformed state, or one of another dataset, seed or shuffle (named);
                the loader is unchanged then.
        """
        saved = LoaderState.from_dict(state)
        mine = self.source.fingerprint()
        if saved.dataset != mine:
            raise ValueError(f"state.dataset: the state was saved reading {saved.dataset}, this loader reads {mine}; "
                             "its position does not apply to this dataset")
        if saved.seed != self.seed:
            raise ValueError(f"state.seed: the state was saved with seed={saved.seed}, this loader has seed="
                             f"{self.seed}; the sample order would change (samples repeated and skipped): build the "
                             f"loader with seed={saved.seed}")
        if saved.shuffle != self.shuffle:
            raise ValueError(f"state.shuffle: the state was saved with shuffle={saved.shuffle}, this loader has "
                             f"shuffle={self.shuffle}; build the loader with shuffle={saved.shuffle}")
        self.consumed = saved.consumed
        self.last_indices, self._stream, self._stream_at = None, None, (-1, -1)

    def __repr__(self) -> str:
        return (f"ShardedLoader(global_batch={self.global_batch}, dp_size={self.shard.size}, part={self.part!r}, "
                f"rows={self.rows.start}:{self.rows.stop}, shuffle={self.shuffle}, seed={self.seed}, "
                f"consumed={self.consumed}, epoch={self.epoch})")
