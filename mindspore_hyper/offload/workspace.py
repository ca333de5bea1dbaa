"""The optimizer workspace: where one device's part of an offload unit is updated.

MindSpore's optimizers keep using the data a Parameter had at their first call, so the optimizer
never runs on the (placeholder-swapped) model Parameters. Instead a unit's parameters, optimizer
states and gradients are copied into a workspace (Parameters of the update's shapes and one
optimizer instance over them), the optimizer runs once, and the results are written back to the
store. Workspaces are shared by every unit (and device) with the same shape signature.
"""
from __future__ import annotations

from typing import Callable, List, Sequence

import numpy as np

from mindspore import Parameter, Tensor, nn, ops

from mindspore_hyper.offload.host_optimizer import host_rule
from mindspore_hyper.offload.device_shards import DeviceShard
from mindspore_hyper.offload.store import OffloadStore, TensorRef

__all__ = ["Workspace"]


class Workspace:
    """Parameters of one update's shapes, their optimizer, and gradient buffers.

    On CPU ``asnumpy()`` returns a view of a Parameter's memory, which stays put (checked here, and
    the optimizers rely on it), so values are read from the store straight into that memory and
    the results written to the store straight from it; gradients go into buffers the optimizer's
    gradient Tensors share (``Tensor.from_numpy``). Where ``asnumpy()`` copies (another device),
    ``ops.assign`` and copies of the results are used instead. A workspace is busy from loading a
    unit until that unit's results are in the store (`writes`).

    Args:
        values: initial values of the update's parameters (shapes and dtypes matter).
        factory: ``params -> nn.Optimizer``.
        index: names the workspace Parameters (``mshyper_ws<index>.<i>``).
    """

    def __init__(self, values: List[np.ndarray], factory: Callable[[list], nn.Cell], index: int):
        self.params = [Parameter(Tensor(v.copy()), name=f"mshyper_ws{index}.{i}") for i, v in enumerate(values)]
        self.optimizer = factory(self.params)
        own = {id(p) for p in self.params}
        self.states = [sp for _, sp in self.optimizer.parameters_and_names() if id(sp) not in own]
        self.initial_states = [sp.asnumpy().copy() for sp in self.states]
        # the same update computed on the host (None: no rule for this optimizer)
        self.host_rule = host_rule(self.optimizer, self.states)
        self.nbytes = sum(v.nbytes for v in values) + sum(v.nbytes for v in self.initial_states)
        targets = [*self.params, *self.states]
        self.views = [t.asnumpy() for t in targets]  # params then states
        self.shared = all(np.shares_memory(v, t.asnumpy()) for v, t in zip(self.views, targets))
        self.grad_buffers = [np.zeros(v.shape, v.dtype) for v in values]
        self.grads = tuple(Tensor.from_numpy(b) for b in self.grad_buffers)
        self.writes: list = []  # store writes reading the views
        self.in_use = False
        self.rank = 0  # the device whose update it holds (memory accounting)

    def load(self, store: OffloadStore, shards: Sequence[DeviceShard], params: Sequence[TensorRef],
             states: Sequence[TensorRef], grads: Sequence[TensorRef]) -> None:
        """Copies one device's update in (its blocks pinned on the device tier): the part of each
        parameter shard it updates, its optimizer states and its gradients."""
        for ref, buf in zip(grads, self.grad_buffers):
            store.get_into(ref, buf, pinned_tier="device")
        values = []
        for shard, ref in zip(shards, params):
            if shard.update_region == shard.param_region:
                values.append(ref)
            else:  # ZeRO-1: the device updates a slice of its shard
                values.append(shard.update_of_shard(store.get(ref, pinned_tier="device")))
        values.extend(states)
        for value, view, target in zip(values, self.views, [*self.params, *self.states]):
            if isinstance(value, TensorRef):
                if self.shared:
                    store.get_into(value, view, pinned_tier="device")
                    continue
                value = store.get(value, pinned_tier="device")
            if self.shared:
                np.copyto(view, value)
            else:
                ops.assign(target, Tensor.from_numpy(value))

    def results(self) -> List[np.ndarray]:
        """The updated parameters + states, once the optimizer has run (views when shared)."""
        if self.shared:
            return self.views
        return [t.asnumpy().copy() for t in [*self.params, *self.states]]
