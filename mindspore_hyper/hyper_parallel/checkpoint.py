"""HyperParallel's distributed checkpoint (`hyper_parallel.core.distributed_checkpoint.save` /
`load`) in this package's crash-safe format.

A state dict (nested dicts of Parameters, e.g. `{"model": net.parameters_dict(), "optim":
optimizer.parameters_dict()}`) is saved as one committed step of per-rank safetensors files plus
the layout manifest (docs/checkpoint.md): a Parameter laid out by the API is stored by its layout
(each rank its piece; under msrun a piece stored padded, `dtensor/padded_storage.py`, by its real
rows), an optimizer state by its parameter's, anything else replicated. Every
entry is listed in the manifest's `parameters` under its state-dict path, optimizer states too:
which entries are laid out depends on the mesh, and a checkpoint must load on any. `load` fills
the same Parameters in place from a checkpoint saved on any mesh or world size.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from mindspore import Parameter

from mindspore_hyper.checkpoint.box import Box
from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.checkpoint.holdings import (
    PARAMETERS, SINGLE_MESH, HeldTensor, Holdings, owner_of, register_cell_view,
)
from mindspore_hyper.checkpoint.load import load_checkpoint
from mindspore_hyper.checkpoint.regions import rank_box
from mindspore_hyper.checkpoint.save import save_checkpoint
from mindspore_hyper.dtensor.padded_storage import is_padded
from mindspore_hyper.hyper_parallel.session import mesh_of, runtime_of
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["save", "load", "StateDict", "cell_holdings"]


def _flatten(state_dict: Dict[str, Any], prefix: str = "") -> Dict[str, Parameter]:
    out: Dict[str, Parameter] = {}
    for key, value in state_dict.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        elif isinstance(value, Parameter):
            out[name] = value
        else:
            raise CheckpointError(f"state_dict[{name!r}]: expected a Parameter or a dict of them, got "
                                  f"{type(value).__name__} (values are loaded in place, into Parameters)")
    return out


class StateDict:
    """A state dict as the checkpoint writer sees it (`checkpoint_holdings`)."""

    def __init__(self, state_dict: Dict[str, Any]):
        if not isinstance(state_dict, dict) or not state_dict:
            raise CheckpointError("state_dict: expected a non-empty dict of Parameters")
        self.params = _flatten(state_dict)

    def checkpoint_holdings(self) -> Holdings:
        """Every Parameter with its layout and the region this process holds (see module docstring).

        Raises:
            CheckpointError: Parameters laid out on different root meshes.
        """
        meshes = {id(m.root): m for m in (mesh_of(p) for p in self.params.values()) if m is not None}
        if len(meshes) > 1:
            raise CheckpointError("state_dict: its Parameters are laid out on different root meshes; save each mesh's "
                                  "state dict separately")
        if not meshes:
            tensors = [HeldTensor(PARAMETERS, name, p, tuple(p.shape), str(p.dtype),
                                  TensorLayout.replicated(SINGLE_MESH, len(p.shape)), (0,), Box.full(p.shape))
                       for name, p in self.params.items()]
            return Holdings(SINGLE_MESH, "single", (0,), tensors, None)
        mesh = next(iter(meshes.values()))
        execution = mesh.execution()
        local = execution.local_ranks
        laid_out = {p.name: execution.parameters[id(p)] for p in self.params.values() if id(p) in execution.parameters}
        tensors = []
        for name, p in self.params.items():
            slot = execution.parameters.get(id(p))
            if slot is None:
                slot = _owner_slot(p, laid_out)
            if slot is None:
                layout, shape = TensorLayout.replicated(mesh.root, len(p.shape)), tuple(p.shape)
            else:
                layout, shape = slot.layout, tuple(slot.global_shape)
            held = rank_box(layout, local[0], shape) if len(local) == 1 else Box.full(shape)
            # under msrun a piece may be stored padded (fewer rows than devices): the checkpoint holds its real rows
            padded = slot is not None and slot.local and is_padded(p.shape, held.shape)
            tensors.append(HeldTensor(PARAMETERS, name, p, shape, str(p.dtype), layout, tuple(mesh.root.ranks),
                                      held, stored_rows=p.shape[0] if padded else None))
        group = None
        if len(local) == 1 and mesh.root.size > 1:
            from mindspore_hyper.runtime.distributed.world import world

            group = world().communicator(tuple(range(world().size)))
        return Holdings(mesh.root, runtime_of(execution).name, tuple(local), tensors, None, group)


def cell_holdings(cell) -> Optional[Holdings]:
    """The holdings of a Cell whose Parameters the API laid out (its parameter paths as names),
    for `mh.save_checkpoint` / `load_checkpoint` of the Cell itself; None for a Cell it did not
    lay out."""
    params = dict(cell.parameters_and_names())
    if all(mesh_of(p) is None for p in params.values()):
        return None
    return StateDict(params).checkpoint_holdings()


register_cell_view(cell_holdings)


def _owner_slot(state: Parameter, laid_out: Dict[str, Any]):
    """The slot of the laid-out parameter an optimizer state belongs to (`owner_of`'s rule)."""
    owner = owner_of(state.name, state, {name: slot.param for name, slot in laid_out.items()})
    return laid_out[owner] if owner is not None else None


def _check_options(storage, planner, no_dist: bool) -> None:
    """Refuse what this writer does not do (custom storage or planners; `no_dist` on a job of
    several processes)."""
    if storage is not None or planner is not None:
        raise CheckpointError("custom storage writers/readers and planners are not supported; pass checkpoint_id")
    if no_dist:
        from mindspore_hyper.hyper_parallel.session import holds_all_ranks

        if not holds_all_ranks():
            raise CheckpointError("no_dist=True: this job has several processes and every one takes part in the "
                                  "commit; pass no_dist=False")


def save(state_dict: Dict[str, Any], *, checkpoint_id=None, storage_writer=None, planner=None, no_dist: bool = False,
         use_collectives: bool = True):
    """Save `state_dict` as a new committed step of `checkpoint_id` (every rank calls it).

    Returns:
        The Manifest written.

    Raises:
        CheckpointError: no checkpoint_id, a custom storage writer or planner, `use_collectives=False`
            (the commit is agreed by all ranks), `no_dist=True` on several processes, values that
            are not Parameters.
    """
    _check_options(storage_writer, planner, no_dist)
    if checkpoint_id is None:
        raise CheckpointError("save: pass checkpoint_id (the checkpoint directory)")
    if not use_collectives:
        raise CheckpointError("save(use_collectives=False): every rank agrees on the commit here; pass True")
    return save_checkpoint(StateDict(state_dict), os.fspath(checkpoint_id))


def load(state_dict: Dict[str, Any], *, checkpoint_id=None, storage_reader=None, planner=None,
         no_dist: bool = False) -> None:
    """Fill `state_dict`'s Parameters in place from the newest step of `checkpoint_id`, saved on
    any mesh or world size (each rank reads only the pieces it holds).

    Raises:
        CheckpointError: see `mindspore_hyper.checkpoint.load_checkpoint`; nothing is changed then.
    """
    _check_options(storage_reader, planner, no_dist)
    if checkpoint_id is None:
        raise CheckpointError("load: pass checkpoint_id (the checkpoint directory)")
    load_checkpoint(StateDict(state_dict), os.fspath(checkpoint_id))
