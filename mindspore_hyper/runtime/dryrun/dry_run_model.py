"""`DryRunModel`: a ParallelModel whose steps compute shapes and bytes, never values.

`train_step` runs the forward on shape-only shards (activations held as in a training step),
records the backward's collectives as each forward one is planned (`DryRunCollectives`) and the
data-parallel gradient sums as parameters are read, and skips the optimizer update (there are no
gradients to apply). `report()` has a row for every device of the mesh.
"""
from __future__ import annotations

from typing import Set, Tuple

from mindspore import Tensor, nn

from mindspore_hyper.comm.collectives import AxisGroup
from mindspore_hyper.dtensor.meta import MetaTensor
from mindspore_hyper.runtime.dryrun.collectives import as_meta
from mindspore_hyper.runtime.model import ParallelModel
from mindspore_hyper.runtime.simulation.model import record_gradient_sync, zero_along

__all__ = ["DryRunModel"]


class DryRunModel(ParallelModel):
    """A model dry-run on its mesh (see module docstring and ParallelModel)."""

    def __init__(self, network: nn.Cell, table, runtime, return_dtensor: bool = False):
        super().__init__(network, table, runtime, return_dtensor)
        self._synced: Set[Tuple[int, str]] = set()
        self._training = False
        for _, cell in network.cells_and_names():
            # a Cell initialises its lazily created Parameters (no_init_parameters) when first
            # called; the dry run reads only their shapes, so none is ever initialised
            object.__setattr__(cell, "_init_flag", True)

    @property
    def local_ranks(self) -> Tuple[int, ...]:
        """Every device of the mesh: each runs the representative's shapes."""
        return tuple(self.mesh.ranks)

    def begin_step(self) -> None:
        self._synced.clear()

    def records_gradients(self) -> bool:
        return self._training

    def _parameter_fan_out(self, shard: Tensor, group: AxisGroup, slot):
        """Record the parameter's data-parallel gradient sum over `group` once per step (the
        simulation records it when the gradient arrives: every parameter a training forward
        reads gets one)."""
        out = as_meta(shard)
        pid = id(slot.param)
        if (self._training and group.records and group.size > 1 and out.grad_path
                and (pid, group.axis) not in self._synced):
            self._synced.add((pid, group.axis))
            record_gradient_sync(self.accounting, self.rows[pid].param_bytes, group,
                                 zero_along(self.mesh, slot, group))
        return out

    def train_step(self, optimizer: nn.Optimizer, *inputs, **options) -> MetaTensor:
        """The step's forward on shapes, its backward's collectives and gradient sums recorded;
        no update (see module docstring). Returns the loss (shape and dtype only).

        Raises:
            ValueError: `options` the dry run does not model (named), an optimizer not built on
                `optimizer_parameters()`, a model that does not return a scalar loss.
        """
        if options:
            raise ValueError(f"dry run: train_step option(s) {sorted(options)} are not modelled by the dry run yet; "
                             "run without them (the memory and communication of the plain step are reported)")
        self.check_optimizer(optimizer, "train_step")
        self._training, self._needs_loss = True, True
        try:
            return self(*inputs)
        finally:
            self._training, self._needs_loss = False, False
