"""PipelineOptions: how a pipelined model runs (schedule kind, microbatches, chunks, split)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Tuple, Union

from mindspore_hyper.schedule.build import SCHEDULE_KINDS

__all__ = ["PipelineOptions", "V_CHUNK_KINDS"]

V_CHUNK_KINDS = ("interleaved_1f1b", "zb_v", "dualpipe_v")  # kinds that run 2 chunks per rank by default
LOSS_REDUCTIONS = ("mean", "sum")


@dataclass(frozen=True)
class PipelineOptions:
    """Options of pipeline execution (the `pipeline=` argument of `auto_parallelize`).

    Attributes:
        schedule: schedule kind, one of `mindspore_hyper.schedule.SCHEDULE_KINDS`.
        microbatches: microbatches per step (must divide the batch); None = the number of
            virtual stages (2p for zb_v / dualpipe_v), the least every kind accepts.
        stages: pipeline ranks p; None = the config's `pipeline: N`, else the size of the mesh's
            `axis`.
        chunks: model chunks per rank v; None = 2 for interleaved_1f1b, zb_v, dualpipe_v, else 1.
        layers_per_stage: explicit split, layers per virtual stage in model order (sums to the
            model's layer count); None = from the strategy table's stages or balanced by
            parameter count.
        axis: the mesh alias whose coordinate is the pipeline rank.
        loss_reduction: how the last stage's loss combines over a batch ("mean" or "sum");
            None = the loss Cell's `reduction`, else "mean".
        rebalance: move layers between stages between steps (the rebalancing planner);
            None = on iff the config says `scheduler: dynamic`.
    """

    schedule: str = "1f1b"
    microbatches: Optional[int] = None
    stages: Optional[int] = None
    chunks: Optional[int] = None
    layers_per_stage: Optional[Tuple[int, ...]] = None
    axis: str = "pipeline"
    loss_reduction: Optional[str] = None
    rebalance: Optional[bool] = None

    def __post_init__(self):
        if self.schedule not in SCHEDULE_KINDS:
            raise ValueError(f"pipeline.schedule={self.schedule!r}: unknown schedule kind; expected one of "
                             f"{tuple(SCHEDULE_KINDS)}")
        for name in ("microbatches", "stages", "chunks"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"pipeline.{name}={value!r}: expected a positive int or None")
        if self.layers_per_stage is not None:
            counts = tuple(self.layers_per_stage)
            if not counts or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts):
                raise ValueError(f"pipeline.layers_per_stage={self.layers_per_stage!r}: expected one int >= 1 per "
                                 f"virtual stage")
            object.__setattr__(self, "layers_per_stage", counts)
        if not isinstance(self.axis, str) or not self.axis:
            raise ValueError(f"pipeline.axis={self.axis!r}: expected a mesh alias")
        if self.loss_reduction is not None and self.loss_reduction not in LOSS_REDUCTIONS:
            raise ValueError(f"pipeline.loss_reduction={self.loss_reduction!r}: expected one of {LOSS_REDUCTIONS}")
        if self.rebalance is not None and not isinstance(self.rebalance, bool):
            raise ValueError(f"pipeline.rebalance={self.rebalance!r}: expected True, False or None")

    @classmethod
    def of(cls, value: Union["PipelineOptions", Mapping, bool, None]) -> "PipelineOptions":
        """Options from an instance, a mapping of its fields, or True / None (defaults).

        Raises:
            ValueError: an unknown key or a bad value (named).
        """
        if value is None or value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - set(cls.__dataclass_fields__)
            if unknown:
                raise ValueError(f"pipeline: unknown key(s) {sorted(unknown)}; expected {sorted(cls.__dataclass_fields__)}")
            return cls(**value)
        raise ValueError(f"pipeline={value!r}: expected PipelineOptions, a mapping of its fields, True (defaults), "
                         f"None, or False (no pipeline: one SPMD program)")

    def num_chunks(self) -> int:
        """Chunks per rank v (explicit, else the kind's default)."""
        if self.chunks is not None:
            return self.chunks
        return 2 if self.schedule in V_CHUNK_KINDS else 1
