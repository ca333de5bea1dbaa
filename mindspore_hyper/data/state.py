"""A loader's position as plain JSON data: what `ShardedLoader.state_dict()` returns and what a
checkpoint stores (`save_checkpoint(..., extra_state={"data": loader})`).

The position is counted in samples of the global order (`order.py`), so it means the same at
every data-parallel size and global batch: a run saved at 4 ranks resumes at 2 without a sample
repeated or skipped. The dataset's fingerprint, the seed and the shuffle flag are kept to refuse a
state that belongs to another order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

__all__ = ["FORMAT", "LoaderState"]

FORMAT = "mindspore_hyper.data/1"


@dataclass(frozen=True)
class LoaderState:
    """A loader's saved position.

    Attributes:
        consumed: global samples consumed since the start (all epochs).
        epoch: the epoch the next sample comes from (consumed // samples per epoch).
        seed: the shuffle seed.
        shuffle: whether epochs are shuffled.
        dataset: the source's fingerprint (kind, sample count, and for a token file its name,
            size, seq_len and checksum).
        global_batch: the global batch when saved (information: it may change on resume).
        dp_size: the data-parallel size when saved (information: it may change on resume).
    """

    consumed: int
    epoch: int
    seed: int
    shuffle: bool
    dataset: Dict[str, Any]
    global_batch: int
    dp_size: int

    def to_dict(self) -> Dict[str, Any]:
        return {"format": FORMAT, "consumed": self.consumed, "epoch": self.epoch, "seed": self.seed,
                "shuffle": self.shuffle, "dataset": dict(self.dataset), "global_batch": self.global_batch,
                "dp_size": self.dp_size}

    @classmethod
    def from_dict(cls, data: Any) -> "LoaderState":
        """Read a state_dict, checking every field.

        Raises:
            ValueError: not a loader state, or a missing or malformed field (named).
        """
        if not isinstance(data, dict):
            raise ValueError(f"state: expected a dict (a ShardedLoader's state_dict()), got {type(data).__name__}")
        if data.get("format") != FORMAT:
            raise ValueError(f"state.format: expected {FORMAT!r}, got {data.get('format')!r} (not a ShardedLoader "
                             "state)")
        values = {}
        for name in ("consumed", "epoch", "seed", "global_batch", "dp_size"):
            value = data.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"state.{name}: expected an int >= 0, got {value!r}")
            values[name] = value
        if not isinstance(data.get("shuffle"), bool):
            raise ValueError(f"state.shuffle: expected a bool, got {data.get('shuffle')!r}")
        if not isinstance(data.get("dataset"), dict):
            raise ValueError(f"state.dataset: expected the dataset's fingerprint (a dict), got {data.get('dataset')!r}")
        return cls(shuffle=data["shuffle"], dataset=dict(data["dataset"]), **values)
