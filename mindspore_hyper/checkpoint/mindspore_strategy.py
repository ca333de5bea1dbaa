"""MindSpore strategy files (protobuf `ParallelStrategyMap`, what `strategy_ckpt_save_file`
writes after a compile) for our layouts, so MindSpore's own tools can read our checkpoints:
`mindspore.parallel.unified_safetensors` merges a checkpoint directory with its `strategy.ckpt`,
and `load_distributed_checkpoint(..., unified_safetensors_dir=..., predict_strategy=...)`
re-slices the merged weights for a strategy file written here from a target model.

Each tensor gets the whole mesh as its device matrix and MindSpore's tensor map (axes counted
from the right, -1 unsharded). A dimension split over several mesh axes uses MindSpore's layout
form, one TensorMap per dimension; MindSpore's reader takes that form only when there is more
than one TensorMap, so a 1-d tensor gets an empty second one, which the reader drops. A 0-d
tensor is stored by MindSpore with shape [1], so its map is [-1].
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence, Tuple

from mindspore import nn

from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.shard.layout import Layout

__all__ = ["STRATEGY_NAME", "strategy_bytes", "write_strategy_file", "save_strategy_file", "expressible"]

STRATEGY_NAME = "strategy.ckpt"  # inside a checkpoint directory


def expressible(mesh: Layout) -> bool:
    """Whether MindSpore's strategy format can describe layouts on `mesh` (it has no rank list:
    mesh positions must be the ranks in order)."""
    return tuple(mesh.rank_list) == tuple(range(mesh.size))


def write_strategy_file(path: str, mesh: Layout, tensors: Iterable[Tuple[str, Sequence]]) -> None:
    """Write a strategy file for `tensors`: (name, MindSpore tensor map) pairs on `mesh`.

    Raises:
        CheckpointError: a mesh with a non-identity rank list (see `expressible`).
    """
    data = strategy_bytes(mesh, tensors)
    with open(path, "wb") as f:
        f.write(data)


def strategy_bytes(mesh: Layout, tensors: Iterable[Tuple[str, Sequence]]) -> bytes:
    """The strategy file's bytes for `tensors`: (name, MindSpore tensor map) pairs on `mesh`.

    Raises:
        CheckpointError: a mesh with a non-identity rank list (see `expressible`).
    """
    from mindspore.train import node_strategy_pb2

    if not expressible(mesh):
        raise CheckpointError(f"{mesh}: MindSpore's strategy files have no rank list; only meshes whose rank_list "
                              "is range(size) can be described")
    strategy = node_strategy_pb2.ParallelStrategyMap()
    strategy.current_stage = 0
    for name, tensor_map in tensors:
        item = strategy.parallel_layout_item.add()
        item.param_name = name
        layouts = item.parallel_layouts
        layouts.dev_matrix.add().dim.extend(mesh.device_matrix)
        entries = list(tensor_map) or [-1]
        if any(isinstance(e, (tuple, list)) for e in entries):
            for e in entries:
                layouts.tensor_map.add().dim.extend(list(e) if isinstance(e, (tuple, list)) else [e])
            if len(entries) == 1:
                layouts.tensor_map.add()
        else:
            layouts.tensor_map.add().dim.extend(entries)
        layouts.param_split_shape.add()
        layouts.indices_offset.add()
        layouts.field = 0
        layouts.opt_weight_shard_step = 0
        layouts.opt_weight_shard_size = 0
    return strategy.SerializeToString()


def save_strategy_file(model, path: str, optimizer: Optional[nn.Optimizer] = None) -> None:
    """Write the strategy file of `model`'s layouts (and `optimizer`'s states): the
    `predict_strategy` to re-slice a checkpoint for this model with MindSpore's tools.

    Args:
        model: a ParallelModel or a plain nn.Cell.
        path: the file to write.
        optimizer: include its states' layouts too, or None.

    Raises:
        CheckpointError: see `holdings_of` and `write_strategy_file`; a tensor split into uneven
            (torch.chunk) pieces, which MindSpore's format cannot describe (its tools cut every
            shard of a dimension to the same size).
    """
    from mindspore_hyper.checkpoint.holdings import holdings_of

    holdings = holdings_of(model, optimizer)
    uneven = [t.name for t in holdings.tensors if not t.layout.is_even(t.global_shape)]
    if uneven:
        raise CheckpointError(f"{', '.join(uneven)}: split into uneven pieces (a dimension its mesh axes do not "
                              "divide); MindSpore's strategy files describe only even splits")
    write_strategy_file(path, holdings.mesh, [(t.name, t.layout.ms_tensor_map) for t in holdings.tensors])
