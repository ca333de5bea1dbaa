"""The shape of the program a resolved strategy runs as: one SPMD program, pipeline stages, or
MPMD device groups -- decided once, by `auto_parallelize`, which then picks the builder."""
from __future__ import annotations

from dataclasses import dataclass, replace

from mindspore_hyper.strategy.resolve import StrategyTable

__all__ = ["Program", "PROGRAM_SHAPES", "program_of"]

PROGRAM_SHAPES = ("spmd", "pipeline", "mpmd")


@dataclass(frozen=True)
class Program:
    """A resolved strategy and the shape of its program.

    Attributes:
        shape: "spmd" (one program over the mesh), "pipeline" (stages running a schedule) or
            "mpmd" (device groups, each its own program).
        table: the StrategyTable (resolved once; every builder reads it).
    """

    shape: str
    table: StrategyTable

    def __post_init__(self):
        if self.shape not in PROGRAM_SHAPES:
            raise ValueError(f"Program.shape={self.shape!r}: expected one of {PROGRAM_SHAPES}")

    def without_pipeline(self) -> "Program":
        """The program when the model cannot be cut into stages: device groups if declared, else SPMD."""
        return replace(self, shape="mpmd" if self.table.groups else "spmd")


def program_of(table: StrategyTable, pipeline=None) -> Program:
    """The program of `table`: pipeline stages when `pipeline` asks for them (anything but None
    and False) or the config says `pipeline: N > 1` (and `pipeline` is not False: the opt-out,
    one program whose stages only place parameters); else device groups when declared; else SPMD."""
    wants_stages = pipeline is not False and (pipeline is not None or table.pipeline_stages > 1)
    program = Program("pipeline", table)
    return program if wants_stages else program.without_pipeline()
