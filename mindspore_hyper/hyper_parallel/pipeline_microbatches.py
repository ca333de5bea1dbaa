"""Upstream's `BatchDimSpec` and the split of a pipeline step's inputs into microbatches.

Upstream cuts each input along its batch dimension (dimension 0 unless a `BatchDimSpec` says
otherwise; -1: not split, every microbatch gets the whole input) into `micro_batch_num`
consecutive equal parts. Upstream drops a remainder silently; here a batch the microbatches do
not divide is refused.

A DTensor input is cut as upstream cuts it (`custom_shard` of the slice, as torch's pipelining
does): each device's local piece into `micro_batch_num` consecutive parts, each microbatch a
DTensor on the same mesh with the same placements. Where the batch dimension is not sharded that
is the global tensor's consecutive split; where it is `Shard`ed, microbatch m holds the m-th part
of every device's rows (16 rows over 2 devices, 8 microbatches: rows m and 8 + m). Every
device's piece must divide by the microbatches (checked from the layout, so every process
agrees).
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
        ValueError: more batch dims than inputs, a batch dim outside an input, or a batch size
            `num` does not divide (for a DTensor: a device's piece; each names the input).
    """
    if batch_dims is not None and len(batch_dims) != len(args):
        raise ValueError(f"args_batch_dim has {len(batch_dims)} entries for {len(args)} inputs to run(); give one "
                         f"per input")
    parts = []
    for i, x in enumerate(args):
        spec = batch_dims[i] if batch_dims is not None else None
        dim = 0 if spec is None else spec.batch_dim
        if not isinstance(x, Tensor) or dim == -1:
            parts.append([x] * num)
            continue
        if not -x.ndim <= dim < x.ndim:
            raise ValueError(f"run(): input {i} (shape {tuple(x.shape)}) has no batch dimension {dim}")
        if isinstance(x, DTensor):
            parts.append(_split_dtensor(x, i, dim % x.ndim, num))
            continue
        size = int(x.shape[dim])
        if size % num:
            raise ValueError(f"run(): micro_batch_num={num} does not divide input {i}'s batch dimension {dim} "
                             f"(size {size}, shape {tuple(x.shape)})")
        parts.append(list(ops.split(x, size // num, axis=dim)))
    return [tuple(p[k] for p in parts) for k in range(num)]


def _split_dtensor(x: DTensor, index: int, dim: int, num: int) -> List[DTensor]:
    """`x` cut into `num` microbatches along `dim` as upstream cuts a DTensor (module docstring).

    Raises:
        ValueError: a device's piece of `dim` that `num` does not divide, or microbatch pieces that
            are not the torch.chunk pieces of the microbatch's global size (named).
    """
    layout, size = x.layout, int(x.shape[dim])
    mesh = layout.mesh
    pieces = {r: layout.dim_bounds(dim, size, mesh.coords(r))[1] for r in mesh.ranks}
    wrong = {r: n for r, n in pieces.items() if n % num}
    if wrong:
        raise ValueError(f"run(): micro_batch_num={num} does not divide input {index}'s batch dimension {dim} on "
                         f"every device: the DTensor (shape {tuple(x.shape)}, placements {x.placements}) holds "
                         f"{sorted(set(pieces.values()))} rows there per device ({wrong} on ranks {sorted(wrong)}); "
                         f"each device's rows are cut into the microbatches, as upstream's")
    micro = size // num
    shape = tuple(micro if d == dim else n for d, n in enumerate(x.shape))
    uneven = {r: n // num for r, n in pieces.items() if layout.dim_bounds(dim, micro, mesh.coords(r))[1] != n // num}
    if uneven:
        raise ValueError(f"run(): input {index}'s microbatches (batch dimension {dim}: {micro} rows, placements "
                         f"{x.placements}) would hold {uneven} rows on ranks {sorted(uneven)}, not torch.chunk pieces "
                         f"of {micro}; use a batch every device holds an equal share of")
    return [DTensor.from_local(part, x.device_mesh, x.placements, shape=shape)
            for part in ops.tensor_split(x.to_local(), num, axis=dim)]
