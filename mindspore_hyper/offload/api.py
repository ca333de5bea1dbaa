"""`hyper_offload`: train a model whose parameters (and optimizer states, gradients and chosen
activations) live in the tiered store, brought to the device tier only while they are used.

How a step runs (PyNative):
  * Each offloaded sub-Cell is a *group*. Outside its use, each of its Parameters holds a
    one-element placeholder (MindSpore's memory for it is released); its values live in the store.
  * Forward: a forward pre-hook acquires the group's blocks on the device tier through the
    prefetch scheduler (which has usually brought them in already, following the trace of the
    first step) and copies them into the Parameters -- together with the groups the previous
    step used next, up to half the device tier; after the forward hook the group is scrubbed at
    the next materialization, once a KernelFence launched behind its kernels has passed.
  * Backward: tensor hooks on the Cell call's outputs bring the parameters back (MindSpore's
    backward reads the live Parameter) and hooks on its inputs drop them after its backward.
  * Activations saved for backward inside chosen Cells go to the store through
    ``ms.saved_tensors_hooks`` and come back (prefetched, in the reverse order the trace shows)
    when backward needs them.
  * Update, `train_step` with an optimizer that has a host rule (Adam, SGD; host_optimizer.py):
    a group is updated during the backward as soon as its parameters' gradient hooks have run.
    The gradients are copied out of the kernel stream without synchronizing it (copy_out.py), and
    an updater thread reads the group's parameters and optimizer states from the store (host
    tier), computes the update and writes them back (new versions) -- overlapping the backward.
  * Otherwise (other optimizers; `apply_gradients`): gradients are written to the store, then
    each group is updated by its own optimizer Cell (built with the user's factory, so
    element-wise optimizers give exactly the result of one optimizer over all parameters):
    parameters, optimizer states and gradients are acquired together, copied into a workspace,
    updated, written back; the consumed gradients are discarded.
  * In simulation every virtual device has its own store holding its shards (placement.py);
    the steps above run for each device's part.
"""
from __future__ import annotations

import fnmatch
import os
from collections import deque
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn
from mindspore.common.api import _pynative_executor

from mindspore_hyper import _core
from mindspore_hyper.context import get_context
from mindspore_hyper.offload.copy_out import TensorCopyOut
from mindspore_hyper.offload.fence import KernelFence
from mindspore_hyper.offload.placement import DeviceShard, assemble, from_strategy_rows, single_device
from mindspore_hyper.offload.store import CapacityError, OffloadStore, TensorRef
from mindspore_hyper.offload.workspace import Workspace


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
    workspaces: List[Workspace] = field(default_factory=list)  # of its signature, used in turn

    # The tensors never move to other blocks once stored: computed on first use (after set-up).
    @cached_property
    def param_blocks(self) -> List[int]:
        return _unique(b for r in self.params for b in r.blocks)

    @cached_property
    def update_blocks(self) -> List[int]:
        return _unique([*self.param_blocks, *(b for r in self.states for b in r.blocks),
                        *(b for r in self.grads for b in r.blocks)])

    @cached_property
    def param_bytes(self) -> int:
        return sum(r.nbytes for r in self.params)


@dataclass
class _Group:
    """An offloaded sub-Cell: its Parameters and, per device, where their values live."""

    name: str
    cell: nn.Cell
    params: List[Parameter] = field(default_factory=list)
    shapes: List[Tuple[int, ...]] = field(default_factory=list)  # global shapes of the params
    devices: List[_DeviceGroup] = field(default_factory=list)
    resident_depth: int = 0  # nesting of forward/backward uses currently holding the params
    step_grads: Optional[list] = None  # train_step: gradients the backward has delivered so far
    cell_backward_hooks: bool = False  # backward uses tracked by Cell hooks (see _use_cell_backward_hooks)

    def placeholder(self, i: int) -> Tensor:
        """The one-element tensor parameter `i` holds while its values live in the stores."""
        return Tensor(np.zeros((1,), dtype=self.devices[0].params[i].dtype))

    @cached_property
    def param_blocks(self) -> int:
        """The most parameter blocks any one device holds for this group."""
        return max(len(d.param_blocks) for d in self.devices)


@dataclass
class _UpdateRun:
    """One step's update pipeline: optimizers launched whose results are not written yet."""

    inflight: deque = field(default_factory=deque)  # (group, rank, workspace, fence)
    pieces: Dict[int, list] = field(default_factory=dict)  # simulation: per group, updated slices
    turn: Dict[int, int] = field(default_factory=dict)  # per workspace list, the next one's index
    updated: set = field(default_factory=set)  # ids of the groups updated in the backward
    host_tasks: list = field(default_factory=list)  # their updates (futures of _host_update)


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


def _background_executor(name: str, nice: int) -> ThreadPoolExecutor:
    """Two threads for the offload's background work, at the store's lower CPU priority."""
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix=name,
                              initializer=_core.make_background_thread, initargs=(name, nice))


def _flat_tensors(obj):
    """The Tensors in a (nested) tuple/list."""
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _flat_tensors(o)


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
                 async_writes: bool = True, cell_backward_hooks: bool = False,
                 running_ranks: Callable[[], Optional[List[int]]] = lambda: None):
        self.model = model
        self.policy = policy
        self.stores = list(stores)
        self._running_ranks = running_ranks
        self._shards_of = shards_of
        self._optimizer_factory = optimizer
        self._hooks = []
        self._materialized_bytes = [0] * len(self.stores)
        self._peak_materialized = [0] * len(self.stores)
        self._activation_refs: Dict[Tuple[str, int], Dict[int, TensorRef]] = {}
        self._act_counter: Dict[str, int] = {}
        self._act_ctx = []
        self._workspaces: Dict[tuple, List[Workspace]] = {}
        # Groups whose use ended but whose Parameters still hold their values (and blocks their
        # pins) until the kernels launched before their KernelFence have run; oldest first.
        self._deferred: deque = deque()
        self._ready: List[_Group] = []  # materialized ahead of their use
        # pinned parameter blocks materialized at once, per device
        self._materialize_limit = min(s.device_blocks for s in self.stores) // 2
        self._uses: List[_Group] = []  # groups in the order this step used them
        self._use_trace: Optional[List[_Group]] = None  # the previous step's order
        self._use_pos: Optional[int] = None  # position in it (None: this step went otherwise)
        self._in_step = False  # inside value_and_grad's forward + backward
        self._grad_write_ahead = 2
        self._tensor_hooks = []  # this step's hooks on Cell inputs/outputs (removed after backward)
        self._gather_writes = []  # simulation: writes of gathered parameter shards
        self._backward_updates: Optional[_UpdateRun] = None  # set while train_step's backward runs
        self._update_counts = {"host": 0, "optimizer": 0}  # group updates so far, per path
        self._update_wait_ns = 0  # training-thread time spent finishing updates after the backward
        self._owned_stores: List[OffloadStore] = []  # set by hyper_offload: closed by close()
        self._owned_dirs: List[str] = []
        # Two writer threads: a write that must first evict a dirty block does disk I/O, and a
        # second thread keeps the disk busy meanwhile (writes to one block are serialized by the store).
        nice = max(s.worker_nice for s in self.stores)
        self._writer = (_background_executor("mshyper-write", nice) if async_writes else _InlineExecutor())
        # Host updates of groups whose gradients are complete, while the backward runs (train_step).
        self._host_updater = _background_executor("mshyper-update", nice)
        self.groups = self._make_groups()
        offloaded = {id(p) for g in self.groups for p in g.params}
        self.resident_params = [p for p in model.trainable_params() if id(p) not in offloaded]
        try:
            self._check_working_sets()
        except WorkingSetError:
            self._restore_values()  # refused before running: leave the model as it was
            raise
        self._resident_optimizer = optimizer(self.resident_params) if self.resident_params else None
        self._install(cell_backward_hooks)

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
            group.shapes = [v.shape for v in values]
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
            # Two per signature: one update is loaded while the previous one's optimizer runs and
            # its results are written out.
            self._workspaces[signature] = [
                Workspace(updates, self._optimizer_factory, 2 * len(self._workspaces) + i) for i in range(2)]
        dev.workspaces = self._workspaces[signature]
        dev.params = [store.put(v[s.param_region]) for s, v in zip(shards, values)]
        dev.states = [store.put(value) for value in dev.workspaces[0].initial_states]
        dev.grads = [store.put(np.zeros(u.shape, u.dtype)) for u in updates]
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

    def _install(self, cell_backward_hooks: bool) -> None:
        for g in self.groups:
            self._hooks.append(g.cell.register_forward_pre_hook(self._make_bring(g)))
            self._hooks.append(g.cell.register_forward_hook(self._make_drop(g)))
            if cell_backward_hooks:
                self._use_cell_backward_hooks(g)
            for i, p in enumerate(g.params):
                try:
                    self._hooks.append(p.register_hook(self._make_param_grad_hook(g, i)))
                except RuntimeError:  # no gradient hook: the group is updated after the backward
                    pass
        for name, cell in self.model.cells_and_names():
            if name and any(fnmatch.fnmatchcase(name, p) for p in self.policy.activation_cells):
                self._hooks.append(cell.register_forward_pre_hook(self._make_act_enter(name)))
                self._hooks.append(cell.register_forward_hook(self._make_act_exit(name)))

    # -- hooks ---------------------------------------------------------------------------
    # Parameter.set_data on a Parameter that launched kernels still read waits (spinning) for
    # them; on one nothing reads (a placeholder being materialized) it does not (measured). So a
    # used group is *deferred*: scrubbed at the next materialization, once the KernelFence
    # launched behind the newest deferred group has passed (a wait that sleeps; then set_data has
    # nothing to wait for). Scrubbing only the groups whose fence has passed, so that MindSpore's
    # queue never runs dry, was measured slower: the groups left pinned take device-tier slots
    # the prefetcher needs (more late blocks, 50% more host->device traffic). A group is
    # materialized together with the groups the previous step used right after it (up to half
    # the device tier).
    def _bring(self, g: _Group) -> None:
        g.resident_depth += 1
        if g.resident_depth > 1:
            return
        self._record_use(g)
        # Every use is one access in the prefetch trace, however it is served, so the trace is the
        # same in every step (the first one included).
        for i, r in enumerate(self._ready):
            if r is g:  # materialized ahead
                del self._ready[i]
                self._touch_params(g)
                return
        for i, (d, fence) in enumerate(self._deferred):
            if d is g:  # dropped but not scrubbed yet: its values and pins are still in place
                del self._deferred[i]
                fence.abandon()
                self._touch_params(g)
                return
        self._scrub_deferred()
        if self._ready:  # a prediction that did not come true: nothing uses them yet
            self._scrub_groups(self._ready)
            self._ready = []
        try:
            self._materialize(g)
        except BaseException:
            g.resident_depth -= 1  # not brought: nothing to drop
            raise
        budget = self._materialize_limit - g.param_blocks
        for h in self._predicted_uses():
            if h is g or any(r is h for r in self._ready) or h.resident_depth > 0 or h.param_blocks > budget:
                break
            try:
                self._materialize(h, record=False)
            except CapacityError:  # the tier is full (e.g. activations held): h is brought when used
                break
            budget -= h.param_blocks
            self._ready.append(h)

    def _touch_params(self, g: _Group) -> None:
        for dev in g.devices:
            dev.store.touch(dev.param_blocks)

    def _materialize(self, g: _Group, record: bool = True) -> None:
        """Pins the group's parameter blocks on every device's tier and puts the values into its
        Parameters (one device: its tensors; simulation: the global tensors its shards form)."""
        acquired = []
        try:
            for dev in g.devices:
                dev.store.acquire(dev.param_blocks, record=record)
                acquired.append(dev)
            for i, p in enumerate(g.params):
                p.set_data(Tensor.from_numpy(self._gather(g, i, pinned=True)), slice_shape=True)
        except BaseException:
            for i, p in enumerate(g.params):
                p.set_data(g.placeholder(i), slice_shape=True)
            for dev in acquired:
                dev.store.release(dev.param_blocks)
            raise
        for rank, dev in enumerate(g.devices):
            self._account(rank, dev.param_bytes)

    def _gather(self, g: _Group, i: int, pinned: bool) -> np.ndarray:
        """Parameter `i` of `g`, from every device's shard (one device: its whole tensor)."""
        tier = "device" if pinned else None
        if len(g.devices) == 1:
            return g.devices[0].store.get(g.devices[0].params[i], pinned_tier=tier)
        return assemble(g.shapes[i], g.devices[0].params[i].dtype,
                        ((d.shards[i].param_region, d.store.get(d.params[i], pinned_tier=tier)) for d in g.devices))

    def _record_use(self, g: _Group) -> None:
        if not self._in_step:
            return
        self._uses.append(g)
        if self._use_trace is not None and self._use_pos is not None:
            t = self._use_trace
            self._use_pos = self._use_pos + 1 if self._use_pos < len(t) and t[self._use_pos] is g else None

    def _predicted_uses(self) -> List[_Group]:
        """The groups the previous step used after the current point (if it has gone alike)."""
        if not self._in_step or self._use_trace is None or self._use_pos is None:
            return []
        return self._use_trace[self._use_pos:]

    def _drop(self, g: _Group) -> None:
        g.resident_depth -= 1
        if g.resident_depth > 0:
            return
        # PyNative launches kernels asynchronously and a queued kernel reads the Parameter's data
        # when it runs, so the placeholder may replace the data only once the kernels launched so
        # far have run. Instead of waiting here (`_pynative_executor.sync()` busy-waits and stops
        # Python from launching the next Cell), a fence kernel marks the point and the group is
        # scrubbed once the fence has passed (`_scrub_deferred`), when the next group is
        # materialized.
        self._deferred.append((g, KernelFence()))

    def _scrub_deferred(self) -> None:
        """Scrubs and releases the deferred groups once their fences have passed (then no launched
        kernel is left for set_data to spin on)."""
        if not self._deferred:
            return
        for _, fence in self._deferred:  # in launch order: once the newest has passed, all have
            fence.wait()
        groups = [g for g, _ in self._deferred]
        self._deferred.clear()
        self._scrub_groups(groups)

    def _scrub_all(self) -> None:
        self._scrub_deferred()
        ready, self._ready = self._ready, []
        self._scrub_groups(ready)

    def _scrub_groups(self, groups) -> None:
        error = None
        for g in groups:
            try:
                for i, p in enumerate(g.params):
                    p.set_data(g.placeholder(i), slice_shape=True)
            except BaseException as e:  # still release every group's pins; report the first error
                error = error or e
            for rank, dev in enumerate(g.devices):
                self._account(rank, -dev.param_bytes)
                dev.store.release(dev.param_blocks)
        if error is not None:
            raise error

    def _make_bring(self, g: _Group):
        def hook(cell, inputs):
            self._bring(g)
        return hook

    def _make_drop(self, g: _Group):
        def hook(cell, inputs, output):
            self._drop(g)
            if _pynative_executor.requires_grad() and not g.cell_backward_hooks:
                if not self._hook_backward_use(g, inputs, output):
                    self._use_cell_backward_hooks(g)
        return hook

    def _hook_backward_use(self, g: _Group, inputs, output) -> bool:
        """Brings the group's parameters back for this call's backward and drops them after it.

        Tensor hooks instead of Cell backward (pre-)hooks: the first gradient reaching one of the
        call's outputs brings the parameters (before MindSpore launches the Cell's backward, as a
        backward pre-hook would), and the gradients of all its (non-Parameter) Tensor inputs
        being complete drops them (as a backward hook would). MindSpore's Cell backward hooks
        wrap inputs and outputs in CellBackwardHook ops that copy them and wait for the forward
        pipeline; measured on this model they cost more than the offloading's own work. A call
        whose inputs get no gradient (e.g. the first layer's data) is dropped when the backward
        ends (`_end_backward`). False if no output takes a hook."""
        outs = list(_flat_tensors(output))
        if not outs:
            return True
        ins = [t for t in _flat_tensors(inputs) if not isinstance(t, Parameter)]
        use = {"brought": False, "left": len(ins)}

        def on_output_grad(grad):
            if not use["brought"]:
                use["brought"] = True
                self._bring(g)

        def on_input_grad(grad):
            use["left"] -= 1
            if use["left"] == 0 and use["brought"]:
                use["brought"] = False
                self._drop(g)

        hooked = 0
        for t in outs:
            try:
                self._tensor_hooks.append(t.register_hook(on_output_grad))
                hooked += 1
            except RuntimeError:  # a Tensor outside autograd (e.g. a DTensor of the simulation)
                pass
        if not hooked:
            return False
        for t in ins:
            try:
                self._tensor_hooks.append(t.register_hook(on_input_grad))
            except RuntimeError:
                use["left"] -= 1  # gets no gradient: dropped when the backward ends
        return True

    def _use_cell_backward_hooks(self, g: _Group) -> None:
        """MindSpore's Cell backward hooks, for a Cell whose call's outputs take no tensor hooks
        (the simulation passes DTensors between Cells; their shards carry the autograd): from the
        start for a SimulatedModel, else from the first such call on. Registered from the forward
        hook, the pre-hook already wraps this call's output; the inputs were not wrapped, so this
        call's use ends with the backward."""
        g.cell_backward_hooks = True
        self._hooks.append(g.cell.register_backward_pre_hook(lambda cell, grad_output: self._bring(g)))
        self._hooks.append(g.cell.register_backward_hook(lambda cell, grad_input, grad_output: self._drop(g)))

    def _end_backward(self) -> None:
        """After backward: every group's use is over (also those whose inputs got no gradient)."""
        hooks, self._tensor_hooks = self._tensor_hooks, []
        for h in hooks:
            h.remove()
        for g in self.groups:
            if g.resident_depth > 0:
                g.resident_depth = 1
                self._drop(g)
        self._scrub_all()

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
        return self._running_ranks() or list(range(len(self.stores)))

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
        held = []
        try:
            for store, ref in obj:  # every holder brings its copy back to its device tier
                try:
                    store.acquire(ref.blocks)
                except CapacityError:  # parameters kept in place for later (_deferred, _ready) hold the tier
                    self._scrub_all()
                    store.acquire(ref.blocks)
                held.append((store, ref))
            store, ref = obj[0]
            return Tensor.from_numpy(store.get(ref, pinned_tier="device"))
        finally:
            for store, ref in held:
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
            self._use_trace, self._use_pos, self._uses = self._uses or None, 0, []
            self._in_step = True
            try:
                out = grad_fn(*inputs)
            except BaseException:
                self._in_step = False
                try:
                    self._end_backward()
                except Exception:  # pylint: disable=broad-except
                    pass  # the first error is the one to report
                raise
            self._in_step = False
            self._end_backward()
            return out
        return run

    def _write_gradient(self, g: _Group, i: int, grad: Tensor) -> None:
        """Each device stores the part of the (data-parallel reduced) gradient it updates."""
        value = grad.asnumpy()
        for dev in g.devices:
            dev.store.update(dev.grads[i], dev.shards[i].update_of_global(value))

    def apply_gradients(self, grads: Sequence[Tensor]) -> None:
        """Writes the gradients to the store, then updates each group, device by device, with its
        optimizer; parameter shards updated in slices (ZeRO-1) are gathered back afterwards."""
        grads = list(grads)
        self._scrub_all()  # (after a forward outside value_and_grad)
        n_off = sum(len(g.params) for g in self.groups)
        if len(grads) != n_off + len(self.resident_params):
            raise ValueError(f"expected {n_off + len(self.resident_params)} gradients, got {len(grads)}")
        run = _UpdateRun()
        try:
            self._update_from_store(run, list(reversed(self.groups)), grads)
        finally:
            self._finish_updates(run)

    def _update_from_store(self, run: "_UpdateRun", order: List[_Group], grads: List[Tensor]) -> None:
        """Updates `order`'s groups from `grads` (every trainable parameter's, in
        `trainable_params` order; resident ones updated by their own optimizer) through the store."""
        # Store writes run on background threads (they release the GIL) while the training
        # thread moves on. Groups are updated in backward order (the trace's order: their blocks
        # are prefetched); their gradients are written in that order, and each group waits only
        # for its own.
        n_off = sum(len(g.params) for g in self.groups)
        first, k = {}, 0
        for g in self.groups:
            first[id(g)] = k
            k += len(g.params)
        grad_writes = {}

        def write_grads(i):
            if i >= len(order) or i in grad_writes:
                return
            g = order[i]
            futures = []
            for j in range(len(g.params)):
                futures.append(self._writer.submit(self._write_gradient, g, j, grads[first[id(g)] + j]))
                grads[first[id(g)] + j] = None  # the task holds it until written, then MindSpore may free it
            grad_writes[i] = futures

        try:
            for i in range(self._grad_write_ahead):
                write_grads(i)
            if self._resident_optimizer is not None:
                self._resident_optimizer(tuple(grads[n_off:]))
            for i, g in enumerate(order):
                write_grads(i + self._grad_write_ahead)
                for f in grad_writes[i]:  # this group's gradients must be in the store
                    f.result()
                self._launch_update(run, g)
        finally:
            for i in range(len(order)):
                write_grads(i)
            for futures in grad_writes.values():
                for f in futures:
                    f.result()

    def _launch_update(self, run: "_UpdateRun", g: _Group) -> None:
        """Launches the optimizer on each device's part of group `g`, from the stored gradients.

        Per device, its blocks are pinned only while the values are copied into a free workspace;
        the optimizer is launched with a KernelFence behind it. An earlier update's results are
        written to the store (new versions) from its workspace on the writer threads once its
        fence has passed -- while this one is loaded and its optimizer runs; a workspace is reused
        when those writes are done.
        """
        self._update_counts["optimizer"] += 1
        for rank, dev in enumerate(g.devices):
            ws = self._next_workspace(run, dev)
            blocks = dev.update_blocks
            dev.store.acquire(blocks)
            try:
                while run.inflight:
                    self._submit_results(run.inflight.popleft(), run.pieces)
                ws.in_use, ws.rank = True, rank
                self._account(rank, ws.nbytes)
                ws.load(dev.store, dev.shards, dev.params, dev.states, dev.grads)
                for ref in dev.grads:  # consumed: they need never reach the disk
                    dev.store.discard(ref)
            finally:
                dev.store.release(blocks)
            ws.optimizer(ws.grads)
            run.inflight.append((g, rank, ws, KernelFence()))

    def _next_workspace(self, run: "_UpdateRun", dev: _DeviceGroup) -> Workspace:
        """The device group's next workspace (in turn), once free."""
        key = id(dev.workspaces)
        ws = dev.workspaces[run.turn.get(key, 0) % len(dev.workspaces)]
        run.turn[key] = run.turn.get(key, 0) + 1
        while ws.in_use:
            if any(w is ws for _, _, w, _ in run.inflight):
                self._submit_results(run.inflight.popleft(), run.pieces)
            else:
                self._free_workspace(ws)
        return ws

    def _finish_updates(self, run: "_UpdateRun") -> None:
        """Waits for the host updates, writes every launched update's results and waits for all
        store writes; raises the first error. The time it takes is counted in `stats()`
        (``update_wait_ns``): the update work the step did not overlap."""
        t0 = time.perf_counter_ns()
        try:
            self._finish_updates_now(run)
        finally:
            self._update_wait_ns += time.perf_counter_ns() - t0

    def _finish_updates_now(self, run: "_UpdateRun") -> None:
        error = None
        for task in run.host_tasks:
            try:
                task.result()
            except BaseException as e:  # still wait for the others and finish the rest: they use the stores
                error = error or e
        try:
            while run.inflight:
                self._submit_results(run.inflight.popleft(), run.pieces)
        finally:
            for wss in self._workspaces.values():
                for ws in wss:
                    self._free_workspace(ws)
            gathers, self._gather_writes = self._gather_writes, []
            for f in gathers:
                f.result()
        if error is not None:
            raise error

    def _submit_results(self, entry, pieces: Dict[int, list]) -> None:
        """Writes one device's update results: its optimizer states, and its parameter slice --
        directly (one device) or, once every device of the group is done, gathered into each
        device's shard (ZeRO-1's AllGather)."""
        g, rank, ws, fence = entry
        fence.wait()
        dev = g.devices[rank]
        results = ws.results()
        new_params, new_states = results[:len(g.params)], results[len(g.params):]
        ws.writes = [self._writer.submit(dev.store.update, ref, value) for ref, value in zip(dev.states, new_states)]
        if len(g.devices) == 1:
            ws.writes += [self._writer.submit(dev.store.update, ref, value) for ref, value in zip(dev.params, new_params)]
            return
        self._collect_slices(g, dev, [v.copy() for v in new_params], pieces, wait=False)

    def _collect_slices(self, g: _Group, dev: _DeviceGroup, values: List[np.ndarray], pieces: Dict[int, list],
                        wait: bool) -> None:
        """Keeps one device's updated slices; once every device of the group has given its own,
        writes the assembled shards to every device's store (ZeRO-1's AllGather) -- on the writer
        threads, or here (`wait`)."""
        done = pieces.setdefault(id(g), [[] for _ in g.params])
        for i, value in enumerate(values):
            done[i].append((dev.shards[i].update_region, value))
        if len(done[0]) < len(g.devices):
            return
        del pieces[id(g)]
        for i, parts in enumerate(done):
            whole = assemble(g.shapes[i], parts[0][1].dtype, parts)
            for d in g.devices:
                value = np.ascontiguousarray(whole[d.shards[i].param_region])
                if wait:
                    d.store.update(d.params[i], value)
                else:
                    self._gather_writes.append(self._writer.submit(d.store.update, d.params[i], value))

    def _free_workspace(self, ws: Workspace) -> None:
        """Waits for the workspace's result writes; it can then take the next update."""
        writes, ws.writes = ws.writes, []
        try:
            for f in writes:
                f.result()
        finally:
            if ws.in_use:
                ws.in_use = False
                self._account(ws.rank, -ws.nbytes)

    def _make_param_grad_hook(self, g: _Group, i: int):
        def hook(grad):
            self._on_param_grad(g, i, grad)
        return hook

    def _on_param_grad(self, g: _Group, i: int, grad: Tensor) -> None:
        """In train_step's backward: the complete gradient of parameter `i` of `g` (MindSpore runs
        a Parameter's hook once, on its accumulated gradient). Its value is copied out of the
        kernel stream without waiting (TensorCopyOut); once the group has all of them, its update
        runs on the host (`_host_update`) while the backward goes on."""
        run = self._backward_updates
        if run is None or g.step_grads is None:
            return
        if g.step_grads[i] is not None:
            raise RuntimeError(f"offload: the gradient hook of parameter '{g.params[i].name}' ran twice in "
                               f"one backward")
        g.step_grads[i] = TensorCopyOut(grad)
        if all(c is not None for c in g.step_grads):
            copies, g.step_grads = g.step_grads, None
            run.updated.add(id(g))
            self._update_counts["host"] += 1
            run.host_tasks.append(self._host_updater.submit(self._host_update, g, copies))

    def _host_update(self, g: _Group, copies: List[TensorCopyOut]) -> None:
        """Updates group `g` on the host (an updater thread): per device, its parameter part and
        optimizer states are read from the store (brought to the host tier, never to the
        device's), updated by the workspace optimizer's host rule with the device's part of the
        gradients, and written back (new versions); ZeRO-1 slices are gathered into every
        device's shard afterwards."""
        grads = [c.take() for c in copies]
        pieces: Dict[int, list] = {}
        for dev in g.devices:
            params = [shard.update_of_shard(dev.store.get(ref)) for shard, ref in zip(dev.shards, dev.params)]
            states = [dev.store.get(ref) for ref in dev.states]
            part = [shard.update_of_global(grad) for grad, shard in zip(grads, dev.shards)]
            dev.workspaces[0].host_rule.step(params, states, part)
            for ref, value in zip(dev.states, states):
                dev.store.update(ref, value)
            if len(g.devices) == 1:
                for ref, value in zip(dev.params, params):
                    dev.store.update(ref, value)
            else:
                self._collect_slices(g, dev, params, pieces, wait=True)

    def _host_updates_enabled(self) -> bool:
        return all(dev.workspaces[0].host_rule is not None for g in self.groups for dev in g.devices)

    def train_step(self, loss_fn: Callable) -> Callable:
        """A function running forward, backward and the optimizer update; returns the loss.

        With an optimizer that has a host rule (`host_optimizer`: Adam, SGD), each offloaded
        group is updated on the host during the backward, as soon as its gradients are complete
        (`_on_param_grad`): the update's store traffic overlaps the backward's compute and the
        gradients never pass through the store. Other optimizers, and groups whose gradients the
        hooks did not all deliver, are updated after the backward, as `apply_gradients` does."""
        grad_fn = self.value_and_grad(loss_fn)
        on_host = self._host_updates_enabled()

        def step(*inputs):
            run = _UpdateRun()
            if on_host:
                for g in self.groups:
                    g.step_grads = [None] * len(g.params)
            self._backward_updates = run if on_host else None
            try:
                try:
                    loss, grads = grad_fn(*inputs)
                except Exception as e:
                    if not run.updated:
                        raise
                    done = [g.name for g in self.groups if id(g) in run.updated]
                    raise RuntimeError(
                        f"the backward failed after {len(done)} of {len(self.groups)} offloaded groups were "
                        f"updated during it ({', '.join(done)}); the others were not: the model is partially "
                        f"updated by this step") from e
                finally:
                    self._backward_updates = None
                    for g in self.groups:
                        for copy in g.step_grads or ():  # a group not updated in the backward
                            if copy is not None:
                                copy.abandon()
                        g.step_grads = None
                grads = list(grads)
                rest = [g for g in reversed(self.groups) if id(g) not in run.updated]
                self._update_from_store(run, rest, grads)
            finally:
                self._finish_updates(run)
            return loss
        return step

    # -- inspection / teardown -------------------------------------------------------------
    def parameter_values(self) -> Dict[str, np.ndarray]:
        """Current values of every trainable parameter (read from the store for offloaded ones)."""
        self._scrub_all()
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
        out["group_updates"] = dict(self._update_counts)  # host: during the backward; optimizer: after it
        out["update_wait_ns"] = self._update_wait_ns
        return out

    def remove(self) -> None:
        """Removes the hooks and puts the stored values back into the model's Parameters."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._scrub_all()
        self._restore_values()

    def close(self) -> None:
        """Closes the stores `hyper_offload` created (their disk files and folders are removed);
        stores passed in by the caller stay open."""
        self._writer.shutdown()
        self._host_updater.shutdown()
        for store in self._owned_stores:
            store.close()
        for path in self._owned_dirs:
            shutil.rmtree(path, ignore_errors=True)
        self._owned_stores, self._owned_dirs = [], []

    def _restore_values(self) -> None:
        for g in self.groups:
            for i, p in enumerate(g.params):
                p.set_data(Tensor(self._gather(g, i, pinned=False)), slice_shape=True)


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
    from mindspore_hyper.runtime.model import ParallelModel

    policy = policy or OffloadPolicy()
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
        running_ranks = model.execution.running_ranks
        model.execution.batch_shards = False  # activations are saved per shard, for the devices holding each
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
    return off


def maybe_offload(model: nn.Cell, policy: Optional[OffloadPolicy] = None, *,
                  optimizer: Callable[[list], nn.Cell], **store_options):
    """`hyper_offload` when the ``hyper_offload`` context flag is on, else None."""
    if not get_context("hyper_offload"):
        return None
    return hyper_offload(model, policy, optimizer=optimizer, **store_options)
