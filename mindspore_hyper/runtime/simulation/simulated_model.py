"""`SimulatedModel`: an unmodified nn.Cell run sharded over N virtual devices.

Every virtual device lives in this process. Parameters are laid out by differentiable slicing of
the original global `Parameter`, so optimizers, checkpoints and `load_param_into_net` work
unchanged; the report says what each device would hold and send.
"""
from __future__ import annotations

from typing import Set, Tuple

from mindspore import Tensor, nn, ops

from mindspore_hyper import bfloat16_emulation
from mindspore_hyper.comm.collectives import AxisGroup, on_gradient
from mindspore_hyper.runtime.gradient_sync import zero_along
from mindspore_hyper.runtime.parallel_model import ParallelModel
from mindspore_hyper.strategy.resolve import StrategyTable

# a new node for the gradient hook: the Identity primitive (ops.identity, the same op, prints
# MindSpore's deprecation warning on every run)
_IDENTITY = ops.Identity()

__all__ = ["SimulatedModel", "batch_axes", "summed_once_per_step"]


class SimulatedModel(ParallelModel):
    """A model running on a simulated mesh (see module docstring and ParallelModel)."""

    def __init__(self, network: nn.Cell, table: StrategyTable, runtime, return_dtensor: bool = False):
        super().__init__(network, table, runtime, return_dtensor)
        collectives = self.execution.collectives
        if getattr(collectives, "recorder", None) is not None:
            collectives.recorder = self._record_backward
        self._batch_axes = batch_axes(self.strategy)

    def _record_backward(self, kind: str, axis: str, send_bytes: int, input_bytes: int, cause: str = "") -> None:
        """Backward traffic of the collectives. Under gradient accumulation, the gradient sum of
        a tensor read by an op sharded over the batch axes it is replicated on (a tensor that does
        not depend on the batch: one computed from parameters, such as a transposed weight; a
        parameter itself, or a cast of it, is summed through `_parameter_fan_out` before any
        redistribution, dtensor/dispatch.py) is done once per step, with the parameters':
        recorded on the last micro-batch only."""
        if not self._last_micro_batch and summed_once_per_step(kind, axis, self._batch_axes):
            return
        self.execution.record_backward(kind, axis, send_bytes, input_bytes, cause)

    def _parameter_fan_out(self, shard: Tensor, group: AxisGroup, slot):
        """A parameter's gradient is summed over `group` once per step (data-parallel gradient
        synchronisation): an AllReduce, or with ZeRO-1 along the group a ReduceScatter to the
        optimizer shard plus an AllGather of the updated parameter shard. Autograd sums the
        per-device contributions here; the gradient sync records its collectives when the
        gradient arrives."""
        if not group.records or group.size == 1:
            return shard
        pid = id(slot.param)
        row = self.rows[pid]
        zero = zero_along(self.mesh, slot, group)
        sync = self.gradient_sync

        def hook(grad):
            if sync.claim(pid, group):
                sync.parameter_sum(row.param_bytes, group, zero, slot.param.name)

        out = bfloat16_emulation.identity(_IDENTITY, shard)  # a bfloat16 Identity: on a float32 copy
        return out if on_gradient(out, hook) else shard


def summed_once_per_step(kind: str, axis: str, batch_axes: Set[str]) -> bool:
    """Whether a backward collective is the gradient sum of a tensor that does not depend on the
    batch (an AllReduce over batch axes only): under gradient accumulation it runs once per step,
    after the last micro-batch, not once per micro-batch."""
    return kind == "AllReduce" and set(axis.split("+")) <= batch_axes


def batch_axes(strategy) -> Set[str]:
    """The mesh axes that split the model's inputs (the batch, and the sequence where inputs are
    split along it)."""
    axes: Set[str] = set()
    if strategy.input_map is not None:
        for entry in strategy.input_map:
            axes.update(entry if isinstance(entry, (tuple, list)) else (entry,))
    elif strategy.data_axis is not None:
        axes.add(strategy.data_axis)
    if strategy.context is not None:
        axes.add(strategy.context.axis)
    axes.discard(None)
    axes.discard("None")
    return axes
