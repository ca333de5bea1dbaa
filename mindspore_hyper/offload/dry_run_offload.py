"""`DryRunOffload`: `hyper_offload` of a dry-run model, its device-tier figures from shapes only.

What a device's tier must hold at each point of a step follows from shapes and the schedule, not
from values: the offload units and every device's shards of them (the policy and the strategy,
as in the simulation), the blocks each tensor occupies (`ShapeStore`: block size and put order),
and which units are materialized when (`Residency`: the same decisions, its own code, driven by
the same uses: each unit's forward from its Cell's hooks, then its backward in reverse order of
the forward's uses, each complete before the next, as MindSpore's PyNative backward ran them in
every model checked: the simulation's report compares it with the order it observed,
`backward_order.py`, and this one's report says it is assumed). So a dry run gives per device
the simulation's `per_device_peak_materialized_bytes` (parameter and workspace bytes materialized at once) and
`per_device_peak_pinned_bytes` (blocks pinned on the tier at once x block size), equal byte for
byte (tests/offload/test_offload_dryrun.py), and the model's `report()` the offload section
(`offload_section.py`) with the simulation's modelled figures (tests/offload/test_offload_report.py).

The activations: the dry run registers the simulation's Cell backward hooks on every unit
(`hooks.watch_cell_backward`; no backward runs to call them), so each forward call of a unit
makes and counts the same `CellBackwardHook` tensors as the simulation (its inputs once, its
outputs twice) and the memory rows equal the simulation's (tests/offload/test_offload_report.py).

The update: an optimizer with a host rule (Adam, SGD) updates each unit on the host during the
backward, pinning nothing on the tier; any other updates through the optimizer workspaces after
the backward (`UnitUpdates.update_from_store`), whose pins and workspace bytes are modelled in
its order (`DryRunOffload._store_updates`).

Refused (`NotImplementedError`, naming the option): activation swapping (`activation_cells`: the
saved tensors are MindSpore autograd's choice, which the dry run's modelled backward does not
trace), MoE layers' expert cache (its hits and loads depend on the routed tokens: values), a
model not from `auto_parallelize`; a `store` argument (`ValueError`: a dry run makes its own
shape stores). The device tier's cache of unpinned blocks is not modelled: it depends on timings
(`offload/shape_store.py`).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence

import numpy as np

from mindspore import Parameter, Tensor, nn

from mindspore_hyper.context import get_context
from mindspore_hyper.offload.backward_order import BackwardOrder
from mindspore_hyper.offload.device_shards import DeviceShard
from mindspore_hyper.offload.hooks import watch_cell_backward
from mindspore_hyper.offload.host_optimizer import host_rule
from mindspore_hyper.offload.offload_unit import (OffloadPolicy, OffloadUnit, UnitOnDevice, check_working_sets,
                                                  select_cells)
from mindspore_hyper.offload.offload_section import offload_section
from mindspore_hyper.offload.residency import Residency
from mindspore_hyper.offload.shape_store import ShapeStore
from mindspore_hyper.units import numpy_dtype

__all__ = ["DryRunOffload"]

# A proxy parameter i of the optimizer probe has shape (_PROXY + i,): a state of that shape is
# the per-parameter state of parameter i (any other shape is the optimizer's own, e.g. a step count)
_PROXY = 1009


def _no_backward() -> None:
    """A dry run's Cell backward hook: never called (no backward runs; `train_step` models it)."""


class _Passed:
    """The fence of a dry run: no kernel is ever launched, so every fence has passed."""

    def wait(self) -> None:
        pass

    def abandon(self) -> None:
        pass


class _ShapeResidency(Residency):
    """`Residency` with its decisions unchanged and no values moved: materializing pins the
    unit's blocks and counts its bytes, scrubbing releases them."""

    def drop(self, u: OffloadUnit) -> None:
        u.resident_depth -= 1
        if u.resident_depth > 0:
            return
        self._deferred.append((u, _Passed()))

    def _materialize(self, u: OffloadUnit, record: bool = True) -> None:
        acquired = []
        try:
            for dev in u.devices:
                dev.store.acquire(dev.param_blocks, record=record)
                acquired.append(dev)
        except BaseException:
            for dev in acquired:
                dev.store.release(dev.param_blocks)
            raise
        for rank, dev in enumerate(u.devices):
            self.account(rank, dev.param_bytes)

    def _scrub(self, units) -> None:
        for u in units:
            for rank, dev in enumerate(u.devices):
                self.account(rank, -dev.param_bytes)
                dev.store.release(dev.param_blocks)


def _sizes(region) -> tuple:
    return tuple(s.stop - s.start for s in region)


def _state_specs(shapes: Sequence[tuple], dtypes: Sequence[np.dtype], factory: Callable[[list], nn.Cell]):
    """The optimizer states a workspace of these update shapes gets (shape, dtype, in order) and
    whether its optimizer has a host rule, from the optimizer built on small proxy parameters."""
    proxies = [Parameter(Tensor(np.zeros((_PROXY + i,), dt)), name=f"mshyper_probe.{i}")
               for i, dt in enumerate(dtypes)]
    optimizer = factory(proxies)
    own = {id(p) for p in proxies}
    states = [sp for _, sp in optimizer.parameters_and_names() if id(sp) not in own]
    specs = []
    for sp in states:
        shape = tuple(sp.shape)
        if len(shape) == 1 and _PROXY <= shape[0] < _PROXY + len(proxies):
            shape = tuple(shapes[shape[0] - _PROXY])
        specs.append((shape, numpy_dtype(sp.dtype)))
    return specs, host_rule(optimizer, states) is not None


@dataclass
class _Workspace:
    """An optimizer workspace's bytes and turn (offload/workspace.py; `UnitUpdates` accounts it
    on the device whose update it holds, from loading it until its results are written)."""

    nbytes: int
    in_use: bool = False
    rank: int = 0


def _units(network: nn.Cell, policy: OffloadPolicy, stores: Sequence[ShapeStore],
           shards_of: Callable[[Parameter], List[DeviceShard]], factory: Callable[[list], nn.Cell]):
    """The offload units, their tensors put into each device's shape store in `make_units`'s
    order (per unit and device: parameter shards, optimizer states, gradients; two workspaces per
    shape signature, shared as `make_units` shares them), and whether every unit's optimizer has
    a host rule."""
    units, seen, probes, workspaces, host = [], set(), {}, {}, True
    for name, cell in select_cells(network, policy):
        unit = OffloadUnit(name, cell)
        unit.params = [p for p in cell.trainable_params() if id(p) not in seen]
        if not unit.params:
            continue
        seen.update(id(p) for p in unit.params)
        unit.shapes = [tuple(p.shape) for p in unit.params]
        dtypes = [numpy_dtype(p.dtype) for p in unit.params]
        per_param = [shards_of(p) for p in unit.params]
        for rank, store in enumerate(stores):
            store.close_pack()
            shards = [s[rank] for s in per_param]
            updates = [_sizes(s.update_region) for s in shards]
            signature = tuple((u, str(d)) for u, d in zip(updates, dtypes))
            if signature not in probes:
                probes[signature] = _state_specs(updates, dtypes, factory)
                nbytes = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(d).itemsize
                             for shape, d in [*zip(updates, dtypes), *probes[signature][0]])
                workspaces[signature] = [_Workspace(nbytes), _Workspace(nbytes)]
            specs, has_rule = probes[signature]
            host = host and has_rule
            dev = UnitOnDevice(store, shards, workspaces=workspaces[signature])
            dev.params = [store.put(_sizes(s.param_region), d) for s, d in zip(shards, dtypes)]
            dev.states = [store.put(shape, d) for shape, d in specs]
            dev.grads = [store.put(u, d) for u, d in zip(updates, dtypes)]
            unit.devices.append(dev)
        units.append(unit)
    for store in stores:
        store.close_pack()
    return units, host


class DryRunOffload:
    """An offloaded dry-run model (see module docstring). Create with `hyper_offload`.

    Args:
        model: the `DryRunModel` (from `auto_parallelize` in a dry run).
        policy: which Cells; `activation_cells` must be empty.
        optimizer: factory ``params -> nn.Optimizer`` (element-wise, as `hyper_offload` requires).
        shards_of: a parameter's `DeviceShard` per device.
        store_options: as `OffloadStore`'s; in a dry run with several devices each device's
            store gets `device_memory`, and `host_memory` is shared evenly (as in simulation).

    Raises:
        NotImplementedError: an option the dry run does not model (module docstring).
        WorkingSetError: a sub-Cell's working set exceeds a device tier.
    """

    def __init__(self, model, policy: OffloadPolicy, optimizer: Callable[[list], nn.Cell],
                 shards_of: Callable[[Parameter], List[DeviceShard]], **store_options):
        from mindspore_hyper.moe.layer import MoE

        network = model.network
        if policy.activation_cells:
            raise NotImplementedError(
                f"hyper_offload in a dry run: OffloadPolicy.activation_cells={list(policy.activation_cells)!r} is not "
                "modelled (the saved tensors are chosen by MindSpore's autograd, which a dry run does not run); "
                "dry-run without activation_cells, or measure the activation swap in simulation")
        if any(isinstance(c, MoE) for _, c in network.cells_and_names()):
            raise NotImplementedError("hyper_offload in a dry run: a model with MoE layers (the expert cache's hits "
                                      "and loads depend on the routed tokens, values a dry run does not have)")
        n = model.mesh.size
        host = store_options.pop("host_memory", None)
        if n > 1:  # each device an equal share of the node's pool, as `_simulation_stores` gives it
            host = int(host or get_context("host_memory")) // n
        store_options.pop("offload_dir", None)  # no files
        self.stores = [ShapeStore(host_memory=host, **store_options) for _ in range(n)]
        self.model, self.policy = model, policy
        self.units, self.host_updates = _units(network, policy, self.stores, shards_of, optimizer)
        check_working_sets(self.units)
        self.residency = _ShapeResidency(self.units, self.stores)
        self._uses: List[OffloadUnit] = []  # this step's forward uses, in order
        self._handles = []
        for u in self.units:
            self._handles.append(u.cell.register_forward_pre_hook(self._make_bring(u)))
            self._handles.append(u.cell.register_forward_hook(self._make_drop(u)))
            # the simulation's Cell backward hooks (`UseHooks`), for the CellBackwardHook tensors of
            # the unit's inputs and outputs they make in each forward (module docstring)
            self._handles += watch_cell_backward(u.cell, _no_backward, _no_backward)
        model.replay_programs = False  # every forward runs the network, so its Cells' hooks see every use
        self.order = BackwardOrder((), None)  # the last step's (modelled: no backward runs)
        model.offload = self  # its report() shows this offload's figures

    def _make_bring(self, u: OffloadUnit):
        def hook(cell, inputs):
            self._uses.append(u)
            self.residency.bring(u)
        return hook

    def _make_drop(self, u: OffloadUnit):
        def hook(cell, inputs, output):
            self.residency.drop(u)
        return hook

    def train_step(self, loss_fn: Callable) -> Callable:
        """A function running the step on shapes: the forward (the units' hooks bring and drop
        them), the backward's uses in reverse order, the end of the backward, then the updates:
        an optimizer with a host rule updates on the host (nothing on the device tier), another
        through the workspaces (`_store_updates`). Returns the loss (shape only)."""
        from mindspore_hyper.runtime.dryrun.shape_grad import training_forward

        def step(*inputs):
            for store in self.stores:
                store.begin_step()
            self.residency.begin_step()
            self._uses = []
            try:
                with training_forward():
                    loss = loss_fn(*inputs)
                self.order = BackwardOrder(tuple(u.name for u in self._uses), None)
                for u in reversed(self._uses):  # the backward of each forward use
                    self.residency.bring(u)
                    self.residency.drop(u)
            finally:
                self.residency.in_step = False
                for u in self.units:  # as UseHooks.end_backward
                    if u.resident_depth > 0:
                        u.resident_depth = 1
                        self.residency.drop(u)
                self.residency.scrub_all()
            if not self.host_updates:
                self._store_updates()
            return loss
        return step

    def _store_updates(self) -> None:
        """`UnitUpdates.update_from_store`'s device-tier work, in its order: units in backward
        order, each device's update blocks pinned while its part is loaded into the next
        workspace of its signature (in turn; a busy one is freed once its results are written),
        the workspace counted on that device until then; every workspace freed at the end."""
        inflight: deque = deque()  # workspaces whose optimizer was launched, results not submitted
        turn: Dict[int, int] = {}
        for u in reversed(self.units):
            for rank, dev in enumerate(u.devices):
                key = id(dev.workspaces)
                ws = dev.workspaces[turn.get(key, 0) % len(dev.workspaces)]
                turn[key] = turn.get(key, 0) + 1
                while ws.in_use:
                    if any(w is ws for w in inflight):
                        inflight.popleft()  # its results are submitted: freed at the next turn
                    else:
                        self._free(ws)
                dev.store.acquire(dev.update_blocks)
                inflight.clear()
                ws.in_use, ws.rank = True, rank
                self.residency.account(rank, ws.nbytes)
                dev.store.release(dev.update_blocks)
                inflight.append(ws)
        for u in self.units:
            for dev in u.devices:
                for ws in dev.workspaces:
                    self._free(ws)

    def _free(self, ws: _Workspace) -> None:
        if ws.in_use:
            ws.in_use = False
            self.residency.account(ws.rank, -ws.nbytes)

    def value_and_grad(self, loss_fn: Callable) -> Callable:
        """Refused: a dry run has no gradients to hand out.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("a dry-run offloaded model runs train_step(loss_fn) only: value_and_grad and "
                                  "apply_gradients hand out and take gradient values, which a dry run does not have")

    apply_gradients = value_and_grad

    @property
    def peak_materialized_bytes(self) -> int:
        """The largest parameter bytes any one device held materialized at once."""
        return max(self.residency.peak_materialized)

    def stats(self) -> Dict:
        """The figures `OffloadedModel.stats()` has that a dry run reproduces: per device the
        peak parameter bytes materialized and the peak bytes pinned on the device tier, and each
        device's shape store (`devices`)."""
        per_device = [s.stats() for s in self.stores]
        return {"devices": per_device, "peak_materialized_param_bytes": self.peak_materialized_bytes,
                "per_device_peak_materialized_bytes": list(self.residency.peak_materialized),
                "per_device_peak_pinned_bytes": [s["pinned"]["peak_bytes"] for s in per_device]}

    def report_section(self, ranks: Sequence[int]) -> Dict:
        """The offload section of the model's `report()` (`offload/offload_section.py`): the
        modelled figures, no measured ones, the backward order as the assumption it is."""
        return offload_section(self.units, self.stores, self.residency, self.order, self.model, list(ranks),
                               measured=False)

    def remove(self) -> None:
        """Removes the hooks (the Parameters never left the model)."""
        if getattr(self.model, "offload", None) is self:
            self.model.offload = None
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.model.replay_programs = True

    def close(self) -> None:
        """Nothing to close (no files or threads); kept for `OffloadedModel`'s interface."""
