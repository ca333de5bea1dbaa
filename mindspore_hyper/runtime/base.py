"""The runtime protocol: what an execution mode must answer to run a strategy.

Every mode (simulation, distributed, native) implements one `Runtime`:
- which mesh ranks this process holds (`local_ranks`),
- its collectives backend (`make_collectives`),
- how a parameter's region is materialised in this process (`materialize`),
- how a model is wrapped (`parallelize`).
`auto_parallelize` looks the runtime up by mode (`get_runtime`); DTensor code reaches the answers
through the `Execution` a runtime builds for each wrapped model.
"""
from __future__ import annotations

import abc
from typing import ClassVar, Dict, Tuple, Type

from mindspore_hyper.comm.collectives import Collectives
from mindspore_hyper.dtensor.execution import Execution, ParameterSlot
from mindspore_hyper.shard.layout import Layout

__all__ = ["Runtime", "register_runtime", "get_runtime", "RUNTIMES"]


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
    def parallelize(self, model, strategy_or_config, **kwargs):
        """Wrap `model` to run under this mode; returns the object the user calls."""

    def execution(self, mesh: Layout, accounting=None, parameter_fan_out=None) -> Execution:
        """A new per-model Execution of this runtime on `mesh`."""
        return Execution(mesh, self.local_ranks(mesh), self.make_collectives(mesh), accounting, parameter_fan_out)


RUNTIMES: Dict[str, Type[Runtime]] = {}


def register_runtime(cls: Type[Runtime]) -> Type[Runtime]:
    """Class decorator: make `cls` the runtime of mode `cls.name`."""
    RUNTIMES[cls.name] = cls
    return cls


def get_runtime(mode: str) -> Runtime:
    """A runtime instance for `mode` ("simulation", "distributed" or "native").

    Raises:
        ValueError: unknown mode.
    """
    _load_runtimes()
    if mode not in RUNTIMES:
        raise ValueError(f"mode={mode!r}: expected one of {tuple(sorted(RUNTIMES))}")
    return RUNTIMES[mode]()


def _load_runtimes() -> None:
    from mindspore_hyper.runtime import distributed, native, simulation  # noqa: F401  (they register)
