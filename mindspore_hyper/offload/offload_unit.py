"""Offload units: the sub-Cells chosen by an `OffloadPolicy`, each with its Parameters and, per
device, where their values, gradients and optimizer states live in that device's store."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from mindspore import Parameter, Tensor, nn

from mindspore_hyper.offload.device_shards import DeviceShard
from mindspore_hyper.offload.store import OffloadStore, TensorRef
from mindspore_hyper.offload.workspace import Workspace
from mindspore_hyper.units import format_bytes

__all__ = ["OffloadPolicy", "OffloadUnit", "UnitOnDevice", "WorkingSetError", "make_units", "check_working_sets",
           "select_cells"]


class WorkingSetError(ValueError):
    """A sub-Cell's working set does not fit in the device tier (the model cannot run offloaded)."""


@dataclass
class OffloadPolicy:
    """What to offload.

    Args:
        cells: name patterns (fnmatch, as in ``model.cells_and_names()``) of the sub-Cells whose
            parameters live in the store; a matching Cell inside another matching Cell belongs to
            the outer one. None: every direct child Cell that has parameters.
        activation_cells: name patterns of Cells whose saved activations are swapped to the store.
        min_activation_bytes: activations smaller than this stay in memory.
        expert_cache: how the experts of `moe.MoE` layers are cached (`offload.expert_cache.ExpertCacheConfig`:
            policy, device-tier capacity in experts); None: the context flags `moe_cache_policy`
            and `moe_cache_capacity`. Experts are always kept by the expert cache, whatever `cells`.
    """

    cells: Optional[Sequence[str]] = None
    activation_cells: Sequence[str] = ()
    min_activation_bytes: int = 0
    expert_cache: Optional[object] = None

    def __post_init__(self):
        from mindspore_hyper.offload.expert_cache import ExpertCacheConfig

        if self.expert_cache is not None and not isinstance(self.expert_cache, ExpertCacheConfig):
            raise ValueError(f"OffloadPolicy.expert_cache={self.expert_cache!r}: expected an ExpertCacheConfig or None")


@dataclass
class UnitOnDevice:
    """One unit's tensors in one device's store: its parameter shards, the gradients and
    optimizer states of the part it updates (lists parallel to the unit's parameters)."""

    store: OffloadStore
    shards: List[DeviceShard]
    params: List[TensorRef] = field(default_factory=list)
    grads: List[TensorRef] = field(default_factory=list)
    states: List[TensorRef] = field(default_factory=list)  # the workspace optimizer's states, in order
    workspaces: List[Workspace] = field(default_factory=list)  # of its signature, used in turn

    # The tensors never move to other blocks once stored: computed on first use (after set-up).
    @cached_property
    def param_blocks(self) -> List[int]:
        return unique(b for r in self.params for b in r.blocks)

    @cached_property
    def update_blocks(self) -> List[int]:
        return unique([*self.param_blocks, *(b for r in self.states for b in r.blocks),
                       *(b for r in self.grads for b in r.blocks)])

    @cached_property
    def param_bytes(self) -> int:
        return sum(r.nbytes for r in self.params)


@dataclass
class OffloadUnit:
    """An offloaded sub-Cell: its Parameters and, per device, where their values live."""

    name: str
    cell: nn.Cell
    params: List[Parameter] = field(default_factory=list)
    shapes: List[Tuple[int, ...]] = field(default_factory=list)  # global shapes of the params
    devices: List[UnitOnDevice] = field(default_factory=list)
    resident_depth: int = 0  # nesting of forward/backward uses currently holding the params
    step_grads: Optional[list] = None  # train_step: gradients the backward has delivered so far
    cell_backward_hooks: bool = False  # backward uses tracked by Cell hooks (see UseHooks)

    def placeholder(self, i: int) -> Tensor:
        """The one-element tensor parameter `i` holds while its values live in the stores."""
        return Tensor(np.zeros((1,), dtype=self.devices[0].params[i].dtype))

    @cached_property
    def param_blocks(self) -> int:
        """The most parameter blocks any one device holds for this unit."""
        return max(len(d.param_blocks) for d in self.devices)


def unique(blocks: Iterable[int]) -> List[int]:
    """`blocks` without repeats, in first-seen order."""
    seen, out = set(), []
    for b in blocks:
        if b not in seen:
            seen.add(b)
            out.append(b)
    return out


def select_cells(model: nn.Cell, policy: OffloadPolicy) -> List[Tuple[str, nn.Cell]]:
    """The (name, Cell) pairs the policy offloads, in model order.

    Raises:
        ValueError: `policy.cells` matches no sub-Cell with parameters.
    """
    if policy.cells is None:
        return [(n, c) for n, c in model.name_cells().items() if c.trainable_params()]
    chosen = []
    for name, cell in model.cells_and_names():
        if not name or not any(fnmatch.fnmatchcase(name, pat) for pat in policy.cells):
            continue
        if any(name.startswith(outer + ".") for outer, _ in chosen):
            continue  # inside an already chosen Cell
        if cell.trainable_params():
            chosen.append((name, cell))
    if not chosen:
        raise ValueError(f"offload policy cells={list(policy.cells)!r} match no sub-Cell with parameters")
    return chosen


def make_units(model: nn.Cell, policy: OffloadPolicy, stores: Sequence[OffloadStore],
               shards_of: Callable[[Parameter], List[DeviceShard]],
               optimizer: Callable[[list], nn.Cell], exclude: Iterable[int] = ()) -> List[OffloadUnit]:
    """Puts the chosen sub-Cells' parameters (with fresh optimizer states and zero gradients)
    into the stores and leaves a one-element placeholder in each Parameter.

    Args:
        model: the network.
        policy: which sub-Cells.
        stores: one per device.
        shards_of: a parameter's `DeviceShard` per device.
        optimizer: factory ``params -> nn.Optimizer`` of the workspaces' optimizers.
        exclude: ids of Parameters kept elsewhere (an MoE layer's experts); a Cell left without
            parameters makes no unit.

    Returns:
        The units, in model order.
    """
    units, seen = [], set(exclude)
    workspaces: Dict[tuple, List[Workspace]] = {}
    for name, cell in select_cells(model, policy):
        unit = OffloadUnit(name, cell)
        unit.params = [p for p in cell.trainable_params() if id(p) not in seen]
        if not unit.params:
            continue
        seen.update(id(p) for p in unit.params)
        values = [p.asnumpy() for p in unit.params]
        unit.shapes = [v.shape for v in values]
        per_param = [shards_of(p) for p in unit.params]
        for rank, store in enumerate(stores):
            shards = [s[rank] for s in per_param]
            unit.devices.append(_store_on_device(store, shards, values, workspaces, optimizer))
        units.append(unit)
    for u in units:
        for i, p in enumerate(u.params):
            p.set_data(u.placeholder(i), slice_shape=True)
    for store in stores:
        store.close_pack()
    return units


def _store_on_device(store: OffloadStore, shards: List[DeviceShard], values: List[np.ndarray],
                     workspaces: Dict[tuple, List[Workspace]], optimizer: Callable[[list], nn.Cell]) -> UnitOnDevice:
    """Puts one device's shards of a unit's parameters, with fresh optimizer states and zero
    gradients of the part it updates, into its store."""
    store.close_pack()
    dev = UnitOnDevice(store, shards)
    updates = [v[s.update_region] for s, v in zip(shards, values)]
    signature = tuple((u.shape, str(u.dtype)) for u in updates)
    if signature not in workspaces:
        # Two per signature: one update is loaded while the previous one's optimizer runs and
        # its results are written out.
        workspaces[signature] = [Workspace(updates, optimizer, 2 * len(workspaces) + i) for i in range(2)]
    dev.workspaces = workspaces[signature]
    dev.params = [store.put(v[s.param_region]) for s, v in zip(shards, values)]
    dev.states = [store.put(value) for value in dev.workspaces[0].initial_states]
    dev.grads = [store.put(np.zeros(u.shape, u.dtype)) for u in updates]
    return dev


def check_working_sets(units: Sequence[OffloadUnit]) -> None:
    """Raises WorkingSetError if a unit's working set (its parameter blocks, or those with its
    optimizer states and gradients) exceeds a device tier."""
    for u in units:
        for rank, dev in enumerate(u.devices):
            store = dev.store
            fwd, upd = len(dev.param_blocks), len(dev.update_blocks)
            need = max(fwd, upd)
            if need > store.device_blocks:
                where = f" on device {rank}" if len(u.devices) > 1 else ""
                raise WorkingSetError(
                    f"Cell '{u.name}' cannot run offloaded{where}: its working set is {need} blocks of "
                    f"{format_bytes(store.block_size, short=True)} ({format_bytes(need * store.block_size, short=True)}: "
                    f"parameters {format_bytes(dev.param_bytes, short=True)} in {fwd} blocks, with optimizer "
                    f"states and gradients {upd} blocks) but the device tier holds {store.device_blocks} blocks "
                    f"({format_bytes(store.device_memory, short=True)}). Raise device_memory, lower "
                    f"cache_block_size, or offload smaller sub-Cells.")


def all_workspaces(units: Sequence[OffloadUnit]) -> List[Workspace]:
    """Every workspace the units use, once each."""
    seen: Dict[int, Workspace] = {}
    for u in units:
        for dev in u.devices:
            for ws in dev.workspaces:
                seen.setdefault(id(ws), ws)
    return list(seen.values())
