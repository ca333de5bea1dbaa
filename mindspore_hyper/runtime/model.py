"""ParallelModel: an unmodified nn.Cell run on DTensors by a runtime (simulation or msrun).

The wrapper takes the model's inputs, splits them by the strategy's input layout (batch along
the data axis), lays every parameter out by the resolved strategy (what each process holds is
the runtime's `materialize`), runs the model on DTensors and returns global tensors.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import mindspore as ms
from mindspore import Parameter, Tensor, nn

from mindspore_hyper.dtensor import shard_hints
from mindspore_hyper.dtensor.accounting import Accounting
from mindspore_hyper.dtensor.dispatch import distribute
from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.strategy.resolve import ParamRow, StrategyTable

__all__ = ["ParallelModel"]


class ParallelModel(nn.Cell):
    """A model running on DTensors under `runtime` (see module docstring).

    Attributes:
        network: the wrapped model.
        table: the resolved per-parameter StrategyTable.
        runtime: the Runtime that holds the ranks and moves the data.
        execution: this model's run state (held ranks, collectives, parameter layouts).
        accounting: live counters of the last step (memory, collectives, fallbacks).
    """

    def __init__(self, network: nn.Cell, table: StrategyTable, runtime, return_dtensor: bool = False):
        super().__init__(auto_prefix=False)
        self.network = network
        self.table = table
        self.mesh = table.mesh
        self.strategy = table.strategy
        self.runtime = runtime
        self.return_dtensor = return_dtensor
        self.accounting = Accounting(self.mesh.size)
        self.last_step_seconds = 0.0
        self.execution = runtime.execution(self.mesh, self.accounting, self._parameter_fan_out)
        named = dict(network.parameters_and_names())
        self.rows: Dict[int, ParamRow] = {}
        for row in table:
            param = named[row.name]
            self.execution.parameters[id(param)] = runtime.materialize(param, row)
            self.rows[id(param)] = row
        self._params_by_id = {id(p): p for p in named.values()}
        shard_hints.install_hints(network, self.execution)

    def parameters_and_names(self, name_prefix: str = "", expand: bool = True):
        """The wrapped network's parameters under their own names (so checkpoints of the wrapper
        load into the plain model and vice versa)."""
        return self.network.parameters_and_names(name_prefix, expand)

    @property
    def local_ranks(self) -> Tuple[int, ...]:
        """The mesh ranks this process holds."""
        return self.execution.local_ranks

    def construct(self, *inputs):
        start = time.perf_counter()
        self.accounting.reset_step()
        self.begin_step()
        try:
            args = [self._distribute_input(x) for x in inputs]
            outputs = self.network(*args)
            result = self._collect(outputs)
        finally:
            self.execution.parameter_dtensors.clear()
        self.accounting.steps += 1
        self.last_step_seconds = time.perf_counter() - start
        return result

    def begin_step(self) -> None:
        """Called at the start of each forward (runtimes reset per-step state here)."""

    # -- training --------------------------------------------------------------------------------
    def optimizer_parameters(self) -> List[Parameter]:
        """The Parameters an optimizer of this model must update (build it on these): the
        network's trainable parameters; under msrun with ZeRO-1, this process's slices of them."""
        return list(self.network.trainable_params())

    def train_step(self, optimizer: nn.Optimizer, *inputs) -> Tensor:
        """One training step: forward (the model returns the loss), backward, gradient
        synchronisation, optimizer update. Same call in every mode.

        Args:
            optimizer: an optimizer built on `optimizer_parameters()`.
            *inputs: the model's inputs (global batch; each device takes its part).

        Returns:
            The loss.
        """
        weights = tuple(self.network.trainable_params())
        if getattr(self, "_grad_fn", None) is None or self._grad_weights != weights:
            self._grad_fn = ms.value_and_grad(self, None, weights)
            self._grad_weights = weights
        loss, grads = self.compute_gradients(*inputs)
        optimizer(self.optimizer_gradients(optimizer, weights, grads))
        self.after_update()
        return loss

    def compute_gradients(self, *inputs):
        """(loss, gradients of the network's trainable parameters, synchronised)."""
        return self._grad_fn(*inputs)

    def optimizer_gradients(self, optimizer: nn.Optimizer, weights: Sequence[Parameter], grads) -> tuple:
        """The gradients in the order of `optimizer.parameters`."""
        by_id = {id(w): g for w, g in zip(weights, grads)}
        try:
            return tuple(by_id[id(p)] for p in optimizer.parameters)
        except KeyError:
            raise ValueError("train_step: the optimizer updates Parameters that are not the model's "
                             "optimizer_parameters(); build it as nn.Adam(model.optimizer_parameters(), ...)") from None

    def after_update(self) -> None:
        """Called after the optimizer step (runtimes bring sliced updates back here)."""

    def _parameter_fan_out(self, shard: Tensor, group, slot):
        """A parameter read by an op sharded over `group`: how its gradient gets summed."""
        return self.execution.collectives.fan_out(shard, group)

    def _distribute_input(self, x: Any):
        if isinstance(x, DTensor) or not isinstance(x, Tensor) or isinstance(x, Parameter):
            return x
        layout, notes = self.strategy.input_layout(tuple(x.shape))
        if notes:
            raise ValueError(f"input of shape {tuple(x.shape)} cannot be split as declared: {'; '.join(notes)}")
        return distribute(self.execution, x, layout)

    def _collect(self, outputs):
        if isinstance(outputs, (tuple, list)):
            return type(outputs)(self._collect(o) for o in outputs)
        if isinstance(outputs, DTensor) and not self.return_dtensor:
            return outputs.full_tensor()
        return outputs

    def report(self, optimizer: Optional[nn.Optimizer] = None):
        """Per-device memory and communication of the last step (a StepReport)."""
        from mindspore_hyper.runtime.report import StepReport

        return StepReport.build(self, optimizer)
