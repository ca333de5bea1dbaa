"""The runtime protocol: what an execution mode must answer to run a strategy.

Every mode (simulation, distributed, native) implements one `Runtime`:
- which mesh ranks this process holds (`local_ranks`),
- its collectives backend (`make_collectives`),
- how a parameter's region is materialised in this process (`materialize`),
- how the SPMD program of a resolved strategy is wrapped (`parallelize`).
`OpByOpRuntime` holds what the simulation and distributed modes share (the checks every program
passes); they answer only their device count and their model class. `auto_parallelize` resolves
the strategy once, picks the program's builder (SPMD, pipeline, MPMD groups) and the mode's
runtime (`RUNTIMES` in parallelize.py); DTensor code reaches the answers through the `Execution` a
runtime builds for each wrapped model.
"""
from __future__ import annotations

import abc
from typing import ClassVar, Tuple

from mindspore_hyper.comm.collectives import Collectives
from mindspore_hyper.dtensor.execution import Execution, ParameterSlot
from mindspore_hyper.shard.layout import Layout

__all__ = ["Runtime", "OpByOpRuntime"]


class Runtime(abc.ABC):
    """One execution mode (see module docstring)."""

    name: ClassVar[str]

    @abc.abstractmethod
    def local_ranks(self, mesh: Layout) -> Tuple[int, ...]:
        """The mesh ranks whose shards this process holds and computes."""

    @abc.abstractmethod
    def make_collectives(self, mesh: Layout) -> Collectives:
        """The collectives backend moving data between this mesh's ranks."""

    @abc.abstractmethod
    def materialize(self, network, param, row) -> ParameterSlot:
        """What this process holds of `param` (of `network`) under `row` (a resolved ParamRow);
        the slot's Parameter may be a new one that replaced `param` in the network."""

    @abc.abstractmethod
    def parallelize(self, model, table, **options):
        """Wrap `model` to run the SPMD program of `table` (a resolved StrategyTable) under this
        mode; returns the object the user calls."""

    def execution(self, mesh: Layout, accounting=None, parameter_fan_out=None) -> Execution:
        """A new per-model Execution of this runtime on `mesh`."""
        return Execution(mesh, self.local_ranks(mesh), self.make_collectives(mesh), accounting, parameter_fan_out)


class OpByOpRuntime(Runtime):
    """A mode that runs the model op by op on DTensors (simulation, distributed): the checks
    every program of it passes; a mode answers only how many devices it has and how it wraps."""

    @abc.abstractmethod
    def device_count(self) -> int:
        """The devices this mode runs: a strategy's mesh must have exactly as many."""

    @abc.abstractmethod
    def holds_all_ranks(self) -> bool:
        """Whether this process holds every device of the job (its values cannot differ per rank)."""

    @abc.abstractmethod
    def device_count_text(self, count: int) -> str:
        """`count` devices in this mode's words (e.g. "device_num=4")."""

    @abc.abstractmethod
    def device_count_hint(self, mesh_size: int) -> str:
        """How the user gives this mode `mesh_size` devices."""

    @abc.abstractmethod
    def wrap(self, model, table, return_dtensor: bool):
        """The mode's model object over the checked `table`."""

    def check_op_by_op(self, what: str = None) -> None:
        """Refuse GRAPH_MODE: it compiles the whole network and bypasses the DTensor ops.

        Raises:
            ValueError: MindSpore is not in PYNATIVE_MODE.
        """
        import mindspore as ms

        if ms.get_context("mode") != ms.PYNATIVE_MODE:
            raise ValueError(f"{what or self.name + ' mode'} runs op by op: call "
                             "mindspore.set_context(mode=mindspore.PYNATIVE_MODE) (GRAPH_MODE compiles the whole "
                             "network and bypasses the DTensor ops)")

    def check_mesh(self, mesh: Layout) -> None:
        """Raise unless `mesh` has exactly this mode's device count (the message says how to match)."""
        count = self.device_count()
        if mesh.size != count:
            raise ValueError(f"the strategy's mesh {mesh.device_matrix} has {mesh.size} devices but "
                             f"{self.device_count_text(count)}; {self.device_count_hint(mesh.size)}")

    def parallelize(self, model, table, return_dtensor: bool = False):
        """The checks (op by op, mesh size, every parameter's shape fits its layout), then `wrap`.

        Raises:
            ValueError: GRAPH_MODE, a mesh of another size, or a parameter its layout cannot split.
        """
        self.check_op_by_op()
        self.check_mesh(table.mesh)
        for row in table:
            row.layout.check_shape(row.global_shape)
        return self.wrap(model, table, return_dtensor)
