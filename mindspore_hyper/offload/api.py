"""`hyper_offload`: train a model whose parameters (and optimizer states, gradients and chosen
activations) live in the tiered store, brought to the device tier only while they are used.

`OffloadedModel` is the facade over four parts: the offload units (offload_unit.py), their
residency in the Parameters (residency.py) driven by forward/backward hooks (hooks.py), the
activation swap (activations.py) and the optimizer updates (updates.py). How a step runs, and
the measurements behind it: docs/offload.md.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindspore import Parameter, Tensor, nn

from mindspore_hyper.autodiff import value_and_grad
from mindspore_hyper.context import get_context
from mindspore_hyper.offload.expert_offload import attach_expert_offloads
from mindspore_hyper.offload.activations import ActivationSwap
from mindspore_hyper.offload.backward_order import BackwardOrder
from mindspore_hyper.offload.device_shards import DeviceShard, from_strategy_rows, single_device
from mindspore_hyper.offload.dry_run_offload import DryRunOffload
from mindspore_hyper.offload.hooks import UseHooks
from mindspore_hyper.offload.offload_section import offload_section
from mindspore_hyper.offload.offload_unit import (OffloadPolicy, OffloadUnit, WorkingSetError, check_working_sets,
                                                  make_units)
from mindspore_hyper.offload.residency import Residency
from mindspore_hyper.offload.store import OffloadStore
from mindspore_hyper.offload.updates import UnitUpdates, UpdateRun

__all__ = ["OffloadPolicy", "OffloadedModel", "WorkingSetError", "hyper_offload", "maybe_offload"]


class OffloadedModel:
    """A model trained with its chosen sub-Cells offloaded. Create with `hyper_offload`.

    One store per device: a single device, or (for a `SimulatedModel`) every virtual device of
    the mesh, each with its own device tier holding that device's shards.
    """

    def __init__(self, model: nn.Cell, policy: OffloadPolicy, optimizer: Callable[[list], nn.Cell],
                 stores: Sequence[OffloadStore], shards_of: Callable[[Parameter], List[DeviceShard]],
                 async_writes: bool = True, cell_backward_hooks: bool = False,
                 running_ranks: Callable[[], Optional[List[int]]] = lambda: None):
        self.model = model
        self.policy = policy
        self.stores = list(stores)
        self._owned_stores: List[OffloadStore] = []  # set by hyper_offload: closed by close()
        self._owned_dirs: List[str] = []
        # MoE layers' experts: in hot-expert caches, brought per step as routed (offload/expert_offload.py)
        self.expert_offloads = attach_expert_offloads(model, optimizer, policy.expert_cache)
        self.expert_params = [p for off in self.expert_offloads for p in off.params]
        try:
            self.units: List[OffloadUnit] = make_units(model, policy, self.stores, shards_of, optimizer,
                                                       exclude={id(p) for p in self.expert_params})
        except BaseException:
            self._restore_experts()
            raise
        self.residency = Residency(self.units, self.stores)
        offloaded = {id(p) for u in self.units for p in u.params} | {id(p) for p in self.expert_params}
        self.resident_params = [p for p in model.trainable_params() if id(p) not in offloaded]
        try:
            check_working_sets(self.units)
        except WorkingSetError:
            self._restore_values()  # refused before running: leave the model as it was
            self._restore_experts()
            raise
        self._resident_optimizer = optimizer(self.resident_params) if self.resident_params else None
        self.hooks = UseHooks(self.units, self.residency, cell_backward_hooks)
        self.updates = UnitUpdates(self.units, self.residency, max(s.worker_nice for s in self.stores), async_writes)
        self.activations = ActivationSwap(model, policy, self.stores, self.residency, running_ranks)
        self.parallel_model = None  # the ParallelModel whose report() shows this offload (set by hyper_offload)

    @property
    def store(self) -> OffloadStore:
        """The store of a single-device model (simulation: see `stores`, one per device)."""
        if len(self.stores) != 1:
            raise AttributeError(f"this model has one store per simulated device ({len(self.stores)}): "
                                 f"use .stores[rank]")
        return self.stores[0]

    @property
    def peak_materialized_bytes(self) -> int:
        """The largest parameter bytes any one device held materialized at once."""
        return max(self.residency.peak_materialized)

    # -- training ------------------------------------------------------------------------
    def trainable_params(self) -> List[Parameter]:
        """The parameters gradients are taken for: offloaded units' first, then resident ones,
        then the MoE layers' expert weights (each step: the rows of the experts it routed to)."""
        return [p for u in self.units for p in u.params] + list(self.resident_params) + list(self.expert_params)

    def value_and_grad(self, loss_fn: Callable) -> Callable:
        """Like ``value_and_grad(loss_fn, None, self.trainable_params())`` with offloading."""
        grad_fn = value_and_grad(loss_fn, None, self.trainable_params())

        def run(*inputs):
            for store in self.stores:
                store.begin_step()
            self.activations.begin_step()
            self.residency.begin_step()
            self.hooks.begin_step()
            for off in self.expert_offloads:
                off.begin_step()
            try:
                out = grad_fn(*inputs)
            except BaseException:
                for off in self.expert_offloads:
                    off.end_step()  # the step's experts are released
                self.residency.in_step = False
                try:
                    self.hooks.end_backward()
                except Exception:  # pylint: disable=broad-except
                    pass  # the first error is the one to report
                raise
            self.residency.in_step = False
            self.hooks.end_backward()
            return out
        return run

    def apply_gradients(self, grads: Sequence[Tensor]) -> None:
        """Writes the gradients to the store, then updates each unit, device by device, with its
        optimizer; parameter shards updated in slices (ZeRO-1) are gathered back afterwards."""
        grads = list(grads)
        self.residency.scrub_all()  # (after a forward outside value_and_grad)
        n_off = sum(len(u.params) for u in self.units)
        n_all = n_off + len(self.resident_params) + len(self.expert_params)
        if len(grads) != n_all:
            raise ValueError(f"expected {n_all} gradients, got {len(grads)}")
        grads = self._apply_expert_gradients(grads)
        run = UpdateRun()
        try:
            self.updates.update_from_store(run, list(reversed(self.units)), grads, self._resident_optimizer)
        finally:
            self.updates.finish(run)

    def train_step(self, loss_fn: Callable) -> Callable:
        """A function running forward, backward and the optimizer update; returns the loss.

        With an optimizer that has a host rule (`host_optimizer`: Adam, SGD), each offloaded
        unit is updated on the host during the backward, as soon as its gradients are complete
        (`UnitUpdates.on_param_grad`): the update's store traffic overlaps the backward's compute
        and the gradients never pass through the store. Other optimizers, and units whose
        gradients the hooks did not all deliver, are updated after the backward, as
        `apply_gradients` does."""
        grad_fn = self.value_and_grad(loss_fn)
        on_host = self.updates.host_updates_enabled()

        def step(*inputs):
            run = UpdateRun()
            if on_host:
                for u in self.units:
                    u.step_grads = [None] * len(u.params)
            self.updates.backward_run = run if on_host else None
            try:
                try:
                    loss, grads = grad_fn(*inputs)
                except Exception as e:
                    if not run.updated:
                        raise
                    done = [u.name for u in self.units if id(u) in run.updated]
                    raise RuntimeError(
                        f"the backward failed after {len(done)} of {len(self.units)} offloaded groups were "
                        f"updated during it ({', '.join(done)}); the others were not: the model is partially "
                        f"updated by this step") from e
                finally:
                    self.updates.backward_run = None
                    for u in self.units:
                        for copy in u.step_grads or ():  # a unit not updated in the backward
                            if copy is not None:
                                copy.abandon()
                        u.step_grads = None
                grads = self._apply_expert_gradients(list(grads))
                rest = [u for u in reversed(self.units) if id(u) not in run.updated]
                self.updates.update_from_store(run, rest, grads, self._resident_optimizer)
            finally:
                self.updates.finish(run)
            return loss
        return step

    # -- inspection / teardown -------------------------------------------------------------
    def parameter_values(self) -> Dict[str, np.ndarray]:
        """Current values of every trainable parameter (read from the store for offloaded ones)."""
        self.residency.scrub_all()
        out = {}
        for u in self.units:
            for i, p in enumerate(u.params):
                out[p.name] = self.residency.gather(u, i, pinned=False)
        for p in self.resident_params:
            out[p.name] = p.asnumpy()
        for off in self.expert_offloads:
            for p, value in zip(off.params, off.values()):
                out[p.name] = value
        return out

    def stats(self) -> Dict:
        """Store statistics. One device: the store's (per tier, bytes per tier pair, prefetch).
        Simulation: ``devices`` lists each virtual device's store statistics."""
        per_device = [s.stats() for s in self.stores]
        out = dict(per_device[0]) if len(per_device) == 1 else {"devices": per_device}
        out["peak_materialized_param_bytes"] = self.peak_materialized_bytes
        out["per_device_peak_materialized_bytes"] = list(self.residency.peak_materialized)
        out["device_peak_bytes"] = max(s["device"]["peak_bytes"] for s in per_device)
        out["per_device_peak_pinned_bytes"] = [s["pinned"]["peak_bytes"] for s in per_device]
        out["group_updates"] = dict(self.updates.counts)  # host: during the backward; optimizer: after it
        out["update_wait_ns"] = self.updates.wait_ns
        if self.expert_offloads:
            out["expert_cache"] = [off.stats() for off in self.expert_offloads]
        return out

    def backward_order(self) -> BackwardOrder:
        """The last step's forward uses of the units and the order its backward used them in."""
        return BackwardOrder(tuple(self.hooks.forward_uses), tuple(self.hooks.backward_uses))

    def report_section(self, ranks: Sequence[int]) -> Dict:
        """The offload section of the parallel model's `report()` (`offload/offload_section.py`).

        Raises:
            ValueError: the offload is not of a parallel model (one from `auto_parallelize`).
        """
        if self.parallel_model is None:
            raise ValueError("report_section: this offload is of a plain network, not of a parallel model; "
                             "read its figures from stats()")
        return offload_section(self.units, self.stores, self.residency, self.backward_order(), self.parallel_model,
                               list(ranks), measured=True)

    def remove(self) -> None:
        """Removes the hooks and puts the stored values back into the model's Parameters."""
        if self.parallel_model is not None and getattr(self.parallel_model, "offload", None) is self:
            self.parallel_model.offload = None
        for part in (self.hooks, self.updates, self.activations):
            part.remove()
        self.residency.scrub_all()
        self._restore_values()
        self._restore_experts()

    def close(self) -> None:
        """Closes the stores `hyper_offload` created (their disk files and folders are removed);
        stores passed in by the caller stay open."""
        self.updates.shutdown()
        for off in self.expert_offloads:
            off.close()
        self.expert_offloads, self.expert_params = [], []
        for store in self._owned_stores:
            store.close()
        for path in self._owned_dirs:
            shutil.rmtree(path, ignore_errors=True)
        self._owned_stores, self._owned_dirs = [], []

    def _apply_expert_gradients(self, grads: List[Tensor]) -> List[Tensor]:
        """Updates the MoE layers' experts from their gradients (the last ones of `grads`);
        returns the others."""
        if not self.expert_offloads:
            return grads
        k = len(grads) - len(self.expert_params)
        rest, expert_grads = grads[:k], grads[k:]
        for off in self.expert_offloads:
            n = len(off.params)
            off.apply(expert_grads[:n])
            expert_grads = expert_grads[n:]
        return rest

    def _restore_experts(self) -> None:
        for off in self.expert_offloads:
            off.restore()
            off.close()
        self.expert_offloads, self.expert_params = [], []

    def _restore_values(self) -> None:
        for u in self.units:
            for i, p in enumerate(u.params):
                p.set_data(Tensor(self.residency.gather(u, i, pinned=False)), slice_shape=True)


def _mesh_shards(model) -> Callable[[Parameter], List[DeviceShard]]:
    """A parallel model's parameter -> every device's `DeviceShard`, from its strategy table."""
    named = dict(model.network.parameters_and_names())
    table = from_strategy_rows({id(named[row.name]): row for row in model.table}, model.mesh.size)
    return lambda p: table[id(p)]


def _simulation_stores(n: int, store_options: dict) -> Tuple[List[OffloadStore], str]:
    """One store per virtual device: each its own device tier (`device_memory` each, the device's
    HBM), an equal share of the node's host pool, and its disk files in its own folder."""
    host = int(store_options.pop("host_memory", None) or get_context("host_memory"))
    base = store_options.pop("offload_dir", None)
    base = base if base is not None else get_context("offload_dir")
    root = tempfile.mkdtemp(prefix="mshyper_offload_", dir=base or None)
    store_options.setdefault("io_workers", 1)
    stores = [OffloadStore(host_memory=host // n, offload_dir=os.path.join(root, f"device{r}"),
                           **store_options) for r in range(n)]
    return stores, root


def hyper_offload(model: nn.Cell, policy: Optional[OffloadPolicy] = None, *,
                  optimizer: Callable[[list], nn.Cell], store=None,
                  async_writes: bool = True, **store_options) -> OffloadedModel:
    """Offloads the parameters of chosen sub-Cells of `model` to the tiered store.

    Args:
        model: the network (PyNative mode), or a `SimulatedModel` (``sim.simulate``): then every
            virtual device gets its own store, whose device tier holds that device's shards
            (parameter shards; gradients and optimizer states of the slice it updates).
        policy: which Cells (default: every direct child with parameters); names are those of
            the network (for a SimulatedModel, of the model it wraps).
            The experts of `moe.MoE` layers go to a hot-expert cache per layer instead
            (`policy.expert_cache`; docs/moe.md), single-device models only.
        optimizer: factory ``params -> nn.Optimizer`` (e.g. ``lambda ps: nn.Adam(ps, 1e-3)``); it
            must be element-wise (SGD, Momentum, Adam, AdamWeightDecay, ...): one instance is made
            per distinct shape of an offload unit's update and one for the resident parameters.
        store: an `OffloadStore` (one device) or a sequence of one per simulated device; default:
            new ones from the context flags and `store_options` (block_size, device_memory,
            host_memory, offload_dir, prefetch_depth, ...), closed by `OffloadedModel.close()`.
            In simulation each device's tier gets `device_memory`, and `host_memory` is shared
            evenly among the devices.
        async_writes: write gradients and updated values to the store on a background thread.

    Returns:
        The `OffloadedModel`; use ``.train_step(loss_fn)`` or ``.value_and_grad`` +
        ``.apply_gradients``.

    Raises:
        WorkingSetError: a sub-Cell's working set exceeds a device tier (before anything runs).
        ValueError: `store` does not give one store per simulated device.
        NotImplementedError: in a dry run, an option it does not model (`DryRunOffload`).

    In a dry run (`mode="dryrun"`, `model` from `auto_parallelize`) the result is a `DryRunOffload`:
    the same units, shards and residency decisions on shapes only, whose `stats()` gives the
    per-device figures the simulation's `OffloadedModel.stats()` gives (docs/dryrun.md).
    For a model from `auto_parallelize` (simulation or dry run) the model's `report()` and the
    `--json` report show the offload's figures (`offload/offload_section.py`) until `remove()`.
    """
    from mindspore_hyper.runtime.modes import runtime_for
    from mindspore_hyper.runtime.parallel_model import ParallelModel

    runtime = model.runtime if isinstance(model, ParallelModel) else runtime_for(get_context("mode"))
    policy = policy or OffloadPolicy()
    if runtime is not None and not runtime.computes_values():
        if not isinstance(model, ParallelModel):
            raise NotImplementedError(
                f"hyper_offload in a dry run of a {type(model).__name__}: offload the model auto_parallelize returns "
                "(a dry-run model computes shapes; a plain network would compute values)")
        if store is not None:
            raise ValueError(f"store: a dry run makes its own shape-only stores, got {store!r}; pass the store "
                             "options (block_size, device_memory, ...) instead")
        return DryRunOffload(model, policy, optimizer, _mesh_shards(model), **store_options)
    network, n = model, 1
    shards_of = lambda p: single_device(p.shape)  # noqa: E731
    running_ranks = lambda: None  # noqa: E731
    if isinstance(model, ParallelModel):
        if not model.execution.holds_all_ranks:
            raise NotImplementedError(
                f"hyper_offload of a model whose process holds ranks {model.local_ranks} of "
                f"{model.mesh.size}: offloading under msrun (one device per process) is not implemented; "
                "offload a simulated model or a single-device one")
        network, n = model.network, model.mesh.size
        from mindspore_hyper.moe.layer import MoE

        if any(isinstance(c, MoE) for _, c in network.cells_and_names()):
            raise NotImplementedError("hyper_offload of a parallel model with MoE layers: the expert cache keeps the "
                                      "experts of a single-device model only; offload a single-device MoE model")
        running_ranks = model.execution.running_ranks
        model.execution.batch_shards = False  # activations are saved per shard, for the devices holding each
        shards_of = _mesh_shards(model)
    owned_stores, owned_dir = [], None
    if store is None:
        if n == 1:
            stores = owned_stores = [OffloadStore(**store_options)]
        else:
            stores, owned_dir = _simulation_stores(n, dict(store_options))
            owned_stores = stores
    else:
        stores = [store] if isinstance(store, OffloadStore) else list(store)
        if len(stores) != n or not all(isinstance(s, OffloadStore) for s in stores):
            raise ValueError(f"store: expected {'an OffloadStore' if n == 1 else f'{n} OffloadStores (one per simulated device)'}"
                             f", got {store!r}")
    try:
        off = OffloadedModel(network, policy, optimizer, stores, shards_of, async_writes=async_writes,
                             cell_backward_hooks=network is not model, running_ranks=running_ranks)
    except Exception:
        for s in owned_stores:
            s.close()
        if owned_dir:
            shutil.rmtree(owned_dir, ignore_errors=True)
        raise
    off._owned_stores = owned_stores
    off._owned_dirs = [owned_dir] if owned_dir else []
    if isinstance(model, ParallelModel):  # its report() shows the offload's figures
        off.parallel_model = model
        model.offload = off
    return off


def maybe_offload(model: nn.Cell, policy: Optional[OffloadPolicy] = None, *,
                  optimizer: Callable[[list], nn.Cell], **store_options):
    """`hyper_offload` when the ``hyper_offload`` context flag is on, else None."""
    if not get_context("hyper_offload"):
        return None
    return hyper_offload(model, policy, optimizer=optimizer, **store_options)
