"""Optimizer updates of offload units, by two paths.

* Host path (train_step with an optimizer that has a host rule: Adam, SGD; host_optimizer.py): a
  unit is updated during the backward as soon as its parameters' gradient hooks have run. The
  gradients are copied out of the kernel stream without synchronizing it (copy_out.py), and an
  updater thread reads the unit's parameters and optimizer states from the store (host tier),
  computes the update and writes them back (new versions), overlapping the backward.
* Store path (other optimizers; `apply_gradients`): gradients are written to the store, then each
  unit is updated by its own optimizer Cell (built with the user's factory, so element-wise
  optimizers give exactly the result of one optimizer over all parameters): parameters,
  optimizer states and gradients are acquired together, copied into a workspace, updated, written
  back; the consumed gradients are discarded.

In simulation with ZeRO-1 each device updates a slice of its shard; the slices are gathered into
every device's shard afterwards (the AllGather).
"""
from __future__ import annotations

import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Dict, List, Sequence

import numpy as np

from mindspore import Tensor, nn

from mindspore_hyper import _core
from mindspore_hyper.offload.copy_out import TensorCopyOut
from mindspore_hyper.offload.device_shards import assemble
from mindspore_hyper.offload.fence import KernelFence
from mindspore_hyper.offload.offload_unit import OffloadUnit, UnitOnDevice, all_workspaces
from mindspore_hyper.offload.residency import Residency
from mindspore_hyper.offload.workspace import Workspace

__all__ = ["UnitUpdates", "UpdateRun"]


@dataclass
class UpdateRun:
    """One step's update pipeline: optimizers launched whose results are not written yet."""

    inflight: deque = field(default_factory=deque)  # (unit, rank, workspace, fence)
    pieces: Dict[int, list] = field(default_factory=dict)  # simulation: per unit, updated slices
    turn: Dict[int, int] = field(default_factory=dict)  # per workspace list, the next one's index
    updated: set = field(default_factory=set)  # ids of the units updated in the backward
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


class UnitUpdates:
    """Updates the offload units' parameters and optimizer states in the stores.

    Args:
        units: the offload units (their gradient hooks are registered here).
        residency: counts the workspaces' bytes on each device's tier.
        nice: CPU priority of the writer and updater threads.
        async_writes: write gradients and updated values on background threads.
    """

    grad_write_ahead = 2  # units whose gradients are written ahead of the one being updated

    def __init__(self, units: Sequence[OffloadUnit], residency: Residency, nice: int, async_writes: bool):
        self.units = list(units)
        self.residency = residency
        self.counts = {"host": 0, "optimizer": 0}  # unit updates so far, per path
        self.wait_ns = 0  # training-thread time spent finishing updates after the backward
        self.backward_run = None  # the UpdateRun while train_step's backward runs
        self._workspaces = all_workspaces(self.units)
        self._gather_writes = []  # simulation: writes of gathered parameter shards
        # Two writer threads: a write that must first evict a dirty block does disk I/O, and a
        # second thread keeps the disk busy meanwhile (writes to one block are serialized by the store).
        self._writer = _background_executor("mshyper-write", nice) if async_writes else _InlineExecutor()
        # Host updates of units whose gradients are complete, while the backward runs (train_step).
        self._host_updater = _background_executor("mshyper-update", nice)
        self.handles = []
        for u in self.units:
            for i, p in enumerate(u.params):
                try:
                    self.handles.append(p.register_hook(self._make_param_grad_hook(u, i)))
                except RuntimeError:  # no gradient hook: the unit is updated after the backward
                    pass

    def remove(self) -> None:
        """Removes the gradient hooks."""
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def shutdown(self) -> None:
        """Stops the background threads."""
        self._writer.shutdown()
        self._host_updater.shutdown()

    def host_updates_enabled(self) -> bool:
        """Whether every unit's optimizer has a host rule (the host path)."""
        return all(dev.workspaces[0].host_rule is not None for u in self.units for dev in u.devices)

    # -- store path ------------------------------------------------------------------------
    def update_from_store(self, run: UpdateRun, order: List[OffloadUnit], grads: List[Tensor],
                          resident_optimizer: nn.Cell = None) -> None:
        """Updates `order`'s units from `grads` (every trainable parameter's: the units' in unit
        order, then the resident ones, updated by `resident_optimizer`) through the store."""
        # Store writes run on background threads (they release the GIL) while the training
        # thread moves on. Units are updated in backward order (the trace's order: their blocks
        # are prefetched); their gradients are written in that order, and each unit waits only
        # for its own.
        n_off = sum(len(u.params) for u in self.units)
        first, k = {}, 0
        for u in self.units:
            first[id(u)] = k
            k += len(u.params)
        grad_writes = {}

        def write_grads(i):
            if i >= len(order) or i in grad_writes:
                return
            u = order[i]
            futures = []
            for j in range(len(u.params)):
                futures.append(self._writer.submit(self._write_gradient, u, j, grads[first[id(u)] + j]))
                grads[first[id(u)] + j] = None  # the task holds it until written, then MindSpore may free it
            grad_writes[i] = futures

        try:
            for i in range(self.grad_write_ahead):
                write_grads(i)
            if resident_optimizer is not None:
                resident_optimizer(tuple(grads[n_off:]))
            for i, u in enumerate(order):
                write_grads(i + self.grad_write_ahead)
                for f in grad_writes[i]:  # this unit's gradients must be in the store
                    f.result()
                self._launch_update(run, u)
        finally:
            for i in range(len(order)):
                write_grads(i)
            for futures in grad_writes.values():
                for f in futures:
                    f.result()

    def _write_gradient(self, u: OffloadUnit, i: int, grad: Tensor) -> None:
        """Each device stores the part of the (data-parallel reduced) gradient it updates."""
        value = grad.asnumpy()
        for dev in u.devices:
            dev.store.update(dev.grads[i], dev.shards[i].update_of_global(value))

    def _launch_update(self, run: UpdateRun, u: OffloadUnit) -> None:
        """Launches the optimizer on each device's part of unit `u`, from the stored gradients.

        Per device, its blocks are pinned only while the values are copied into a free workspace;
        the optimizer is launched with a KernelFence behind it. An earlier update's results are
        written to the store (new versions) from its workspace on the writer threads once its
        fence has passed -- while this one is loaded and its optimizer runs; a workspace is reused
        when those writes are done.
        """
        self.counts["optimizer"] += 1
        for rank, dev in enumerate(u.devices):
            ws = self._next_workspace(run, dev)
            blocks = dev.update_blocks
            dev.store.acquire(blocks)
            try:
                while run.inflight:
                    self._submit_results(run.inflight.popleft(), run.pieces)
                ws.in_use, ws.rank = True, rank
                self.residency.account(rank, ws.nbytes)
                ws.load(dev.store, dev.shards, dev.params, dev.states, dev.grads)
                for ref in dev.grads:  # consumed: they need never reach the disk
                    dev.store.discard(ref)
            finally:
                dev.store.release(blocks)
            ws.optimizer(ws.grads)
            run.inflight.append((u, rank, ws, KernelFence()))

    def _next_workspace(self, run: UpdateRun, dev: UnitOnDevice) -> Workspace:
        """The device part's next workspace (in turn), once free."""
        key = id(dev.workspaces)
        ws = dev.workspaces[run.turn.get(key, 0) % len(dev.workspaces)]
        run.turn[key] = run.turn.get(key, 0) + 1
        while ws.in_use:
            if any(w is ws for _, _, w, _ in run.inflight):
                self._submit_results(run.inflight.popleft(), run.pieces)
            else:
                self._free_workspace(ws)
        return ws

    def finish(self, run: UpdateRun) -> None:
        """Waits for the host updates, writes every launched update's results and waits for all
        store writes; raises the first error. The time it takes is counted in `wait_ns`: the
        update work the step did not overlap."""
        t0 = time.perf_counter_ns()
        try:
            self._finish_now(run)
        finally:
            self.wait_ns += time.perf_counter_ns() - t0

    def _finish_now(self, run: UpdateRun) -> None:
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
            for ws in self._workspaces:
                self._free_workspace(ws)
            gathers, self._gather_writes = self._gather_writes, []
            for f in gathers:
                f.result()
        if error is not None:
            raise error

    def _submit_results(self, entry, pieces: Dict[int, list]) -> None:
        """Writes one device's update results: its optimizer states, and its parameter slice --
        directly (one device) or, once every device of the unit is done, gathered into each
        device's shard (ZeRO-1's AllGather)."""
        u, rank, ws, fence = entry
        fence.wait()
        dev = u.devices[rank]
        results = ws.results()
        new_params, new_states = results[:len(u.params)], results[len(u.params):]
        ws.writes = [self._writer.submit(dev.store.update, ref, value) for ref, value in zip(dev.states, new_states)]
        if len(u.devices) == 1:
            ws.writes += [self._writer.submit(dev.store.update, ref, value) for ref, value in zip(dev.params, new_params)]
            return
        self._collect_slices(u, dev, [v.copy() for v in new_params], pieces, wait=False)

    def _collect_slices(self, u: OffloadUnit, dev: UnitOnDevice, values: List[np.ndarray], pieces: Dict[int, list],
                        wait: bool) -> None:
        """Keeps one device's updated slices; once every device of the unit has given its own,
        writes the assembled shards to every device's store (ZeRO-1's AllGather) -- on the writer
        threads, or here (`wait`)."""
        done = pieces.setdefault(id(u), [[] for _ in u.params])
        for i, value in enumerate(values):
            done[i].append((dev.shards[i].update_region, value))
        if len(done[0]) < len(u.devices):
            return
        del pieces[id(u)]
        for i, parts in enumerate(done):
            whole = assemble(u.shapes[i], parts[0][1].dtype, parts)
            for d in u.devices:
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
                self.residency.account(ws.rank, -ws.nbytes)

    # -- host path -------------------------------------------------------------------------
    def _make_param_grad_hook(self, u: OffloadUnit, i: int):
        def hook(grad):
            self.on_param_grad(u, i, grad)
        return hook

    def on_param_grad(self, u: OffloadUnit, i: int, grad: Tensor) -> None:
        """In train_step's backward: the complete gradient of parameter `i` of `u` (MindSpore runs
        a Parameter's hook once, on its accumulated gradient). Its value is copied out of the
        kernel stream without waiting (TensorCopyOut); once the unit has all of them, its update
        runs on the host (`_host_update`) while the backward goes on."""
        run = self.backward_run
        if run is None or u.step_grads is None:
            return
        if u.step_grads[i] is not None:
            raise RuntimeError(f"offload: the gradient hook of parameter '{u.params[i].name}' ran twice in "
                               f"one backward")
        u.step_grads[i] = TensorCopyOut(grad)
        if all(c is not None for c in u.step_grads):
            copies, u.step_grads = u.step_grads, None
            run.updated.add(id(u))
            self.counts["host"] += 1
            run.host_tasks.append(self._host_updater.submit(self._host_update, u, copies))

    def _host_update(self, u: OffloadUnit, copies: List[TensorCopyOut]) -> None:
        """Updates unit `u` on the host (an updater thread): per device, its parameter part and
        optimizer states are read from the store (brought to the host tier, never to the
        device's), updated by the workspace optimizer's host rule with the device's part of the
        gradients, and written back (new versions); ZeRO-1 slices are gathered into every
        device's shard afterwards."""
        grads = [c.take() for c in copies]
        pieces: Dict[int, list] = {}
        for dev in u.devices:
            params = [shard.update_of_shard(dev.store.get(ref)) for shard, ref in zip(dev.shards, dev.params)]
            states = [dev.store.get(ref) for ref in dev.states]
            part = [shard.update_of_global(grad) for grad, shard in zip(grads, dev.shards)]
            dev.workspaces[0].host_rule.step(params, states, part)
            for ref, value in zip(dev.states, states):
                dev.store.update(ref, value)
            if len(u.devices) == 1:
                for ref, value in zip(dev.params, params):
                    dev.store.update(ref, value)
            else:
                self._collect_slices(u, dev, params, pieces, wait=True)
