"""`DryRunModel`: a ParallelModel whose steps compute shapes and bytes, never values.

`train_step` runs the forward on shape-only shards (activations held as in a training step),
records the backward's collectives as each forward one is planned (`DryRunCollectives`) and the
data-parallel gradient sums as parameters are read, and skips the optimizer update (there are no
gradients to apply). `report()` has a row for every device of the mesh.

The step's options are accounted as the simulation accounts them: `accumulation_steps=k` runs k
micro-batch forwards (each holding its activations until the next starts; the gradients are
counted once) with each parameter's data-parallel sum once per step, and the global gradient
norm's one-scalar all-reduce ("clip grad norm" with `max_grad_norm`, else "grad norm"; there is
no norm value); `loss_scale` is checked and adds nothing.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from mindspore import Tensor, nn

from mindspore_hyper.comm.collective_cause import CLIP_NORM_CAUSE, GRAD_NORM_CAUSE
from mindspore_hyper.comm.collectives import AxisGroup
from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.dtensor.meta import MetaTensor, meta
from mindspore_hyper.runtime import loss_scale as scaling
from mindspore_hyper.runtime.accumulation import check_accumulation_steps, is_batched, micro_batch_rows
from mindspore_hyper.runtime.dryrun.collectives import as_meta
from mindspore_hyper.runtime.dryrun.shape_grad import in_training_forward
from mindspore_hyper.runtime.grad_clip import check_max_norm
from mindspore_hyper.runtime.gradient_sync import zero_along
from mindspore_hyper.runtime.parallel_model import ParallelModel
from mindspore_hyper.runtime.simulation.simulated_model import batch_axes, summed_once_per_step

__all__ = ["DryRunModel"]


def _signature(value):
    """What a shape-only program's behaviour depends on in `value`: shapes, dtypes, layouts,
    gradient paths; scalars themselves."""
    if isinstance(value, DTensor):
        return ("D", tuple(value.shape), str(value.dtype), value.layout, bool(getattr(value.shards.get(
            next(iter(value.shards))), "grad_path", False)) if value.shards else False)
    if isinstance(value, Tensor):
        return ("T", tuple(value.shape), value.dtype, bool(getattr(value, "grad_path", False)))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_signature(v) for v in value))
    return ("V", value)


def _rebuild(signature):
    """Fresh MetaTensors in the structure of an output `signature`."""
    kind = signature[0]
    if kind == "T":
        return meta(signature[1], signature[2], signature[3])
    if kind in ("tuple", "list"):
        items = [_rebuild(s) for s in signature[1]]
        return tuple(items) if kind == "tuple" else items
    if kind == "V":
        return signature[1]
    raise TypeError("dry run: a replayed forward returned a DTensor; return_dtensor=True models run every call")


class DryRunModel(ParallelModel):
    """A model dry-run on its mesh (see module docstring and ParallelModel)."""

    def __init__(self, network: nn.Cell, table, runtime, return_dtensor: bool = False):
        super().__init__(network, table, runtime, return_dtensor)
        self._training = False
        # (training, needs loss, micro-batch, micro-batches, input signature) -> (counters, output)
        self._replays: Dict[tuple, tuple] = {}
        # False: every forward runs the network (hooks on its Cells see every call: a dry-run
        # offload, offload/dry_run_offload.py, counts its units' uses from them)
        self.replay_programs = True
        self._batch_axes = batch_axes(self.strategy)
        collectives = self.execution.collectives
        record = collectives.recorder

        def record_backward(kind: str, axis: str, *sizes) -> None:
            # the backward of a collective happens only in a training step's backward: a forward
            # without recording (a pipeline's, an evaluation) moves no gradient; under gradient
            # accumulation a batch-independent tensor's gradient sum runs once, after the last
            # micro-batch (as the simulation records it)
            if self.records_gradients() and (self._last_micro_batch or not summed_once_per_step(
                    kind, axis, self._batch_axes)):
                record(kind, axis, *sizes)

        collectives.recorder = record_backward
        for cell in [self] + [c for _, c in network.cells_and_names()]:
            # a Cell initialises its lazily created Parameters (no_init_parameters) when first
            # called (this wrapper too: its parameters are the network's); the dry run reads only
            # their shapes, so none is ever initialised
            object.__setattr__(cell, "_init_flag", True)

    @property
    def local_ranks(self) -> Tuple[int, ...]:
        """Every device of the mesh: each runs the representative's shapes."""
        return tuple(self.mesh.ranks)

    def construct(self, *inputs):
        """The forward; a program already run on inputs of the same shapes (another pipeline
        microbatch, a recompute) is replayed from its record: the same counters, fresh outputs of
        the same shapes (shape-only programs are deterministic), so a pipeline's cost grows with
        its distinct stage programs, not with its microbatches."""
        if self.return_dtensor or not self.replay_programs:
            return super().construct(*inputs)
        # the counters after micro-batch i of an accumulated step include the step's earlier ones
        key = (self.records_gradients(), self._needs_loss, self._micro_batch, self._accumulation_steps,
               tuple(_signature(x) for x in inputs))
        if key in self._replays:
            state, out = self._replays[key]
            self.accounting.restore(state)
            self.accounting.steps += 1
            return _rebuild(out)
        result = super().construct(*inputs)
        self._replays[key] = (self.accounting.snapshot(), _signature(result))
        return result

    def records_gradients(self) -> bool:
        return self._training or in_training_forward()

    def _parameter_fan_out(self, shard: Tensor, group: AxisGroup, slot):
        """Record the parameter's data-parallel gradient sum over `group` once per step (the
        simulation records it when the gradient arrives: every parameter a training forward
        reads gets one)."""
        out = as_meta(shard)
        pid = id(slot.param)
        if (self.records_gradients() and group.records and group.size > 1 and out.grad_path
                and self.gradient_sync.claim(pid, group)):
            self.gradient_sync.parameter_sum(self.rows[pid].param_bytes, group, zero_along(self.mesh, slot, group),
                                             slot.param.name)
        return out

    def train_step(self, optimizer: nn.Optimizer, *inputs, max_grad_norm: Optional[float] = None,
                   accumulation_steps: int = 1, loss_scale=None) -> MetaTensor:
        """The step's forward on shapes, its backward's collectives and gradient sums recorded;
        no update (see module docstring). The options are checked as in the simulation and
        accounted as it accounts them: `accumulation_steps=k` runs k micro-batch forwards on
        dim 0 of every batched input cut into k; the global norm's scalar all-reduce is recorded
        (caused "clip grad norm" with `max_grad_norm`, else "grad norm"); `loss_scale` adds no
        row (its scaler is not adjusted: a dry run has no gradient to test for overflow, and
        `last_grad_norm` stays None).

        Returns:
            The loss (shape and dtype only; the last micro-batch's).

        Raises:
            ValueError: an optimizer not built on `optimizer_parameters()`, a model that does not
                return a scalar loss, a bad `max_grad_norm`, `accumulation_steps` or `loss_scale`,
                an input's batch not divisible by `accumulation_steps`.
        """
        self.check_optimizer(optimizer, "train_step")
        if max_grad_norm is not None:
            check_max_norm(max_grad_norm, "max_grad_norm")
        scaling.as_loss_scaler(loss_scale)
        steps = check_accumulation_steps(accumulation_steps)
        micro_batch = tuple(meta((micro_batch_rows(i, x, steps),) + tuple(x.shape[1:]), x.dtype)
                            if steps > 1 and is_batched(i, x, steps) else x for i, x in enumerate(inputs))
        self._training, self._needs_loss, self._accumulation_steps = True, True, steps
        self.last_grad_norm, self.last_step_skipped = None, False
        try:
            for index in range(steps):
                self._micro_batch, self._last_micro_batch = index, index == steps - 1
                loss = self(*micro_batch)
            # the global norm's scalar all-reduce, recorded as the simulation records it (no value moves)
            self.reduce_over_processes(0.0, GRAD_NORM_CAUSE if max_grad_norm is None else CLIP_NORM_CAUSE)
            return loss
        finally:
            self._training, self._needs_loss = False, False
            self._micro_batch, self._last_micro_batch, self._accumulation_steps = 0, True, 1
