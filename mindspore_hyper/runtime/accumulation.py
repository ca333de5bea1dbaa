"""Gradient accumulation: a global batch cut into micro-batches along dim 0.

`ParallelModel.train_step(..., accumulation_steps=k)` runs the forward and backward of each of the
k micro-batches, adds their gradients, and averages (the mean loss of the whole batch, as one
device computes it on the concatenated batch); the data-parallel gradient reduction runs once,
after the last micro-batch's backward, and then the optimizer once.
"""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

from mindspore import Parameter, Tensor

__all__ = ["check_accumulation_steps", "split_batch", "is_batched", "micro_batch_rows"]


def check_accumulation_steps(steps: Any) -> int:
    """`steps` as an int.

    Raises:
        ValueError: naming `accumulation_steps`, when it is not an int >= 1.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"accumulation_steps={steps!r}: expected an int >= 1 (micro-batches per optimizer step)")
    return steps


def split_batch(inputs: Sequence[Any], steps: int) -> List[Tuple[Any, ...]]:
    """The micro-batches of `inputs`: every Tensor input with a batch dimension cut into `steps`
    equal pieces along dim 0; other inputs (Parameters, 0-d tensors, Python values) go to every
    micro-batch unchanged.

    Raises:
        ValueError: an input's dim 0 is not divisible by `steps` (naming the input and both
            numbers), or an input is a DTensor (give global tensors).
    """
    if steps == 1:
        return [tuple(inputs)]
    pieces = []
    for index, x in enumerate(inputs):
        if is_batched(index, x, steps):
            n = micro_batch_rows(index, x, steps)
            pieces.append([x[i * n:(i + 1) * n] for i in range(steps)])
        else:
            pieces.append([x] * steps)
    return [tuple(p[i] for p in pieces) for i in range(steps)]


def is_batched(index: int, x: Any, steps: int) -> bool:
    """Whether input `index` is cut into micro-batches: a Tensor with a dim 0 (not a Parameter).

    Raises:
        ValueError: `x` is a 0-d DTensor (give global tensors).
    """
    if isinstance(x, Tensor) and not isinstance(x, Parameter) and x.ndim > 0:
        return True
    if type(x).__name__ == "DTensor":
        raise ValueError(f"accumulation_steps={steps}: input {index} is a DTensor; give the global batch as "
                         f"mindspore Tensors, it is cut into micro-batches before being split over the mesh")
    return False


def micro_batch_rows(index: int, x: Tensor, steps: int) -> int:
    """Rows of input `index` (a batched Tensor) in each of `steps` micro-batches.

    Raises:
        ValueError: its dim 0 is not divisible by `steps` (naming the input and both numbers).
    """
    size = x.shape[0]
    if size % steps:
        raise ValueError(f"accumulation_steps={steps}: input {index} (shape {tuple(x.shape)}) has batch size "
                         f"{size} on dim 0, not divisible by {steps}")
    return size // steps
