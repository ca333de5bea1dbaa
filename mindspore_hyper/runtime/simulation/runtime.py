"""The simulation runtime: every virtual device of the mesh in this one process."""
from __future__ import annotations

from typing import Tuple

import mindspore as ms

from mindspore_hyper.context import get_context
from mindspore_hyper.dtensor.execution import ParameterSlot, in_process_collectives
from mindspore_hyper.runtime.base import Runtime, register_runtime
from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.strategy.resolve import resolve_strategy

__all__ = ["SimulationRuntime"]


def zero_axes(row) -> Tuple[int, ...]:
    """Mesh axes a parameter's optimizer states are split over beyond the parameter (ZeRO-1)."""
    return tuple(sorted(set(row.optimizer_layout.sharded_axes()) - set(row.layout.sharded_axes())))


@register_runtime
class SimulationRuntime(Runtime):
    """N virtual devices in one process; collectives by the `sim_collectives` flag."""

    name = "simulation"

    def local_ranks(self, mesh: Layout) -> Tuple[int, ...]:
        return tuple(mesh.ranks)

    def make_collectives(self, mesh: Layout):
        return in_process_collectives(get_context("sim_collectives"))

    def materialize(self, network, param, row) -> ParameterSlot:
        """The global Parameter stays as is; each op slices what it reads (differentiably)."""
        return ParameterSlot(param, row.layout, row.global_shape, zero_axes(row), local=False)

    def parallelize(self, model, strategy_or_config, return_dtensor: bool = False, optimizer_states: int = 2,
                    group_strategies=None):
        """`simulate(...)`: see mindspore_hyper.runtime.simulation.model.simulate. A config with
        device groups (hyper_mpmd on) gives an `MPMDModel`; `group_strategies` (group name ->
        Strategy) replaces a group's default data-parallel strategy."""
        from mindspore_hyper.runtime.simulation.model import SimulatedModel

        if ms.get_context("mode") != ms.PYNATIVE_MODE:
            raise ValueError("simulation mode runs op by op: call mindspore.set_context(mode=mindspore.PYNATIVE_MODE) "
                             "(GRAPH_MODE compiles the whole network and bypasses the simulated devices)")
        if get_context("sim_synchronize"):
            # MindSpore's asynchronous launch pipeline costs more than the simulation's many small
            # kernels (docs/benchmarks.md, "Simulation at scale"); best set before the first kernel.
            # launch_blocking is MindSpore 2.10's replacement of set_context(pynative_synchronize=True).
            ms.runtime.launch_blocking()
        table = resolve_strategy(model, strategy_or_config, optimizer_states=optimizer_states)
        device_num = get_context("device_num")
        if table.mesh.size != device_num:
            raise ValueError(
                f"the strategy's mesh {table.mesh.device_matrix} has {table.mesh.size} devices but "
                f"device_num={device_num}; call set_context(device_num={table.mesh.size}) or change the mesh"
            )
        if table.groups:
            from mindspore_hyper.runtime.mpmd import MPMDModel, check_mpmd_enabled

            check_mpmd_enabled(table.groups)
            if return_dtensor:
                raise ValueError("return_dtensor=True: an MPMD model returns global tensors (each group has its own "
                                 "mesh); drop return_dtensor")
            return MPMDModel(model, table.config, self, group_strategies, optimizer_states=optimizer_states)
        if group_strategies:
            raise ValueError("group_strategies: the strategy declares no device groups (process_groups or "
                             "strategy: mpmd entries)")
        for row in table:
            row.layout.check_shape(row.global_shape)
        return SimulatedModel(model, table, self, return_dtensor=return_dtensor)
