"""Upstream's `BatchDimSpec` and the split of a pipeline step's inputs into microbatches.

Upstream cuts each input along its batch dimension (dimension 0 unless a `BatchDimSpec` says
otherwise; -1: not split, every microbatch gets the whole input) into `micro_batch_num`
consecutive equal parts. Upstream drops a remainder silently; here a batch the microbatches do
not divide is refused.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from mindspore import Tensor, ops

from mindspore_hyper.dtensor.dtensor import DTensor

__all__ = ["BatchDimSpec", "check_batch_dims", "split_inputs"]


class BatchDimSpec:
    """The batch dimension of one input of a pipeline schedule (-1: the input is not split).

    Raises:
        TypeError: `batch_dim` is not an int.
    """

    __slots__ = ("batch_dim",)

    def __init__(self, batch_dim: int):
        if isinstance(batch_dim, bool) or not isinstance(batch_dim, int):
            raise TypeError(f"BatchDimSpec: batch_dim must be int, but got {batch_dim!r}")
        self.batch_dim = batch_dim

    def __repr__(self) -> str:
        return f"BatchDimSpec({self.batch_dim})"

    @staticmethod
    def from_tuple(batch_dims: tuple) -> Tuple["BatchDimSpec", ...]:
        if not isinstance(batch_dims, tuple):
            raise TypeError(f"BatchDimSpec.from_tuple: batch_dims must be a tuple, but got {type(batch_dims).__name__}")
        return tuple(BatchDimSpec(d) for d in batch_dims)

    @staticmethod
    def from_dict(batch_dims: dict) -> dict:
        if not isinstance(batch_dims, dict):
            raise TypeError(f"BatchDimSpec.from_dict: batch_dims must be a dict, but got {type(batch_dims).__name__}")
        return {k: BatchDimSpec(v) for k, v in batch_dims.items()}


def check_batch_dims(args_batch_dim) -> Optional[Tuple[Optional[BatchDimSpec], ...]]:
    """`args_batch_dim` as a tuple (None: dimension 0 everywhere).

    Raises:
        TypeError: not a list/tuple of BatchDimSpec or None.
    """
    if args_batch_dim is None:
        return None
    if not isinstance(args_batch_dim, (list, tuple)) or not all(
            d is None or isinstance(d, BatchDimSpec) for d in args_batch_dim):
        raise TypeError(f"args_batch_dim must be a list or tuple of BatchDimSpec (or None per input), but got "
                        f"{args_batch_dim!r}")
    return tuple(args_batch_dim)


def split_inputs(args: Sequence, num: int, batch_dims: Optional[Sequence[Optional[BatchDimSpec]]]) -> List[Tuple]:
    """Each microbatch's positional inputs (see module docstring); non-Tensor inputs go whole to each.

    Raises:
        ValueError: a DTensor input, more batch dims than inputs, a batch dim outside an input,
            or a batch size `num` does not divide (each names the input).
    """
    if batch_dims is not None and len(batch_dims) != len(args):
        raise ValueError(f"args_batch_dim has {len(batch_dims)} entries for {len(args)} inputs to run(); give one "
                         f"per input")
    parts = []
    for i, x in enumerate(args):
        if isinstance(x, DTensor):
            raise ValueError(f"run(): input {i} is a DTensor; DTensor inputs to a pipeline are not supported yet: "
                             f"pass the plain batch (a Tensor; a stage parallelized over its pipeline rank's devices "
                             f"takes it as every device's input)")
        spec = batch_dims[i] if batch_dims is not None else None
        dim = 0 if spec is None else spec.batch_dim
        if not isinstance(x, Tensor) or dim == -1:
            parts.append([x] * num)
            continue
        if not -x.ndim <= dim < x.ndim:
            raise ValueError(f"run(): input {i} (shape {tuple(x.shape)}) has no batch dimension {dim}")
        size = int(x.shape[dim])
        if size % num:
            raise ValueError(f"run(): micro_batch_num={num} does not divide input {i}'s batch dimension {dim} "
                             f"(size {size}, shape {tuple(x.shape)})")
        parts.append(list(ops.split(x, size // num, axis=dim)))
    return [tuple(p[k] for p in parts) for k in range(num)]
