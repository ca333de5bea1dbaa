"""`hyper_offload`: train a model whose parameters (and optimizer states, gradients and chosen
activations) live in the tiered store, brought to the device tier only while they are used.

How a step runs (PyNative):
  * Each offloaded sub-Cell is a *group*. Outside its use, each of its Parameters holds a
    one-element placeholder (MindSpore's memory for it is released); its values live in the store.
  * Forward: a forward pre-hook acquires the group's blocks on the device tier through the
    prefetch scheduler (which has usually brought them in already, following the trace of the
    first step), copies them into the Parameters, and the forward hook releases them again.
  * Backward: a backward pre-hook brings the parameters back (MindSpore's backward reads the
    live Parameter), the backward hook releases them.
  * Activations saved for backward inside chosen Cells go to the store through
    ``ms.saved_tensors_hooks`` and come back (prefetched, in the reverse order the trace shows)
    when backward needs them.
  * Gradients are written to the store, then each group is updated by its own optimizer (built
    with the user's factory, so element-wise optimizers such as SGD/Adam give exactly the result
    of one optimizer over all parameters): parameters, optimizer states and gradients are
    acquired together, updated, written back (new versions) and released.
"""
from __future__ import annotations

import fnmatch
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.api import _pynative_executor

from mindspore_hyper.context import get_context
from mindspore_hyper.offload.placement import DeviceShard, assemble, from_strategy_rows, single_device
from mindspore_hyper.offload.store import OffloadStore, TensorRef
from mindspore_hyper.sim.dispatch import running_ranks

__all__ = ["OffloadPolicy", "OffloadedModel", "WorkingSetError", "hyper_offload", "maybe_offload"]


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
    """

    cells: Optional[Sequence[str]] = None
    activation_cells: Sequence[str] = ()
    min_activation_bytes: int = 0


@dataclass
class _DeviceGroup:
    """One group's tensors in one device's store: its parameter shards, the gradients and
    optimizer states of the part it updates (lists parallel to the group's parameters)."""

    store: OffloadStore
    shards: List[DeviceShard]
    params: List[TensorRef] = field(default_factory=list)
    grads: List[TensorRef] = field(default_factory=list)
    states: List[TensorRef] = field(default_factory=list)  # the workspace optimizer's states, in order
    workspace: Optional["_Workspace"] = None

    @property
    def param_blocks(self) -> List[int]:
        return _unique(b for r in self.params for b in r.blocks)

    @property
    def update_blocks(self) -> List[int]:
        return _unique([*self.param_blocks, *(b for r in self.states for b in r.blocks),
                        *(b for r in self.grads for b in r.blocks)])

    @property
    def param_bytes(self) -> int:
        return sum(r.nbytes for r in self.params)


@dataclass
class _Group:
    """An offloaded sub-Cell: its Parameters and, per device, where their values live."""

    name: str
    cell: nn.Cell
    params: List[Parameter] = field(default_factory=list)
    devices: List[_DeviceGroup] = field(default_factory=list)
    resident_depth: int = 0  # nesting of forward/backward uses currently holding the params

    def placeholder(self, i: int) -> Tensor:
        """The one-element tensor parameter `i` holds while its values live in the stores."""
        return Tensor(np.zeros((1,), dtype=self.devices[0].params[i].dtype))

    def shards_of(self, i: int) -> List[DeviceShard]:
        """Every device's part of parameter `i`."""
        return [d.shards[i] for d in self.devices]


class _Workspace:
    """Parameters of one device's update shapes and one optimizer instance, shared by every
    group (and device) with the same shape signature.

    MindSpore's optimizers keep using the data a Parameter had at their first call, so the
    optimizer never runs on the (placeholder-swapped) model Parameters. Instead each group's
    parameters and optimizer states are copied in place (ops.assign) into this workspace, the
    optimizer runs once, and the results are written back to the store. Its memory is one
    device's share of one group's parameters and states.
    """

    def __init__(self, values: List[np.ndarray], factory: Callable[[list], nn.Cell], index: int):
        self.params = [Parameter(Tensor(v.copy()), name=f"mshyper_ws{index}.{i}") for i, v in enumerate(values)]
        self.optimizer = factory(self.params)
        own = {id(p) for p in self.params}
        self.states = [(n, sp) for n, sp in self.optimizer.parameters_and_names() if id(sp) not in own]
        self.initial_states = [sp.asnumpy().copy() for _, sp in self.states]
        self.nbytes = sum(v.nbytes for v in values) + sum(v.nbytes for v in self.initial_states)


class _Done:
    def __init__(self, value):
        self._value = value

    def result(self):
        return self._value


class _InlineExecutor:
    """Runs submitted writes immediately on the calling thread (async_writes=False)."""

    def submit(self, fn, *args):
        return _Done(fn(*args))

    def shutdown(self):
        pass


def _unique(blocks) -> List[int]:
    seen, out = set(), []
    for b in blocks:
        if b not in seen:
            seen.add(b)
            out.append(b)
    return out


def _fmt(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n}B"


class OffloadedModel:
    """A model trained with its chosen sub-Cells offloaded. Create with `hyper_offload`.

    One store per device: a single device, or (for a `SimulatedModel`) every virtual device of
    the mesh, each with its own device tier holding that device's shards.
    """

    def __init__(self, model: nn.Cell, policy: OffloadPolicy, optimizer: Callable[[list], nn.Cell],
                 stores: Sequence[OffloadStore], shards_of: Callable[[Parameter], List[DeviceShard]],
                 async_writes: bool = True):
        self.model = model
        self.policy = policy
        self.stores = list(stores)
        self._shards_of = shards_of
        self._optimizer_factory = optimizer
        self._hooks = []
        self._materialized_bytes = [0] * len(self.stores)
        self._peak_materialized = [0] * len(self.stores)
        self._activation_refs: Dict[Tuple[str, int], Dict[int, TensorRef]] = {}
        self._act_counter: Dict[str, int] = {}
        self._act_ctx = []
        self._workspaces: Dict[tuple, _Workspace] = {}
        self._owned_stores: List[OffloadStore] = []  # set by hyper_offload: closed by close()
        self._owned_dirs: List[str] = []
        self._writer = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="mshyper-offload-writer")
                        if async_writes else _InlineExecutor())
        self.groups = self._make_groups()
        offloaded = {id(p) for g in self.groups for p in g.params}
        self.resident_params = [p for p in model.trainable_params() if id(p) not in offloaded]
        try:
            self._check_working_sets()
        except WorkingSetError:
            self._restore_values()  # refused before running: leave the model as it was
            raise
        self._resident_optimizer = optimizer(self.resident_params) if self.resident_params else None
        self._install()

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
        return max(self._peak_materialized)

    # -- set-up --------------------------------------------------------------------------
    def _select_cells(self) -> List[Tuple[str, nn.Cell]]:
        named = [(n, c) for n, c in self.model.cells_and_names() if n]
        if self.policy.cells is None:
            chosen = [(n, c) for n, c in self.model.name_cells().items() if c.trainable_params()]
            return chosen
        chosen = []
        for name, cell in named:
            if not any(fnmatch.fnmatchcase(name, pat) for pat in self.policy.cells):
                continue
            if any(name.startswith(outer + ".") for outer, _ in chosen):
                continue  # inside an already chosen Cell
            if cell.trainable_params():
                chosen.append((name, cell))
        if not chosen:
            raise ValueError(f"offload policy cells={list(self.policy.cells)!r} match no sub-Cell with parameters")
        return chosen

    def _make_groups(self) -> List[_Group]:
        groups = []
        seen = set()
        for name, cell in self._select_cells():
            group = _Group(name, cell)
            group.params = [p for p in cell.trainable_params() if id(p) not in seen]
            seen.update(id(p) for p in group.params)
            values = [p.asnumpy() for p in group.params]
            per_param = [self._shards_of(p) for p in group.params]
            for rank, store in enumerate(self.stores):
                shards = [s[rank] for s in per_param]
                group.devices.append(self._store_device_group(store, shards, values))
            groups.append(group)
        for g in groups:
            for i, p in enumerate(g.params):
                p.set_data(g.placeholder(i), slice_shape=True)
        for store in self.stores:
            store.close_pack()
        return groups

    def _store_device_group(self, store: OffloadStore, shards: List[DeviceShard],
                            values: List[np.ndarray]) -> _DeviceGroup:
        """Puts one device's shards of a group's parameters, with fresh optimizer states and zero
        gradients of the part it updates, into its store."""
        store.close_pack()
        dev = _DeviceGroup(store, shards)
        updates = [v[s.update_region] for s, v in zip(shards, values)]
        signature = tuple((u.shape, str(u.dtype)) for u in updates)
        if signature not in self._workspaces:
            self._workspaces[signature] = _Workspace(updates, self._optimizer_factory, len(self._workspaces))
        workspace = self._workspaces[signature]
        dev.params = [store.put(v[s.param_region]) for s, v in zip(shards, values)]
        dev.states = [store.put(value) for value in workspace.initial_states]
        dev.grads = [store.put(np.zeros(u.shape, u.dtype)) for u in updates]
        dev.workspace = workspace
        return dev

    def _check_working_sets(self) -> None:
        for g in self.groups:
            for rank, dev in enumerate(g.devices):
                store = dev.store
                fwd, upd = len(dev.param_blocks), len(dev.update_blocks)
                need = max(fwd, upd)
                if need > store.device_blocks:
                    where = f" on device {rank}" if len(self.stores) > 1 else ""
                    raise WorkingSetError(
                        f"Cell '{g.name}' cannot run offloaded{where}: its working set is {need} blocks of "
                        f"{_fmt(store.block_size)} ({_fmt(need * store.block_size)}: parameters "
                        f"{_fmt(dev.param_bytes)} in {fwd} blocks, with optimizer states and gradients {upd} "
                        f"blocks) but the device tier holds {store.device_blocks} blocks "
                        f"({_fmt(store.device_memory)}). Raise device_memory, lower cache_block_size, "
                        f"or offload smaller sub-Cells.")

    def _install(self) -> None:
        for g in self.groups:
            self._hooks.append(g.cell.register_forward_pre_hook(self._make_bring(g)))
            self._hooks.append(g.cell.register_forward_hook(self._make_drop(g, forward=True)))
            self._hooks.append(g.cell.register_backward_pre_hook(self._make_bring(g, backward=True)))
            self._hooks.append(g.cell.register_backward_hook(self._make_drop(g, forward=False)))
        for name, cell in self.model.cells_and_names():
            if name and any(fnmatch.fnmatchcase(name, p) for p in self.policy.activation_cells):
                self._hooks.append(cell.register_forward_pre_hook(self._make_act_enter(name)))
                self._hooks.append(cell.register_forward_hook(self._make_act_exit(name)))

    # -- hooks ---------------------------------------------------------------------------
    def _bring(self, g: _Group) -> None:
        g.resident_depth += 1
        if g.resident_depth > 1:
            return
        for dev in g.devices:
            dev.store.acquire(dev.param_blocks)
        for i, p in enumerate(g.params):
            p.set_data(Tensor.from_numpy(self._gather(g, i, pinned=True)), slice_shape=True)
        for rank, dev in enumerate(g.devices):
            self._account(rank, dev.param_bytes)

    def _gather(self, g: _Group, i: int, pinned: bool) -> np.ndarray:
        """Parameter `i` of `g`, from every device's shard (one device: its whole tensor)."""
        tier = "device" if pinned else None
        if len(g.devices) == 1:
            return g.devices[0].store.get(g.devices[0].params[i], pinned_tier=tier)
        return assemble(_global_shape(g.shards_of(i)), g.devices[0].params[i].dtype, ((d.shards[i].param_region, d.store.get(d.params[i], pinned_tier=tier))
                                           for d in g.devices))

    def _drop(self, g: _Group) -> None:
        g.resident_depth -= 1
        if g.resident_depth > 0:
            return
        # PyNative launches kernels asynchronously and a queued kernel reads the Parameter's data
        # when it runs: wait for them before the data is replaced by the placeholder.
        _pynative_executor.sync()
        for i, p in enumerate(g.params):
            p.set_data(g.placeholder(i), slice_shape=True)
        for rank, dev in enumerate(g.devices):
            self._account(rank, -dev.param_bytes)
            dev.store.release(dev.param_blocks)

    def _make_bring(self, g: _Group, backward: bool = False):
        if backward:
            def hook(cell, grad_output):
                self._bring(g)
        else:
            def hook(cell, inputs):
                self._bring(g)
        return hook

    def _make_drop(self, g: _Group, forward: bool):
        if forward:
            def hook(cell, inputs, output):
                self._drop(g)
        else:
            def hook(cell, grad_input, grad_output):
                self._drop(g)
        return hook

    def _account(self, rank: int, delta: int) -> None:
        self._materialized_bytes[rank] += delta
        self._peak_materialized[rank] = max(self._peak_materialized[rank], self._materialized_bytes[rank])

    def _make_act_enter(self, name: str):
        def hook(cell, inputs):
            ctx = ms.saved_tensors_hooks(self._make_pack(name), self._unpack)
            ctx.__enter__()
            self._act_ctx.append(ctx)
        return hook

    def _make_act_exit(self, name: str):
        def hook(cell, inputs, output):
            self._act_ctx.pop().__exit__(None, None, None)
        return hook

    def _activation_ranks(self) -> List[int]:
        """The devices holding the activation being saved: in simulation, the devices the op
        producing it runs for (its replicas each keep a copy); otherwise device 0."""
        if len(self.stores) == 1:
            return [0]
        return running_ranks() or list(range(len(self.stores)))

    def _make_pack(self, name: str):
        def pack(tensor):
            if isinstance(tensor, Parameter) or not isinstance(tensor, Tensor):
                return ("keep", tensor)
            array = tensor.asnumpy()
            if array.nbytes < self.policy.min_activation_bytes or array.nbytes == 0:
                return ("keep", tensor)
            index = self._act_counter.get(name, 0)
            self._act_counter[name] = index + 1
            # A stable slot per (cell, index): the same blocks every step, so the trace stays valid.
            slots = self._activation_refs.setdefault((name, index), {})
            ranks = self._activation_ranks()
            for rank in ranks:
                store, ref = self.stores[rank], slots.get(rank)
                if ref is not None and (ref.shape != array.shape or ref.dtype != array.dtype):
                    store.erase(ref)
                    ref = None
                if ref is None:
                    slots[rank] = store.put(array)
                else:
                    store.update(ref, array)
            return ("store", [(self.stores[r], slots[r]) for r in ranks])
        return pack

    def _unpack(self, packed):
        kind, obj = packed
        if kind == "keep":
            return obj
        for store, ref in obj:  # every holder brings its copy back to its device tier
            store.acquire(ref.blocks)
        try:
            store, ref = obj[0]
            return Tensor.from_numpy(store.get(ref, pinned_tier="device"))
        finally:
            for store, ref in obj:
                store.release(ref.blocks)

    # -- training ------------------------------------------------------------------------
    def trainable_params(self) -> List[Parameter]:
        """The parameters gradients are taken for: offloaded groups' first, then resident ones."""
        return [p for g in self.groups for p in g.params] + list(self.resident_params)

    def value_and_grad(self, loss_fn: Callable) -> Callable:
        """Like ``ms.value_and_grad(loss_fn, None, self.trainable_params())`` with offloading."""
        grad_fn = ms.value_and_grad(loss_fn, None, self.trainable_params())

        def run(*inputs):
            for store in self.stores:
                store.begin_step()
            self._act_counter.clear()
            return grad_fn(*inputs)
        return run

    def _write_gradient(self, g: _Group, i: int, grad: Tensor) -> None:
        """Each device stores the part of the (data-parallel reduced) gradient it updates."""
        value = grad.asnumpy()
        for dev in g.devices:
            dev.store.update(dev.grads[i], value[dev.shards[i].update_region])

    def apply_gradients(self, grads: Sequence[Tensor]) -> None:
        """Writes the gradients to the store, then updates each group, device by device, with its
        optimizer; parameter shards updated in slices (ZeRO-1) are gathered back afterwards."""
        grads = list(grads)
        n_off = sum(len(g.params) for g in self.groups)
        if len(grads) != n_off + len(self.resident_params):
            raise ValueError(f"expected {n_off + len(self.resident_params)} gradients, got {len(grads)}")
        # Store writes run on a background thread (they release the GIL) while the training
        # thread launches the next group's update; all are done before this returns.
        pending = []
        k = 0
        for g in self.groups:
            for i in range(len(g.params)):
                pending.append(self._writer.submit(self._write_gradient, g, i, grads[k]))
                grads[k] = None  # the task holds it until written, then MindSpore may free it
                k += 1
        if self._resident_optimizer is not None:
            self._resident_optimizer(tuple(grads[n_off:]))
        for f in pending:  # a group's gradients must be in the store before it is updated
            f.result()
        pending.clear()
        for g in reversed(self.groups):  # backward order: the trace's order, blocks are prefetched
            updated = [[] for _ in g.params]  # per parameter: (region, new values) from each device
            for rank, dev in enumerate(g.devices):
                for i, piece in enumerate(self._update_device(rank, dev, pending)):
                    updated[i].append((dev.shards[i].update_region, piece))
            # Each device's shard is rebuilt from the updated slices (ZeRO-1's AllGather).
            for i, pieces in enumerate(updated):
                if len(g.devices) == 1:
                    whole = pieces[0][1]
                else:
                    whole = assemble(_global_shape(g.shards_of(i)), pieces[0][1].dtype, pieces)
                for dev in g.devices:
                    region = dev.shards[i].param_region
                    value = whole if len(g.devices) == 1 else np.ascontiguousarray(whole[region])
                    pending.append(self._writer.submit(dev.store.update, dev.params[i], value))
        for f in pending:
            f.result()

    def _update_device(self, rank: int, dev: _DeviceGroup, pending: list) -> List[np.ndarray]:
        """Runs the optimizer on one device's part of a group; writes its states back and returns
        the updated parameter slices (copies)."""
        ws = dev.workspace
        blocks = dev.update_blocks
        dev.store.acquire(blocks)
        try:
            self._account(rank, ws.nbytes)
            for ref, shard, wp in zip(dev.params, dev.shards, ws.params):
                value = dev.store.get(ref, pinned_tier="device")[shard.update_in_param()]
                ops.assign(wp, Tensor.from_numpy(np.ascontiguousarray(value)))
            for ref, (_, sp) in zip(dev.states, ws.states):
                ops.assign(sp, Tensor.from_numpy(dev.store.get(ref, pinned_tier="device")))
            gs = tuple(Tensor.from_numpy(dev.store.get(ref, pinned_tier="device")) for ref in dev.grads)
            ws.optimizer(gs)
            # The arrays view the workspace, which the next group reuses: keep copies.
            new_params = [wp.asnumpy().copy() for wp in ws.params]
            new_states = [sp.asnumpy().copy() for _, sp in ws.states]
            del gs
        finally:
            dev.store.release(blocks)
        # Written after the release: the store then writes the host copies and drops the device
        # ones, instead of leaving dirty device copies that must be copied down later.
        for ref, value in zip(dev.states, new_states):
            pending.append(self._writer.submit(dev.store.update, ref, value))
        self._account(rank, -ws.nbytes)
        return new_params

    def train_step(self, loss_fn: Callable) -> Callable:
        """A function running forward, backward and the optimizer update; returns the loss."""
        grad_fn = self.value_and_grad(loss_fn)

        def step(*inputs):
            loss, grads = grad_fn(*inputs)
            self.apply_gradients(grads)
            return loss
        return step

    # -- inspection / teardown -------------------------------------------------------------
    def parameter_values(self) -> Dict[str, np.ndarray]:
        """Current values of every trainable parameter (read from the store for offloaded ones)."""
        out = {}
        for g in self.groups:
            for i, p in enumerate(g.params):
                out[p.name] = self._gather(g, i, pinned=False)
        for p in self.resident_params:
            out[p.name] = p.asnumpy()
        return out

    def stats(self) -> Dict:
        """Store statistics. One device: the store's (per tier, bytes per tier pair, prefetch).
        Simulation: ``devices`` lists each virtual device's store statistics."""
        per_device = [s.stats() for s in self.stores]
        out = dict(per_device[0]) if len(per_device) == 1 else {"devices": per_device}
        out["peak_materialized_param_bytes"] = self.peak_materialized_bytes
        out["per_device_peak_materialized_bytes"] = list(self._peak_materialized)
        out["device_peak_bytes"] = max(s["device"]["peak_bytes"] for s in per_device)
        return out

    def remove(self) -> None:
        """Removes the hooks and puts the stored values back into the model's Parameters."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._restore_values()

    def close(self) -> None:
        """Closes the stores `hyper_offload` created (their disk files and folders are removed);
        stores passed in by the caller stay open."""
        self._writer.shutdown()
        for store in self._owned_stores:
            store.close()
        for path in self._owned_dirs:
            shutil.rmtree(path, ignore_errors=True)
        self._owned_stores, self._owned_dirs = [], []

    def _restore_values(self) -> None:
        for g in self.groups:
            for i, p in enumerate(g.params):
                p.set_data(Tensor(self._gather(g, i, pinned=False)), slice_shape=True)


def _global_shape(shards: List[DeviceShard]) -> Tuple[int, ...]:
    """The global shape covered by every device's parameter region."""
    return tuple(max(s.param_region[d].stop for s in shards) for d in range(len(shards[0].param_region)))


def _simulation_stores(n: int, store_options: dict) -> Tuple[List[OffloadStore], str]:
    """One store per virtual device: each its own device tier (`device_memory` each, the device's
    HBM), an equal share of the node's host pool, and its disk files in its own folder."""
    host = int(store_options.pop("host_memory", None) or get_context("host_memory"))
    base = store_options.pop("offload_dir", None)
    base = base if base is not None else get_context("offload_dir")
    root = tempfile.mkdtemp(prefix="mshyper_offload_", dir=base or None)
    store_options.setdefault("io_workers", 1)
    stores = [OffloadStore(host_memory=host // n, offload_dir=os.path.join(root, f"device{r}"),
                           make_default=(r == 0), **store_options) for r in range(n)]
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
        optimizer: factory ``params -> nn.Optimizer`` (e.g. ``lambda ps: nn.Adam(ps, 1e-3)``); it
            must be element-wise (SGD, Momentum, Adam, AdamWeightDecay, ...): one instance is made
            per distinct shape of an offloaded group's update and one for the resident parameters.
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
    """
    from mindspore_hyper.sim.parallelize import SimulatedModel

    policy = policy or OffloadPolicy()
    network, n = model, 1
    shards_of = lambda p: single_device(p.shape)  # noqa: E731
    if isinstance(model, SimulatedModel):
        network, n = model.network, model.mesh.size
        named = dict(network.parameters_and_names())
        table = from_strategy_rows({id(named[row.name]): row for row in model.table}, n)
        shards_of = lambda p: table[id(p)]  # noqa: E731
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
        off = OffloadedModel(network, policy, optimizer, stores, shards_of, async_writes=async_writes)
    except Exception:
        for s in owned_stores:
            s.close()
        if owned_dir:
            shutil.rmtree(owned_dir, ignore_errors=True)
        raise
    off._owned_stores = owned_stores
    off._owned_dirs = [owned_dir] if owned_dir else []
    return off


def maybe_offload(model: nn.Cell, policy: Optional[OffloadPolicy] = None, *,
                  optimizer: Callable[[list], nn.Cell], **store_options):
    """`hyper_offload` when the ``hyper_offload`` context flag is on, else None."""
    if not get_context("hyper_offload"):
        return None
    return hyper_offload(model, policy, optimizer=optimizer, **store_options)
