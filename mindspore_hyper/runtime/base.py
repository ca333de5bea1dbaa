"""The runtime protocol: what an execution mode must answer to run a strategy.

Every mode (simulation, distributed, native) implements one `Runtime`:
- which mesh ranks this process holds (`local_ranks`),
- its collectives backend (`make_collectives`),
- how a parameter's region is materialised in this process (`materialize`),
- how the SPMD program of a resolved strategy is wrapped (`parallelize`);
and what the compositions over it (pipeline stages, MPMD device groups, RLHF roles, the encoder
pipeline) ask instead of testing a mode's name: whether it runs op by op (`runs_op_by_op`),
whether the whole job is in this process (`in_one_process`), the job's processes
(`processes`), a runtime for a part of the job's devices (`sub_runtime`), and host values moved
between the processes (`gather_values`, `broadcast_values`). Each of these has a default here, so
a new mode that answers only the SPMD questions still imports and runs plain SPMD programs.
`OpByOpRuntime` holds what the simulation and distributed modes share (the checks every program
passes); they answer only their device count and their model class. `auto_parallelize` resolves
the strategy once, picks the program's builder (SPMD, pipeline, MPMD groups) and the mode's
runtime (`RUNTIMES` in runtime/modes.py); DTensor code reaches the answers through the `Execution` a
runtime builds for each wrapped model.
"""
from __future__ import annotations

import abc
from typing import ClassVar, Sequence, Tuple

import numpy as np

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

    # -- what the compositions ask (pipeline stages, device groups, RLHF roles, encoder pipeline) --
    def runs_op_by_op(self) -> bool:
        """Whether this mode runs the model op by op on DTensors, so pipeline stages, device groups
        and the encoder pipeline compose over it (False here: the mode compiles the whole program
        itself and takes all of `auto_parallelize`'s keywords in `parallelize`)."""
        return False

    def computes_values(self) -> bool:
        """Whether tensors hold values (False in a dry run: shapes only, so losses, gradients
        and optimizer updates are not computed)."""
        return True

    def grad(self, fn, grad_position=0, weights=None):
        """`mindspore.grad(fn, grad_position, weights)` for this mode (a dry run's records the
        backward and returns gradients of the right shapes)."""
        from mindspore_hyper.autodiff import grad

        return grad(fn, grad_position=grad_position, weights=weights)

    def check_composition(self, kind: str) -> None:
        """Refuse a composition (`kind`: "pipeline stages", "device groups") this mode cannot run
        (none refused here).

        Raises:
            ValueError: naming the mode, the composition and what to do instead.
        """

    def in_one_process(self) -> bool:
        """Whether every device of the job runs in this one process (virtual devices: pipeline
        ranks interleaved, device groups side by side, each value read directly), rather than
        one process per device exchanging values with the others (False here)."""
        return False

    @property
    def processes(self):
        """The World (or SubWorld) of the processes the job's devices run in (ranks, point-to-point
        channels, communicators); None where the job runs in one process (default)."""
        return None

    def sub_runtime(self, ranks: Sequence[int], same_initial_values: bool = False) -> "Runtime":
        """The runtime of a part of the job: the devices `ranks` (global ranks, e.g. a pipeline
        stage's or a device group's), numbered 0..len(ranks)-1 on their own mesh; use its `wrap`.

        Args:
            ranks: the job's ranks of the part, in the order of the part's mesh.
            same_initial_values: every process of the part holds the same initial Parameter values
                already (no broadcast from the part's first rank is needed).

        Raises:
            NotImplementedError: this mode runs no program on a part of its devices (default).
        """
        raise NotImplementedError(f"{self.name} mode runs no program on a part of its devices (pipeline stages, "
                                  "device groups)")

    def gather_values(self, array: np.ndarray) -> np.ndarray:
        """Every process's host `array` (losses, times, records), stacked along a new first axis in
        process order: one row where the job runs in one process.

        Raises:
            NotImplementedError: a mode of several processes that does not move host values.
        """
        if self.in_one_process():
            return np.asarray(array)[None]
        raise NotImplementedError(f"{self.name} mode: no gathering of host values between its processes")

    def broadcast_values(self, array: np.ndarray, root: int) -> np.ndarray:
        """Process `root`'s host `array` on every process (`array` itself where the job runs in
        one process).

        Raises:
            NotImplementedError: a mode of several processes that does not move host values.
        """
        if self.in_one_process():
            return array
        raise NotImplementedError(f"{self.name} mode: no broadcast of host values between its processes")


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

    def runs_op_by_op(self) -> bool:
        """True: pipeline stages, device groups and the encoder pipeline compose over this mode."""
        return True

    def in_one_process(self) -> bool:
        """Whether every device of the job runs in this process: by default, whether this process
        holds every rank (`holds_all_ranks`)."""
        return self.holds_all_ranks()

    def sub_runtime(self, ranks: Sequence[int], same_initial_values: bool = False) -> Runtime:
        """In one process the part's devices are virtual ones of this process too: this runtime
        (stateless; its `wrap` takes any mesh). See `Runtime.sub_runtime`."""
        if self.in_one_process():
            return self
        return super().sub_runtime(ranks, same_initial_values)

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
        table.check_shapes()
        return self.wrap(model, table, return_dtensor)
