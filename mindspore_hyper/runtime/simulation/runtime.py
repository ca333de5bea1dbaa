"""The simulation runtime: every virtual device of the mesh in this one process."""
from __future__ import annotations

from typing import Tuple

import mindspore as ms
from mindspore import nn

from mindspore_hyper.context import get_context
from mindspore_hyper.dtensor.execution import ParameterSlot, in_process_collectives
from mindspore_hyper.runtime.base import OpByOpRuntime
from mindspore_hyper.runtime.simulation.simulated_model import SimulatedModel
from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.strategy.resolve import resolve_strategy

__all__ = ["SimulationRuntime", "simulate"]


def zero_axes(row) -> Tuple[int, ...]:
    """Mesh axes a parameter's optimizer states are split over beyond the parameter (ZeRO-1)."""
    return tuple(sorted(set(row.optimizer_layout.sharded_axes()) - set(row.layout.sharded_axes())))


class SimulationRuntime(OpByOpRuntime):
    """N virtual devices in one process; collectives by the `sim_collectives` flag."""

    name = "simulation"

    def local_ranks(self, mesh: Layout) -> Tuple[int, ...]:
        return tuple(mesh.ranks)

    def make_collectives(self, mesh: Layout):
        return in_process_collectives(get_context("sim_collectives"))

    def materialize(self, network, param, row) -> ParameterSlot:
        """The global Parameter stays as is; each op slices what it reads (differentiably)."""
        return ParameterSlot(param, row.layout, row.global_shape, zero_axes(row), local=False)

    def device_count(self) -> int:
        return get_context("device_num")

    def holds_all_ranks(self) -> bool:
        return True

    def device_count_text(self, count: int) -> str:
        return f"device_num={count}"

    def device_count_hint(self, mesh_size: int) -> str:
        return f"call set_context(device_num={mesh_size}) or change the mesh"

    def check_op_by_op(self, what: str = None) -> None:
        super().check_op_by_op(what)
        if get_context("sim_synchronize"):
            # MindSpore's asynchronous launch pipeline costs more than the simulation's many small
            # kernels (docs/benchmarks.md, "Simulation at scale"); best set before the first kernel.
            # launch_blocking is MindSpore 2.10's replacement of set_context(pynative_synchronize=True).
            ms.runtime.launch_blocking()

    def wrap(self, model, table, return_dtensor: bool):
        """A `SimulatedModel` (see `simulate`)."""
        return SimulatedModel(model, table, self, return_dtensor=return_dtensor)


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
            strategy names unknown parameters, a `.shard()` strategy does not fit the mesh, or
            the strategy declares device groups (an MPMD program: `auto_parallelize` builds it).
            A config's `pipeline: N` runs as one SPMD program here (as with `pipeline=False`).
    """
    table = resolve_strategy(model, strategy, optimizer_states=optimizer_states)
    if table.groups:
        raise ValueError("simulate: the strategy declares device groups, which run as separate programs (HyperMPMD); "
                         "use mindspore_hyper.auto_parallelize(model, config, mode='simulation')")
    return SimulationRuntime().parallelize(model, table, return_dtensor)
