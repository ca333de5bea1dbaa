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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common.api import _pynative_executor

from mindspore_hyper.context import get_context
from mindspore_hyper.offload.store import OffloadStore, TensorRef

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


def _np_dtype(param: Parameter) -> np.dtype:
    return np.dtype(ms.dtype_to_nptype(param.dtype))


@dataclass
class _Slot:
    """One stored tensor bound to a live MindSpore Parameter."""

    param: Parameter
    ref: TensorRef

    def materialize(self, store: OffloadStore) -> None:
        self.param.set_data(Tensor.from_numpy(store.get(self.ref, pinned_tier="device")), slice_shape=True)

    def scrub(self) -> None:
        self.param.set_data(Tensor(np.zeros((1,), dtype=self.ref.dtype)), slice_shape=True)

    def write_back(self, store: OffloadStore) -> None:
        store.update(self.ref, self.param.asnumpy())


@dataclass
class _Group:
    name: str
    cell: nn.Cell
    params: List[_Slot] = field(default_factory=list)
    states: List[TensorRef] = field(default_factory=list)  # the workspace optimizer's states, in order
    grads: List[TensorRef] = field(default_factory=list)
    resident_depth: int = 0  # nesting of forward/backward uses currently holding the params
    workspace: Optional["_Workspace"] = None

    @property
    def param_blocks(self) -> List[int]:
        return _unique(b for s in self.params for b in s.ref.blocks)

    @property
    def update_blocks(self) -> List[int]:
        return _unique([*self.param_blocks, *(b for r in self.states for b in r.blocks),
                        *(b for g in self.grads for b in g.blocks)])

    @property
    def param_bytes(self) -> int:
        return sum(s.ref.nbytes for s in self.params)


class _Workspace:
    """Full-size Parameters and one optimizer instance for every group of one shape signature.

    MindSpore's optimizers keep using the data a Parameter had at their first call, so the
    optimizer never runs on the (placeholder-swapped) model Parameters. Instead each group's
    parameters and optimizer states are copied in place (ops.assign) into this workspace, the
    optimizer runs once, and the results are written back to the store. One compiled optimizer
    serves all groups of the same shapes; its memory is one group's parameters and states.
    """

    def __init__(self, params: List[Parameter], factory: Callable[[list], nn.Cell], index: int):
        self.params = [Parameter(Tensor(p.asnumpy().copy()), name=f"mshyper_ws{index}.{i}")
                       for i, p in enumerate(params)]
        self.optimizer = factory(self.params)
        own = {id(p) for p in self.params}
        self.states = [(n, sp) for n, sp in self.optimizer.parameters_and_names() if id(sp) not in own]
        self.initial_states = [sp.asnumpy().copy() for _, sp in self.states]
        self.nbytes = sum(p.asnumpy().nbytes for p in self.params) + sum(v.nbytes for v in self.initial_states)


class _Done:
    def __init__(self, value):
        self._value = value

    def result(self):
        return self._value


class _InlineExecutor:
    """Runs submitted writes immediately on the calling thread (async_writes=False)."""

    def submit(self, fn, *args):
        return _Done(fn(*args))


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
    """A model trained with its chosen sub-Cells offloaded. Create with `hyper_offload`."""

    def __init__(self, model: nn.Cell, policy: OffloadPolicy, optimizer: Callable[[list], nn.Cell],
                 store: OffloadStore, async_writes: bool = True):
        self.model = model
        self.policy = policy
        self.store = store
        self._optimizer_factory = optimizer
        self._hooks = []
        self._materialized_bytes = 0
        self.peak_materialized_bytes = 0
        self._activation_refs: Dict[Tuple[str, int], TensorRef] = {}
        self._act_counter: Dict[str, int] = {}
        self._act_ctx = []
        self._workspaces: Dict[tuple, _Workspace] = {}
        self._writer = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="mshyper-offload-writer")
                        if async_writes else _InlineExecutor())
        self.groups = self._make_groups()
        offloaded = {id(s.param) for g in self.groups for s in g.params}
        self.resident_params = [p for p in model.trainable_params() if id(p) not in offloaded]
        try:
            self._check_working_sets()
        except WorkingSetError:
            self._restore_values()  # refused before running: leave the model as it was
            raise
        self._resident_optimizer = optimizer(self.resident_params) if self.resident_params else None
        self._install()

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
            params = [p for p in cell.trainable_params() if id(p) not in seen]
            seen.update(id(p) for p in params)
            self.store.close_pack()
            for p in params:
                group.params.append(_Slot(p, self.store.put(p.asnumpy())))
            # Optimizer states (moments, step counters, ...) live in the store too; every group
            # starts from the initial state of a fresh optimizer (see _Workspace).
            signature = tuple((tuple(p.shape), str(p.dtype)) for p in params)
            if signature not in self._workspaces:
                self._workspaces[signature] = _Workspace(params, self._optimizer_factory, len(self._workspaces))
            group.workspace = self._workspaces[signature]
            for value in group.workspace.initial_states:
                group.states.append(self.store.put(value))
            for p in params:
                group.grads.append(self.store.put(np.zeros(p.shape, _np_dtype(p))))
            for slot in group.params:
                slot.scrub()
            groups.append(group)
        self.store.close_pack()
        return groups

    def _check_working_sets(self) -> None:
        cap = self.store.device_blocks
        bs = self.store.block_size
        for g in self.groups:
            fwd, upd = len(g.param_blocks), len(g.update_blocks)
            need = max(fwd, upd)
            if need > cap:
                raise WorkingSetError(
                    f"Cell '{g.name}' cannot run offloaded: its working set is {need} blocks of {_fmt(bs)} "
                    f"({_fmt(need * bs)}: parameters {_fmt(g.param_bytes)} in {fwd} blocks, with optimizer "
                    f"states and gradients {upd} blocks) but the device tier holds {cap} blocks "
                    f"({_fmt(self.store.device_memory)}). Raise device_memory, lower cache_block_size, "
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
        self.store.acquire(g.param_blocks)
        for s in g.params:
            s.materialize(self.store)
        self._account(g.param_bytes)

    def _drop(self, g: _Group) -> None:
        g.resident_depth -= 1
        if g.resident_depth > 0:
            return
        # PyNative launches kernels asynchronously and a queued kernel reads the Parameter's data
        # when it runs: wait for them before the data is replaced by the placeholder.
        _pynative_executor.sync()
        for s in g.params:
            s.scrub()
        self._account(-g.param_bytes)
        self.store.release(g.param_blocks)

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

    def _account(self, delta: int) -> None:
        self._materialized_bytes += delta
        self.peak_materialized_bytes = max(self.peak_materialized_bytes, self._materialized_bytes)

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

    def _make_pack(self, name: str):
        def pack(tensor):
            if isinstance(tensor, Parameter) or not isinstance(tensor, Tensor):
                return ("keep", tensor)
            array = tensor.asnumpy()
            if array.nbytes < self.policy.min_activation_bytes or array.nbytes == 0:
                return ("keep", tensor)
            index = self._act_counter.get(name, 0)
            self._act_counter[name] = index + 1
            key = (name, index)
            ref = self._activation_refs.get(key)
            if ref is not None and (ref.shape != array.shape or ref.dtype != array.dtype):
                self.store.erase(ref)
                ref = None
            if ref is None:
                ref = self.store.put(array)  # stable slot: same blocks every step (trace stays valid)
                self._activation_refs[key] = ref
            else:
                self.store.update(ref, array)
            return ("store", ref)
        return pack

    def _unpack(self, packed):
        kind, obj = packed
        if kind == "keep":
            return obj
        self.store.acquire(obj.blocks)
        try:
            return Tensor.from_numpy(self.store.get(obj, pinned_tier="device"))
        finally:
            self.store.release(obj.blocks)

    # -- training ------------------------------------------------------------------------
    def _write_tensor(self, ref: TensorRef, tensor: Tensor) -> None:
        self.store.update(ref, tensor.asnumpy())

    def trainable_params(self) -> List[Parameter]:
        """The parameters gradients are taken for: offloaded groups' first, then resident ones."""
        return [s.param for g in self.groups for s in g.params] + list(self.resident_params)

    def value_and_grad(self, loss_fn: Callable) -> Callable:
        """Like ``ms.value_and_grad(loss_fn, None, self.trainable_params())`` with offloading."""
        grad_fn = ms.value_and_grad(loss_fn, None, self.trainable_params())

        def run(*inputs):
            self.store.begin_step()
            self._act_counter.clear()
            return grad_fn(*inputs)
        return run

    def apply_gradients(self, grads: Sequence[Tensor]) -> None:
        """Writes the gradients to the store, then updates each group with its optimizer."""
        grads = list(grads)
        n_off = sum(len(g.params) for g in self.groups)
        if len(grads) != n_off + len(self.resident_params):
            raise ValueError(f"expected {n_off + len(self.resident_params)} gradients, got {len(grads)}")
        # Store writes run on a background thread (they release the GIL) while the training
        # thread launches the next group's update; all are done before this returns.
        pending = []
        k = 0
        for g in self.groups:
            for ref in g.grads:
                pending.append(self._writer.submit(self._write_tensor, ref, grads[k]))
                grads[k] = None  # the task holds it until written, then MindSpore may free it
                k += 1
        if self._resident_optimizer is not None:
            self._resident_optimizer(tuple(grads[n_off:]))
        for f in pending:  # a group's gradients must be in the store before it is updated
            f.result()
        pending.clear()
        for g in reversed(self.groups):  # backward order: the trace's order, blocks are prefetched
            blocks = g.update_blocks
            ws = g.workspace
            self.store.acquire(blocks)
            try:
                self._account(ws.nbytes)
                for slot, wp in zip(g.params, ws.params):
                    ops.assign(wp, Tensor.from_numpy(self.store.get(slot.ref, pinned_tier="device")))
                for ref, (_, sp) in zip(g.states, ws.states):
                    ops.assign(sp, Tensor.from_numpy(self.store.get(ref, pinned_tier="device")))
                gs = tuple(Tensor.from_numpy(self.store.get(ref, pinned_tier="device")) for ref in g.grads)
                ws.optimizer(gs)
                new_params = [wp.asnumpy() for wp in ws.params]
                new_states = [sp.asnumpy() for _, sp in ws.states]
                del gs
            finally:
                self.store.release(blocks)
            # Written after the release: the store then writes the host copies and drops the device
            # ones, instead of leaving dirty device copies that must be copied down later. The
            # arrays view the workspace, which the next group reuses: write copies.
            for slot, value in zip(g.params, new_params):
                pending.append(self._writer.submit(self.store.update, slot.ref, value.copy()))
            for ref, value in zip(g.states, new_states):
                pending.append(self._writer.submit(self.store.update, ref, value.copy()))
            self._account(-ws.nbytes)
        for f in pending:
            f.result()

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
            for s in g.params:
                out[s.param.name] = self.store.get(s.ref)
        for p in self.resident_params:
            out[p.name] = p.asnumpy()
        return out

    def stats(self) -> Dict:
        s = self.store.stats()
        s["peak_materialized_param_bytes"] = self.peak_materialized_bytes
        s["device_peak_bytes"] = s["device"]["peak_bytes"]
        return s

    def remove(self) -> None:
        """Removes the hooks and puts the stored values back into the model's Parameters."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._restore_values()

    def _restore_values(self) -> None:
        for g in self.groups:
            for s in g.params:
                s.param.set_data(Tensor(self.store.get(s.ref)), slice_shape=True)


def hyper_offload(model: nn.Cell, policy: Optional[OffloadPolicy] = None, *,
                  optimizer: Callable[[list], nn.Cell], store: Optional[OffloadStore] = None,
                  async_writes: bool = True, **store_options) -> OffloadedModel:
    """Offloads the parameters of chosen sub-Cells of `model` to the tiered store.

    Args:
        model: the network (PyNative mode).
        policy: which Cells (default: every direct child with parameters).
        optimizer: factory ``params -> nn.Optimizer`` (e.g. ``lambda ps: nn.Adam(ps, 1e-3)``); one
            instance is made per offloaded group and one for the resident parameters.
        store: an `OffloadStore`; default: a new one from the context flags and `store_options`
            (block_size, device_memory, host_memory, offload_dir, prefetch_depth, ...).
        async_writes: write gradients and updated values to the store on a background thread.

    Returns:
        The `OffloadedModel`; use ``.train_step(loss_fn)`` or ``.value_and_grad`` +
        ``.apply_gradients``.

    Raises:
        WorkingSetError: a sub-Cell's working set exceeds the device tier (before anything runs).
    """
    policy = policy or OffloadPolicy()
    store = store or OffloadStore(**store_options)
    return OffloadedModel(model, policy, optimizer, store, async_writes=async_writes)


def maybe_offload(model: nn.Cell, policy: Optional[OffloadPolicy] = None, *,
                  optimizer: Callable[[list], nn.Cell], **store_options):
    """`hyper_offload` when the ``hyper_offload`` context flag is on, else None."""
    if not get_context("hyper_offload"):
        return None
    return hyper_offload(model, policy, optimizer=optimizer, **store_options)
