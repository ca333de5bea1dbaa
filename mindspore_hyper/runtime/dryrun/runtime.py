"""The dry-run runtime: the model's own code on N devices, shapes only.

Every op runs on shape-only shards (`dtensor.meta.MetaTensor`): its output shapes come from the
shape rules, its layouts and collectives from the same sharding rules and redistribution planner
as the simulation, so per-device bytes (parameters, gradients, optimizer states, live
activations) and collectives are the simulation's, without a value or a weight ever being
computed. One representative device (rank 0) runs: every device of an SPMD program runs the same
shapes, so 2048 devices cost what one does.
"""
from __future__ import annotations

from typing import Tuple

from mindspore import nn

from mindspore_hyper.context import get_context
from mindspore_hyper.dtensor.execution import Execution, ParameterSlot
from mindspore_hyper.runtime.base import OpByOpRuntime
from mindspore_hyper.runtime.dryrun.collectives import DryRunCollectives
from mindspore_hyper.runtime.dryrun.shape_grad import shape_grad
from mindspore_hyper.runtime.simulation.runtime import zero_axes
from mindspore_hyper.shard.layout import Layout

__all__ = ["DryRunRuntime"]


class DryRunRuntime(OpByOpRuntime):
    """N devices, one representative computed, no values (see module docstring)."""

    name = "dryrun"

    def local_ranks(self, mesh: Layout) -> Tuple[int, ...]:
        return (0,)

    def make_collectives(self, mesh: Layout):
        return DryRunCollectives()

    def execution(self, mesh: Layout, accounting=None, parameter_fan_out=None) -> Execution:
        """A shape-only Execution: batched runs off (one shard per op), every shard a MetaTensor."""
        execution = super().execution(mesh, accounting, parameter_fan_out)
        execution.shape_only = True
        execution.batch_shards = False
        return execution

    def materialize(self, network: nn.Cell, param, row) -> ParameterSlot:
        """The Parameter stays as the script made it (never read: a model built under MindSpore's
        `no_init_parameters()` is never initialised); each op reads its shard's shape."""
        return ParameterSlot(param, row.layout, row.global_shape, zero_axes(row), local=False)

    def device_count(self) -> int:
        return get_context("device_num")

    def holds_all_ranks(self) -> bool:
        return True  # no value differs per rank: there are none

    def device_count_text(self, count: int) -> str:
        return f"device_num={count}"

    def device_count_hint(self, mesh_size: int) -> str:
        return f"call set_context(device_num={mesh_size}) or change the mesh"

    def computes_values(self) -> bool:
        return False

    def grad(self, fn, grad_position=0, weights=None):
        """A shape-only `mindspore.grad` (`shape_grad`)."""
        return shape_grad(fn, grad_position, weights)

    def check_composition(self, kind: str) -> None:
        """Pipeline stages run (each stage a dry-run model, the backward a recorded recompute);
        device groups (MPMD) are not dry-run yet (their groups exchange values).

        Raises:
            ValueError: for device groups, naming them and the ways around it.
        """
        if kind == "pipeline stages":
            return
        raise ValueError(f"dry run: {kind} are not modelled by the dry run yet; dry-run one group's model on its own "
                         "mesh, or run the job in simulation at a size this machine holds")

    def wrap(self, model, table, return_dtensor: bool):
        """A `DryRunModel`."""
        from mindspore_hyper.runtime.dryrun.dry_run_model import DryRunModel

        return DryRunModel(model, table, self, return_dtensor=return_dtensor)
