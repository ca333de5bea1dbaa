"""`simulate(model, strategy)`: run an unmodified nn.Cell sharded over N virtual devices.

The returned Cell takes the model's inputs, splits them by the strategy's input layout (batch
along the data axis), lays every parameter out by the resolved strategy — by differentiable
slicing of the original global `Parameter`, so optimizers, checkpoints and
`load_param_into_net` work unchanged — runs the model on DTensors, and returns global tensors.
"""
from __future__ import annotations

import math
import time
from typing import Any, Optional

import mindspore as ms
from mindspore import Tensor, nn

from mindspore_hyper.context import get_context
from mindspore_hyper.shard.resolve import StrategyTable, resolve_strategy
from mindspore_hyper.sim import dispatch, shard_hints
from mindspore_hyper.sim.accounting import Accounting, use_accounting
from mindspore_hyper.sim.dtensor import DTensor, distribute_tensor
from mindspore_hyper.sim.report import SimulationReport

__all__ = ["simulate", "SimulatedModel"]


class SimulatedModel(nn.Cell):
    """A model running on a simulated mesh (see module docstring).

    Attributes:
        network: the wrapped model (its Parameters are the global ones).
        table: the resolved per-parameter StrategyTable.
        accounting: live counters of the last step (memory, collectives, fallbacks).
    """

    def __init__(self, network: nn.Cell, table: StrategyTable, return_dtensor: bool = False):
        super().__init__(auto_prefix=False)
        self.network = network
        self.table = table
        self.mesh = table.mesh
        self.strategy = table.strategy
        self.return_dtensor = return_dtensor
        self.accounting = Accounting(self.mesh.size)
        self.last_step_seconds = 0.0
        self._params = {name: p for name, p in network.parameters_and_names()}
        self._layouts = {id(self._params[row.name]): (self._params[row.name], row.layout) for row in table}
        self._rows = {id(self._params[row.name]): row for row in table}

    def construct(self, *inputs):
        start = time.perf_counter()
        self.accounting.reset_step()
        dispatch.parameter_layouts.update(self._layouts)
        try:
            with use_accounting(self.accounting):
                args = [self._distribute_input(x) for x in inputs]
                outputs = self.network(*args)
                result = self._collect(outputs)
        finally:
            for key in self._layouts:
                dispatch.parameter_layouts.pop(key, None)
                dispatch.parameter_dtensors.pop(key, None)
        self._record_gradient_sync()
        self.accounting.steps += 1
        self.last_step_seconds = time.perf_counter() - start
        return result

    def _record_gradient_sync(self) -> None:
        """Gradients of parameters used replicated along some axes are summed over them once per
        step: an AllReduce, or with ZeRO-1 a ReduceScatter to the optimizer shard plus an
        AllGather of the updated parameter shard."""
        for pid, fanout in self.accounting.param_fanout.items():
            row = self._rows[pid]
            n = math.prod(self.mesh.device_matrix[a] for a in fanout)
            name = "+".join(self.mesh.alias_names[a] for a in sorted(fanout))
            nbytes = row.param_bytes
            zero = set(row.optimizer_layout.sharded_axes()) - set(row.layout.sharded_axes())
            if zero & fanout:
                self.accounting.record_comm("ReduceScatter", name, nbytes * (n - 1) // n, nbytes, backward=True)
                self.accounting.record_comm("AllGather", name, nbytes * (n - 1) // n, nbytes // n, backward=True)
            else:
                self.accounting.record_comm("AllReduce", name, 2 * nbytes * (n - 1) // n, nbytes, backward=True)

    def _distribute_input(self, x: Any):
        if isinstance(x, DTensor) or not isinstance(x, Tensor):
            return x
        layout, notes = self.strategy.input_layout(tuple(x.shape))
        if notes:
            raise ValueError(f"input of shape {tuple(x.shape)} cannot be split as declared: {'; '.join(notes)}")
        return distribute_tensor(x, layout)

    def _collect(self, outputs):
        if isinstance(outputs, (tuple, list)):
            return type(outputs)(self._collect(o) for o in outputs)
        if isinstance(outputs, DTensor) and not self.return_dtensor:
            return outputs.full_tensor()
        return outputs

    def report(self, optimizer: Optional[nn.Optimizer] = None) -> SimulationReport:
        """Per-device memory and communication of the last step (see SimulationReport)."""
        return SimulationReport.build(self, optimizer)


def simulate(model: nn.Cell, strategy, return_dtensor: bool = False, optimizer_states: int = 2) -> SimulatedModel:
    """Wrap `model` to run on the simulated mesh of `strategy`.

    Args:
        model: any nn.Cell.
        strategy: a Strategy, ParallelConfig, or YAML path / mapping.
        return_dtensor: return DTensors instead of global tensors.
        optimizer_states: optimizer states per parameter assumed by the memory report when no
            optimizer is given to `report()` (2 = Adam).

    Returns:
        The SimulatedModel.

    Raises:
        ValueError: the mesh does not match `device_num`, a parameter cannot be laid out, a
            strategy names unknown parameters, or a `.shard()` strategy does not fit the mesh.
    """
    if ms.get_context("mode") != ms.PYNATIVE_MODE:
        raise ValueError("simulation mode runs op by op: call mindspore.set_context(mode=mindspore.PYNATIVE_MODE) "
                         "(GRAPH_MODE compiles the whole network and bypasses the simulated devices)")
    table = resolve_strategy(model, strategy, optimizer_states=optimizer_states)
    device_num = get_context("device_num")
    if table.mesh.size != device_num:
        raise ValueError(
            f"the strategy's mesh {table.mesh.device_matrix} has {table.mesh.size} devices but "
            f"device_num={device_num}; call set_context(device_num={table.mesh.size}) or change the mesh"
        )
    for row in table:
        row.layout.check_shape(row.global_shape)
    shard_hints.install_hints(model, table.mesh)
    return SimulatedModel(model, table, return_dtensor=return_dtensor)
