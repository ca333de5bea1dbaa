"""Microbatches: split a step's inputs along the batch dimension, combine the microbatch losses."""
from __future__ import annotations

from typing import List, Sequence, Tuple

from mindspore import Tensor, ops

__all__ = ["split_microbatches", "loss_scale"]


def split_microbatches(inputs: Sequence, num_microbatches: int) -> List[Tuple]:
    """The inputs of each microbatch: every Tensor input cut into `num_microbatches` equal
    parts along dimension 0 (other inputs are passed to every microbatch as they are).

    Raises:
        ValueError: no Tensor input, or `num_microbatches` does not divide an input's batch size.
    """
    if not any(isinstance(x, Tensor) for x in inputs):
        raise ValueError("pipeline: the model's inputs hold no Tensor to split into microbatches")
    parts = []
    for i, x in enumerate(inputs):
        if not isinstance(x, Tensor):
            parts.append([x] * num_microbatches)
            continue
        if x.ndim == 0:
            raise ValueError(f"pipeline: input {i} is a scalar Tensor; microbatches split dimension 0 (the batch)")
        batch = int(x.shape[0])
        if batch % num_microbatches:
            raise ValueError(f"pipeline.microbatches={num_microbatches} does not divide the batch size {batch} of "
                             f"input {i} (shape {tuple(x.shape)})")
        parts.append(list(ops.split(x, batch // num_microbatches, axis=0)))
    return [tuple(p[k] for p in parts) for k in range(num_microbatches)]


def loss_scale(reduction: str, num_microbatches: int) -> float:
    """Factor of each microbatch's loss in the step's loss: a mean over equal microbatches is
    the mean of their means (1/m), a sum is their sum (1)."""
    return 1.0 / num_microbatches if reduction == "mean" else 1.0
