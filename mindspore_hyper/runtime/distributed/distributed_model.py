"""DistributedModel: the user's model in one process of an msrun job, holding one device's shards.

Every Parameter's data is this device's shard (`DistributedRuntime.materialize`), so the
parameter, gradient and optimizer-state bytes of a process are its shards. Gradients of a
parameter read by ops sharded over mesh axes it is replicated on (data parallelism) are summed
over those axes:

- inside `train_step`, each contribution is queued in the communication library's aggregator
  as soon as the backward produces it (super-packets, sent while the backward goes on), and the
  sums are collected after the backward; with ZeRO-1 (`optimizer_state=` axis) the
  contributions are reduce-scattered in buckets instead, each process updates its slice of the
  parameter and its optimizer states, and the updated slices are all-gathered;
- under a plain `mindspore.value_and_grad`, each contribution is all-reduced in the backward
  (synchronously), so the gradients are right without `train_step`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mindspore_hyper.comm.collectives import AxisGroup
from mindspore_hyper.comm.gradient_identity import identity_with_gradient
from mindspore_hyper.comm.process_collectives import adopt
from mindspore_hyper.runtime.gradient_sync import member_group
from mindspore_hyper.runtime.parallel_model import ParallelModel

__all__ = ["DistributedModel"]


@dataclass
class _ZeroSlice:
    """This process's optimizer slice of a parameter: `dim` of the local shard split over the
    ZeRO group `ranks` (member order), this process being member `index`."""

    param: Parameter
    slice_param: Parameter
    dim: int
    ranks: Tuple[int, ...]
    index: int
    axes: Tuple[int, ...]

    def take(self, full: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.array_split(full, len(self.ranks), axis=self.dim)[self.index])

    def region(self, shard: Tuple[slice, ...]) -> Tuple[slice, ...]:
        """The region of the global tensor this slice covers, given the local shard's region
        (the part `take` keeps, with np.array_split's piece sizes)."""
        start, stop = shard[self.dim].start, shard[self.dim].stop
        q, r = divmod(stop - start, len(self.ranks))
        begin = start + self.index * q + min(self.index, r)
        size = q + (1 if self.index < r else 0)
        return shard[:self.dim] + (slice(begin, begin + size),) + shard[self.dim + 1:]


class _ParameterGradient:
    """Identity in forward; in backward, the parameter gradient's sum over the group. A call is
    one node of MindSpore's PyNative autograd graph (`comm/gradient_identity.py`, a custom autograd
    function, not a Cell with a custom `bprop`): both `mindspore.value_and_grad` and `run_backward`
    (torch-style `loss.backward()`) differentiate it."""

    def __init__(self, model: "DistributedModel", slot, group: AxisGroup):
        self.sum_gradient, self.slot, self.group = model.sum_parameter_gradient, slot, group

    def __call__(self, x: Tensor) -> Tensor:
        return identity_with_gradient(x, lambda dout: self.sum_gradient(self.slot, self.group, dout))


class DistributedModel(ParallelModel):
    """A model in one msrun process (see module docstring and ParallelModel)."""

    def __init__(self, network: nn.Cell, table, runtime, return_dtensor: bool = False):
        super().__init__(network, table, runtime, return_dtensor)
        self.world = runtime.processes  # the processes of its mesh (the job, a stage, a group)
        self._deferring = False
        self._pending: List[tuple] = []  # (parameter id, async handle) of queued gradient sums
        self._zero_pending: List[tuple] = []  # (parameter id, group, contribution) for ZeRO-1
        self._zero: Dict[int, _ZeroSlice] = {}
        self._held: Dict[Tuple[int, AxisGroup], np.ndarray] = {}  # accumulated micro-batch contributions
        self._gradient_cells: Dict[Tuple[int, AxisGroup], _ParameterGradient] = {}

    # -- gradient sums ---------------------------------------------------------------------------
    def _parameter_fan_out(self, shard: Tensor, group: AxisGroup, slot):
        if group.size == 1:
            return shard
        key = (id(slot.param), group)
        if key not in self._gradient_cells:
            self._gradient_cells[key] = _ParameterGradient(self, slot, group)
        return self._gradient_cells[key](shard)

    def sum_parameter_gradient(self, slot, group: AxisGroup, dout: Tensor) -> Tensor:
        """A parameter's gradient contribution from an op sharded over `group` (called by the
        backward): queued (train_step) or all-reduced now; returns what autograd keeps."""
        pid = id(slot.param)
        if self._deferring and (self._held or not self._last_micro_batch):  # gradient accumulation
            held = self._held.pop((pid, group), None)
            if held is not None:
                dout = adopt(held + dout.asnumpy(), dout)
            if not self._last_micro_batch:  # summed locally until the last micro-batch's backward
                self._held[(pid, group)] = dout.asnumpy()
                return ops.zeros_like(dout)
        zero = self._zero.get(pid)
        if self._deferring and zero is not None and set(zero.axes) & set(self._axes(group)):
            self._zero_pending.append((pid, group, dout.asnumpy()))
            return ops.zeros_like(dout)
        sync = self.gradient_sync
        names = (slot.param.name,) if sync.claim(pid, group) else ()  # recorded once per step
        if self._deferring:
            self._pending.append((pid, sync.all_reduce_async(dout.asnumpy(), group, names)))
            return ops.zeros_like(dout)
        return adopt(sync.all_reduce(dout.asnumpy(), group, names), dout)

    def _axes(self, group: AxisGroup) -> Tuple[int, ...]:
        return tuple(self.mesh.axis_index(a) for a in group.axis.split("+"))

    # -- training --------------------------------------------------------------------------------
    def optimizer_parameters(self) -> List[Parameter]:
        """The trainable parameters, with ZeRO-1 ones replaced by this process's slice (a new
        Parameter of the same name, shaped like the slice)."""
        out = []
        for param in self.network.trainable_params():
            slot = self.execution.parameters[id(param)]
            zero = self._zero.get(id(param)) or self._make_zero_slice(param, slot)
            out.append(param if zero is None else zero.slice_param)
        return out

    def held_region(self, name: str, optimizer: bool = False) -> Tuple[slice, ...]:
        region = super().held_region(name)
        if optimizer:
            zero = next((z for pid, z in self._zero.items() if self.rows[pid].name == name), None)
            if zero is not None:
                return zero.region(region)
        return region

    def after_parameters_set(self) -> None:
        """Re-cut the ZeRO-1 optimizer slices from the (newly set) parameter shards."""
        for zero in self._zero.values():
            zero.slice_param.set_data(Tensor(zero.take(zero.param.asnumpy()), dtype=zero.param.dtype))

    def _make_zero_slice(self, param: Parameter, slot):
        if not slot.zero_axes:
            return None
        row = self.rows[id(param)]
        dims = [d for d in range(len(row.global_shape))
                if set(slot.zero_axes) <= set(row.optimizer_layout.dims[d]) - set(row.layout.dims[d])]
        dim = dims[0]
        me = self.world.rank
        ranks = tuple(self.mesh.axis_group(me, list(slot.zero_axes)))
        zero = _ZeroSlice(param, None, dim, ranks, ranks.index(me), tuple(slot.zero_axes))
        zero.slice_param = Parameter(Tensor(zero.take(param.asnumpy()), dtype=param.dtype), name=param.name,
                                     requires_grad=param.requires_grad)
        self._zero[id(param)] = zero
        return zero

    def backward_micro_batch(self, *inputs):
        """One micro-batch's backward with the gradient sums deferred (queued on the step's
        last micro-batch, summed locally before it: one reduction per step)."""
        if self._micro_batch == 0:
            self._pending, self._zero_pending, self._held = [], [], {}
        self._deferring = True
        try:
            return self._grad_fn(*inputs)
        finally:
            self._deferring = False

    def synchronise_gradients(self, weights: Sequence[Parameter], grads) -> list:
        if self._held:  # a contribution the last micro-batch did not make (a branch it skipped)
            raise RuntimeError(f"gradient accumulation: {len(self._held)} parameter gradient contribution(s) of "
                               f"earlier micro-batches were not made by the last one; the micro-batches must take "
                               f"the same path through the model")
        return self._finish_gradients(weights, grads)

    def _finish_gradients(self, weights: Sequence[Parameter], grads) -> list:
        """Add the queued sums to autograd's gradients; ZeRO-1 parameters get their slice."""
        arrays = {id(w): g.asnumpy().copy() for w, g in zip(weights, grads)}
        summed = set()
        for pid, handle in self._pending:
            arrays[pid] += handle.wait(self.world.timeout)
            summed.add(pid)
        sliced = {pid: zero.take(arrays[pid]) for pid, zero in self._zero.items() if pid in arrays}
        for pid, part in self._reduce_scatter_zero():
            sliced[pid] += part
        self.last_gradients = {self.rows[id(w)].name: sliced.get(id(w), arrays[id(w)]) for w in weights}
        out = []
        for w, g in zip(weights, grads):
            changed = id(w) in sliced or id(w) in summed
            out.append(adopt(sliced.get(id(w), arrays[id(w)]), g) if changed else g)
        return out

    def _reduce_scatter_zero(self):
        """Bucketed reduce-scatter of the queued ZeRO-1 contributions: per group, every
        contribution's slices are laid side by side so one collective serves the bucket."""
        buckets: Dict[Tuple[Tuple[int, ...], str], list] = {}
        for pid, group, contribution in self._zero_pending:
            zero = self._zero[pid]
            rest = [a for a in self._axes(group) if a not in zero.axes]
            if rest:  # first summed over the group's other axes (`GradientSync.parameter_sum`'s rows)
                others = member_group("+".join(self.mesh.alias_names[a] for a in rest),
                                      tuple(self.mesh.axis_group(self.world.rank, rest)), self.world.rank)
                contribution = self.gradient_sync.all_reduce(contribution, others, (zero.param.name,))
            zero_axis = "+".join(self.mesh.alias_names[a] for a in zero.axes)
            buckets.setdefault((zero.ranks, zero_axis), []).append((pid, contribution))
        for (ranks, axis), items in buckets.items():
            n = len(ranks)
            rows = []
            for pid, contribution in items:
                zero = self._zero[pid]
                moved = np.moveaxis(contribution, zero.dim, 0)
                rows.append(moved.reshape(n, -1))
            bucket = np.ascontiguousarray(np.concatenate(rows, axis=1))
            names = [self.execution.parameters[pid].param.name for pid, _ in items]
            mine = self.gradient_sync.reduce_scatter(bucket, member_group(axis, ranks, self.world.rank), names)
            offset = 0
            for (pid, contribution), row in zip(items, rows):
                zero = self._zero[pid]
                width = row.shape[1]
                moved_shape = np.moveaxis(contribution, zero.dim, 0).shape
                part = mine[offset:offset + width].reshape((moved_shape[0] // n,) + moved_shape[1:])
                offset += width
                yield pid, np.moveaxis(part, 0, zero.dim)

    def updated_parameter(self, param: Parameter) -> Parameter:
        zero = self._zero.get(id(param))
        return param if zero is None else zero.slice_param

    def after_update(self) -> None:
        """All-gather the updated ZeRO-1 slices into the parameters' shards."""
        for zero in self._zero.values():
            axis = "+".join(self.mesh.alias_names[a] for a in zero.axes)
            full = self.gradient_sync.all_gather(zero.slice_param.asnumpy(), zero.dim,
                                                 member_group(axis, zero.ranks, self.world.rank), zero.param.name)
            zero.param.set_data(Tensor(full, dtype=zero.param.dtype))
