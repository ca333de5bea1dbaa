"""`SimulatedModel`: an unmodified nn.Cell run sharded over N virtual devices.

Every virtual device lives in this process. Parameters are laid out by differentiable slicing of
the original global `Parameter`, so optimizers, checkpoints and `load_param_into_net` work
unchanged; the report says what each device would hold and send.
"""
from __future__ import annotations

from typing import Set, Tuple

from mindspore import Tensor, nn, ops

from mindspore_hyper.comm.collectives import AxisGroup, on_gradient, ring_send_bytes
from mindspore_hyper.runtime.model import ParallelModel
from mindspore_hyper.strategy.resolve import StrategyTable

# a new node for the gradient hook: the Identity primitive (ops.identity, the same op, prints
# MindSpore's deprecation warning on every run)
_IDENTITY = ops.Identity()

__all__ = ["SimulatedModel"]


class SimulatedModel(ParallelModel):
    """A model running on a simulated mesh (see module docstring and ParallelModel)."""

    def __init__(self, network: nn.Cell, table: StrategyTable, runtime, return_dtensor: bool = False):
        super().__init__(network, table, runtime, return_dtensor)
        self._synced: Set[Tuple[int, str]] = set()

    def begin_step(self) -> None:
        self._synced.clear()

    def _parameter_fan_out(self, shard: Tensor, group: AxisGroup, slot):
        """A parameter's gradient is summed over `group` once per step (data-parallel gradient
        synchronisation): an AllReduce, or with ZeRO-1 along the group a ReduceScatter to the
        optimizer shard plus an AllGather of the updated parameter shard. Recorded when the
        gradient arrives; autograd sums the per-device contributions here."""
        if not group.records or group.size == 1:
            return shard
        pid = id(slot.param)
        row = self.rows[pid]
        accounting, n, axis = self.accounting, group.size, group.axis
        zero_axes = {self.mesh.alias_names[a] for a in slot.zero_axes}
        zero = bool(zero_axes & set(axis.split("+")))
        synced = self._synced

        def hook(grad):
            if (pid, axis) in synced:
                return
            synced.add((pid, axis))
            nbytes = row.param_bytes
            if zero:
                accounting.record_comm("ReduceScatter", axis, ring_send_bytes("ReduceScatter", n, nbytes), nbytes,
                                       backward=True)
                accounting.record_comm("AllGather", axis, ring_send_bytes("ReduceScatter", n, nbytes), nbytes // n,
                                       backward=True)
            else:
                accounting.record_comm("AllReduce", axis, ring_send_bytes("AllReduce", n, nbytes), nbytes,
                                       backward=True)

        out = _IDENTITY(shard)
        return out if on_gradient(out, hook) else shard
