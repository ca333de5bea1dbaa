"""ParallelModel: an unmodified nn.Cell run on DTensors by a runtime (simulation or msrun).

The wrapper takes the model's inputs, splits them by the strategy's input layout (batch along
the data axis), lays every parameter out by the resolved strategy (what each process holds is
the runtime's `materialize`), runs the model on DTensors and returns global tensors.
"""
from __future__ import annotations

import contextlib
import itertools
import time
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from mindspore import Parameter, Tensor, nn
from mindspore.graph.api import _pynative_executor

from mindspore_hyper.autodiff import value_and_grad
from mindspore_hyper.comm.collective_cause import CLIP_NORM_CAUSE, GRAD_NORM_CAUSE, set_cause
from mindspore_hyper.comm.collectives import AxisGroup
from mindspore_hyper.dtensor import shard_hints
from mindspore_hyper.dtensor.accounting import Accounting
from mindspore_hyper.dtensor.dispatch import distribute, parameter_dtensor
from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.runtime import loss_scale as scaling
from mindspore_hyper.runtime.accumulation import check_accumulation_steps, split_batch
from mindspore_hyper.runtime.grad_clip import check_max_norm, grad_norm
from mindspore_hyper.runtime.gradient_sync import GradientSync
from mindspore_hyper.runtime.guarded_update import guarded_update
from mindspore_hyper.runtime.optimizer_check import check_optimizer, optimizer_gradients
from mindspore_hyper.strategy.resolve import ParamRow, StrategyTable

__all__ = ["ParallelModel", "check_loss", "live_models", "keeping_models", "register_model"]

_LIVE: "weakref.WeakSet" = weakref.WeakSet()
_SERIAL = itertools.count()


_KEPT: List[List["ParallelModel"]] = []  # while `keeping_models` runs: every model made, held alive


def live_models() -> List["ParallelModel"]:
    """The ParallelModels (and registered compositions of them) of this process still alive (or
    kept), oldest first (what a run's report lists)."""
    kept = {id(m): m for block in _KEPT for m in block}
    kept.update({id(m): m for m in _LIVE})
    return sorted(kept.values(), key=lambda m: m._serial)


def register_model(model) -> None:
    """List `model` (a ParallelModel, or a composition of them such as a PipelineModel) among the
    live models a run's report covers."""
    model._serial = next(_SERIAL)
    _LIVE.add(model)
    for block in _KEPT:
        block.append(model)


@contextlib.contextmanager
def keeping_models() -> Iterator[List["ParallelModel"]]:
    """Inside the block every ParallelModel made stays alive until the block ends (a script's
    models outlive its `main()` for the run's report)."""
    block: List["ParallelModel"] = []
    _KEPT.append(block)
    try:
        yield block
    finally:
        _KEPT.remove(block)


def check_loss(output, where: str = "train_step") -> None:
    """Refuse a model output that is not a scalar loss (a training step would otherwise train
    on the sum of the outputs).

    Raises:
        ValueError: naming what the model returned and how to wrap it with a loss.
    """
    fix = ("train_step needs the model to return the loss: wrap the network with its loss before "
           "auto_parallelize, e.g. nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, "
           "reduction='mean')), or a Cell whose construct returns loss_fn(net(x), labels)")
    if isinstance(output, (tuple, list)):
        raise ValueError(f"{where}: the model returned {len(output)} outputs ({type(output).__name__}); {fix}")
    if not isinstance(output, Tensor):
        raise ValueError(f"{where}: the model returned a {type(output).__name__}, not a Tensor; {fix}")
    if output.size != 1:
        raise ValueError(f"{where}: the model returned a tensor of shape {tuple(output.shape)}, not a scalar loss; {fix}")


class ParallelModel(nn.Cell):
    """A model running on DTensors under `runtime` (see module docstring).

    Attributes:
        network: the wrapped model.
        table: the resolved per-parameter StrategyTable.
        runtime: the Runtime that holds the ranks and moves the data.
        execution: this model's run state (held ranks, collectives, parameter layouts).
        accounting: live counters of the last step (memory, collectives, fallbacks).
        offload: the offload of this model's units (`hyper_offload` sets it, its `remove` clears
            it; duck-typed: `report_section(ranks)`), whose figures `report()` shows; else None.
    """

    offload = None

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
        self.last_grad_norm: Optional[float] = None  # global gradient norm of the last train_step / clip_grad_norm
        self.last_step_skipped = False  # the last train_step's update was skipped (loss scaling overflow)
        self._needs_loss = False  # set by train_step: the forward must return a scalar loss
        self._loss_factor = None  # set by train_step under loss scaling: the forward returns loss * factor
        self._micro_batch = 0  # index of the micro-batch running (gradient accumulation)
        self._last_micro_batch = True  # the running micro-batch is the step's last
        self._accumulation_steps = 1  # micro-batches of the running step
        self.execution = runtime.execution(self.mesh, self.accounting, self._parameter_fan_out)
        self.gradient_sync = GradientSync(self.accounting, self.execution.collectives)
        register_model(self)
        self.execution.context_parallel = self.strategy.context
        if self.strategy.context is not None:
            from mindspore_hyper.dtensor.context_parallel import expression, multihead

            self.execution.context_attention = expression.intercept
            multihead.install(network)
        named = dict(network.parameters_and_names())
        self.rows: Dict[int, ParamRow] = {}
        for row in table:
            slot = runtime.materialize(network, named[row.name], row)
            self.execution.parameters[id(slot.param)] = slot
            self.rows[id(slot.param)] = row
        shard_hints.install_hints(network, self.execution)

    def parameters_and_names(self, name_prefix: str = "", expand: bool = True):
        """The wrapped network's parameters under their own names (so checkpoints of the wrapper
        load into the plain model and vice versa)."""
        return self.network.parameters_and_names(name_prefix, expand)

    @property
    def local_ranks(self) -> Tuple[int, ...]:
        """The mesh ranks this process holds."""
        return self.execution.local_ranks

    def held_region(self, name: str, optimizer: bool = False) -> Tuple[slice, ...]:
        """The region of parameter `name`'s global tensor that this process's Parameter holds
        (all of it in simulation, the shard under msrun); optimizer=True: the region of the
        Parameter its optimizer updates (`optimizer_parameters()`), which ZeRO-1 may cut further."""
        row = self.table[name]
        slot = next(self.execution.parameters[pid] for pid, r in self.rows.items() if r is row)
        if not slot.local:
            return tuple(slice(0, n) for n in row.global_shape)
        return row.layout.rank_slices(self.local_ranks[0], row.global_shape)

    def after_parameters_set(self) -> None:
        """Called after the Parameters' data were replaced from outside (a checkpoint load):
        runtimes refresh what they derived from them here."""

    def construct(self, *inputs):
        start = time.perf_counter()
        if self._micro_batch == 0:
            self.accounting.reset_step()
            self.begin_step()
        else:  # a later micro-batch of one step: its counters go on; the last one's activations are freed
            self.accounting.release_held()
        injected = self._parameters_as_dtensors()
        self.execution.holds_activations = self.records_gradients()
        self.last_forward_recorded_gradients = self.execution.holds_activations  # a backward follows (report)
        try:
            args = [self._distribute_input(x) for x in inputs]
            outputs = self.network(*args)
            result = self._collect(outputs)
            if self._needs_loss:  # inside train_step: refused before any backward runs
                check_loss(result, "train_step")
            if self._loss_factor is not None:
                result = result * self._loss_factor
        finally:
            for cell, name in injected:
                del cell.__dict__[name]
            self.execution.parameter_dtensors.clear()
            self.execution.holds_activations = False
        self.accounting.steps += 1
        self.last_step_seconds = time.perf_counter() - start
        return result

    def begin_step(self) -> None:
        """Called at the start of each forward, except a step's later micro-batches (per-step state
        is reset here: the gradient sync records every parameter's sum again)."""
        self.gradient_sync.begin_step()

    def records_gradients(self) -> bool:
        """Whether this forward is a training step's (its activations are held for the backward)."""
        return _pynative_executor.requires_grad()

    def _parameters_as_dtensors(self) -> List[Tuple[nn.Cell, str]]:
        """For this forward, `cell.<name>` of every model Parameter reads its DTensor (an
        instance attribute shadows the Cell's parameter table), so ops that touch only
        Parameters and plain tensors (e.g. a position-embedding lookup) run sharded too."""
        injected = []
        for _, cell in self.network.cells_and_names():
            for name, param in cell._params.items():
                if param is not None and id(param) in self.execution.parameters and name not in cell.__dict__:
                    cell.__dict__[name] = parameter_dtensor(self.execution, param)
                    injected.append((cell, name))
        return injected

    # -- training --------------------------------------------------------------------------------
    def optimizer_parameters(self) -> List[Parameter]:
        """The Parameters an optimizer of this model must update (build it on these): the
        network's trainable parameters; under msrun with ZeRO-1, this process's slices of them."""
        return list(self.network.trainable_params())

    def check_optimizer(self, optimizer: nn.Optimizer, where: str = "train_step") -> None:
        """Refuse an optimizer that does not update what this mode needs: built on the model's
        full parameters where ZeRO-1 (`optimizer_state=`) gives each process only a slice of them
        (its states would stay full size), or (train_step) holding Parameters that are not the
        model's; `report` takes an optimizer of a larger model (a pipeline's, over every stage)
        but not one that updates none of this model's Parameters.
        Called by `train_step` and `report` each time (a set of ids: cheap).

        Raises:
            ValueError: naming the parameter, both shapes and the fix (build the optimizer on
                `optimizer_parameters()`).
        """
        check_optimizer(optimizer, list(self.network.trainable_params()), self.optimizer_parameters(),
                        self.strategy.optimizer_state, where)

    def train_step(self, optimizer: nn.Optimizer, *inputs, max_grad_norm: Optional[float] = None,
                   accumulation_steps: int = 1, loss_scale=None) -> Tensor:
        """One training step: forward (the model returns the loss), backward, gradient
        synchronisation, optimizer update. Same call in every mode. Sets `last_grad_norm` (the
        global gradient norm before clipping, every element counted once) and
        `last_step_skipped`.

        Args:
            optimizer: an optimizer built on `optimizer_parameters()`.
            *inputs: the model's inputs (global batch; each device takes its part).
            max_grad_norm: clip the gradients to this global norm (`clip_grad_norm`), or None.
            accumulation_steps: cut the batch (dim 0 of every input) into this many
                micro-batches, run forward and backward on each, average their gradients (the
                mean loss of the whole batch), synchronise them once, update once.
            loss_scale: None, a number >= 1 or a `mindspore.amp` loss scaler: the loss is scaled
                before the backward and the gradients unscaled; the update is skipped (on every
                process) when a gradient is not finite, and the scaler adjusted.

        Returns:
            The loss (unscaled; with accumulation, the mean over the micro-batches).

        Raises:
            ValueError: the optimizer is not built on `optimizer_parameters()` (see
                `check_optimizer`); the model returns something else than a scalar loss (before
                any backward or update runs); a bad `max_grad_norm`, `accumulation_steps` or
                `loss_scale`; an input's batch not divisible by `accumulation_steps`.
        """
        self.check_optimizer(optimizer, "train_step")
        if max_grad_norm is not None:
            max_grad_norm = check_max_norm(max_grad_norm, "max_grad_norm")
        scaler = scaling.as_loss_scaler(loss_scale)
        factor = scaling.scale_value(scaler) if scaler is not None else None
        self._needs_loss, self._loss_factor = True, factor
        try:
            loss, grads = self.compute_gradients(*inputs, accumulation_steps=accumulation_steps)
        finally:
            self._needs_loss, self._loss_factor = False, None
        if factor is not None:
            loss = loss / factor
            grads = [scaling.unscale(g, factor) for g in grads]
            self._keep_gradients(grads)
        norm = grad_norm(self, [self.last_gradients[self.rows[id(w)].name] for w in self._grad_weights],
                         GRAD_NORM_CAUSE if max_grad_norm is None else CLIP_NORM_CAUSE)
        if guarded_update(self, grads, norm, scaler, max_grad_norm,
                          lambda g: optimizer(self.optimizer_gradients(optimizer, self._grad_weights, g))):
            self.after_update()
        return loss

    def compute_gradients(self, *inputs, accumulation_steps: int = 1):
        """(loss, gradients of the network's trainable parameters, synchronised); also keeps
        them by parameter name in `last_gradients` (numpy arrays of what this process holds:
        the global gradient in simulation; under msrun the shard's, or with ZeRO-1 the
        optimizer slice's). With `accumulation_steps=k`, the mean loss and gradients of k
        micro-batches (see `train_step`), synchronised once."""
        steps = check_accumulation_steps(accumulation_steps)
        micro_batches = split_batch(inputs, steps)
        weights = tuple(self.network.trainable_params())
        if getattr(self, "_grad_fn", None) is None or self._grad_weights != weights:
            self._grad_fn = value_and_grad(self, None, weights)
            self._grad_weights = weights
        total_loss, total = None, None
        self._accumulation_steps = steps
        try:
            for index, batch in enumerate(micro_batches):
                self._micro_batch = index
                self._last_micro_batch = index == steps - 1
                loss, grads = self.backward_micro_batch(*batch)
                total_loss = loss if total_loss is None else total_loss + loss
                total = list(grads) if total is None else [a + g for a, g in zip(total, grads)]
        finally:
            self._micro_batch, self._last_micro_batch, self._accumulation_steps = 0, True, 1
        grads = self.synchronise_gradients(self._grad_weights, total)
        if steps > 1:
            total_loss = total_loss / steps
            grads = [g / steps for g in grads]
        self._keep_gradients(grads)
        return total_loss, tuple(grads)

    def backward_micro_batch(self, *inputs):
        """(loss, gradients) of one (micro-)batch, before the data-parallel synchronisation that
        `synchronise_gradients` finishes (in simulation, autograd already summed them)."""
        return self._grad_fn(*inputs)

    def synchronise_gradients(self, weights: Sequence[Parameter], grads) -> list:
        """The gradients after the step's data-parallel synchronisation (runs once per step)."""
        return list(grads)

    def reduce_over_processes(self, value: float, cause: str = "") -> float:
        """Sum of a float over the model's mesh: one float64 AllReduce through the model's
        `GradientSync` over every mesh axis, recorded under `cause` ("" : unrecorded). Each
        process passes its share (in simulation the one process's value is the sum already).

        Args:
            value: this process's share.
            cause: the report's cause of the AllReduce (`collective_cause`), or "".

        Returns:
            The sum, the same on every process.
        """
        ranks = tuple(range(self.mesh.size))
        group = AxisGroup("+".join(self.mesh.alias_names), ranks, tuple(ranks.index(r) for r in self.local_ranks))
        return self.gradient_sync.sum_scalar(value, group, cause)

    def _keep_gradients(self, grads) -> None:
        self.last_gradients = {self.rows[id(w)].name: g.asnumpy() for w, g in zip(self._grad_weights, grads)}

    def optimizer_gradients(self, optimizer: nn.Optimizer, weights: Sequence[Parameter], grads) -> tuple:
        """The gradients in the order of `optimizer.parameters` (see `optimizer_check.optimizer_gradients`)."""
        return optimizer_gradients(optimizer, {id(self.updated_parameter(w)): g for w, g in zip(weights, grads)})

    def updated_parameter(self, param: Parameter) -> Parameter:
        """The Parameter the optimizer updates for model parameter `param` (itself here)."""
        return param

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
            why = self.strategy.input_split_error(tuple(x.shape)) or "; ".join(notes)
            where = (f" (a micro-batch: the global batch cut into accumulation_steps={self._accumulation_steps})"
                     if self._accumulation_steps > 1 else "")
            raise ValueError(f"input of shape {tuple(x.shape)}{where} cannot be split as declared: {why}")
        return distribute(self.execution, x, layout)

    def _collect(self, outputs):
        if isinstance(outputs, (tuple, list)):
            return type(outputs)(self._collect(o) for o in outputs)
        if isinstance(outputs, DTensor) and not self.return_dtensor:
            previous = set_cause("model output made whole (returned as a global tensor)")
            try:
                return outputs.full_tensor()
            finally:
                set_cause(previous)
        return outputs

    def report(self, optimizer: Optional[nn.Optimizer] = None):
        """Per-device memory and communication of the last step (a StepReport)."""
        from mindspore_hyper.runtime.report import StepReport

        if optimizer is not None:
            self.check_optimizer(optimizer, "report")
        return StepReport.build(self, optimizer)
