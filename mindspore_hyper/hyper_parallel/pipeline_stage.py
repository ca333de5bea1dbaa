"""Upstream's `PipelineStage`: one rank's piece of a model cut into pipeline stages.

Each rank builds its own stage Cell (upstream's scripts cut a full model, keeping the layers of
`stage_index`) and wraps it; a schedule (pipeline_schedule.py) runs the rank's stages over
microbatches. The first stage takes `schedule.run(*inputs)`; each later stage takes the previous
stage's output; the last stage's output is what upstream's schedules return (the loss), and
its backward is seeded with ones, as upstream's: the gradient of each microbatch's output summed,
accumulated over the microbatches. Here a stage runs as this package's `StageComputation`
(forward without recording, backward recomputing it, dropout masks replayed), so its gradients
are exactly those of the forward that made the output.
"""
from __future__ import annotations

from typing import List, Optional

from mindspore import Tensor, nn

from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.hyper_parallel.hsdp import run_by_pipeline_schedule
from mindspore_hyper.hyper_parallel.pipeline_activations import (
    WireRoute, from_wire, global_value, stage_mesh, to_wire, wire_meta,
)
from mindspore_hyper.pipeline.computation import StageComputation
from mindspore_hyper.pipeline.dropout_replay import DropoutReplay

__all__ = ["PipelineStage", "stage_computation"]


def _index(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"PipelineStage: {name} must be an int, but got {value!r}")
    return value


class PipelineStage:
    """One pipeline stage of this rank (see module docstring).

    Args:
        submodule: the stage's Cell.
        stage_index: its place in the model, 0 .. stage_num - 1.
        stage_num: the number of (virtual) stages of the whole model.
        device: where upstream places received buffers (accepted; tensors live on the host here).
        group: a custom pipeline process group: not supported (None: the job's ranks in order).
        src_stage, dst_stage: the stages it receives from / sends to: only the neighbours
            (stage_index - 1, stage_index + 1) are supported.
        dyn_shape: whether shapes vary between microbatches (either works: every transfer
            carries its shape).
        has_backward: False (a forward-only stage) is not supported.
        shared_parameters: Parameters shared between stages (tied weights): not supported.

    Raises:
        TypeError: a wrong type (named).
        ValueError: an index out of range, or an unsupported option (named, with why).
    """

    def __init__(self, submodule: nn.Cell, stage_index: int, stage_num: int, device=None, group=None,
                 src_stage: Optional[int] = None, dst_stage: Optional[int] = None, dyn_shape: bool = False,
                 has_backward: bool = True, shared_parameters=None):
        if not isinstance(submodule, nn.Cell):
            raise TypeError(f"PipelineStage: submodule must be an nn.Cell, but got {type(submodule).__name__}")
        self.stage_index, self.stage_num = _index("stage_index", stage_index), _index("stage_num", stage_num)
        if stage_num < 1 or not 0 <= stage_index < stage_num:
            raise ValueError(f"PipelineStage: stage_index={stage_index} must lie in 0..stage_num-1 "
                             f"(stage_num={stage_num})")
        for name, value, neighbour in (("src_stage", src_stage, stage_index - 1),
                                       ("dst_stage", dst_stage, stage_index + 1)):
            if value is not None and _index(name, value) != neighbour:
                raise ValueError(f"PipelineStage: {name}={value}: only the neighbouring stage ({neighbour}) is "
                                 f"supported (stages form a chain)")
        if group is not None:
            raise ValueError("PipelineStage: group= (a custom pipeline process group) is not supported yet; leave it "
                             "None: stage s runs on the ranks of block s % p (p pipeline ranks, the job's ranks in p "
                             "contiguous blocks)")
        if not isinstance(dyn_shape, bool) or not isinstance(has_backward, bool):
            raise TypeError(f"PipelineStage: dyn_shape and has_backward must be bool, but got {dyn_shape!r}, "
                            f"{has_backward!r}")
        if not has_backward:
            raise ValueError("PipelineStage(has_backward=False): forward-only stages are not supported yet")
        if shared_parameters is not None:
            raise ValueError("PipelineStage(shared_parameters=...): Parameters shared between stages (tied weights) "
                             "are not supported yet")
        self.submodule, self.device, self.dyn_shape = submodule, device, dyn_shape

    @property
    def is_first_stage(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage_index == self.stage_num - 1


class _StageRun:
    """The stage's forward in the runner's form `run(activation, *inputs)`: the first stage
    calls its Cell on the step's inputs, a later one on the activation (a DTensor activation
    laid out again on this stage's mesh: pipeline_activations.py); the last stage keeps its
    output (`latest`) and returns the sum of its global value (seeding the backward with ones).
    `route`: how DTensor activations travel (global values or local pieces)."""

    def __init__(self, stage: PipelineStage, route: WireRoute):
        self.stage, self.route = stage, route
        self.latest = None
        self.input_meta = None  # the WireLayout of the DTensor activation this stage receives

    def _input(self, x):
        meta = wire_meta(x)
        if meta is not None:  # the forward; its recomputation under grad may get the bare Tensor
            if self.input_meta is not None and self.input_meta.placements != meta.placements:
                raise ValueError(f"PipelineStage {self.stage.stage_index}: the previous stage's DTensor output "
                                 f"changed placements between microbatches ({self.input_meta.placements} -> "
                                 f"{meta.placements})")
            self.input_meta = meta
        meta = meta or self.input_meta
        if meta is None:
            return x
        return from_wire(x, meta, stage_mesh(self.stage.submodule), self.stage.stage_index, self.route.rank)

    def __call__(self, x, *inputs):
        stage = self.stage
        with run_by_pipeline_schedule():
            out = stage.submodule(*inputs) if stage.is_first_stage else stage.submodule(self._input(x))
        if not isinstance(out, Tensor):
            raise ValueError(f"PipelineStage {stage.stage_index}: its Cell returned {type(out).__name__}; a stage "
                             f"returns one Tensor or DTensor here (several outputs are not supported yet)")
        if not stage.is_last_stage:
            return to_wire(out, stage.stage_index, self.route)
        self.latest = out
        return (global_value(out) if isinstance(out, DTensor) else out).sum()


class _OutputKeeping(StageComputation):
    """A StageComputation whose last stage keeps each microbatch's output (upstream's losses)."""

    def __init__(self, run: _StageRun, stage: PipelineStage):
        cell = stage.submodule
        super().__init__(run, cell.trainable_params(), stage.is_first_stage, stage.is_last_stage, 1.0,
                         DropoutReplay(cell))
        self.outputs: List[Tensor] = []

    def forward(self, microbatch: int, x, targets=()):
        out = super().forward(microbatch, x, targets)
        if self.last:
            self.outputs.append(self.run.latest)
        return out

    def reset(self) -> None:
        super().reset()
        self.outputs = []


def stage_computation(stage: PipelineStage, route: WireRoute) -> StageComputation:
    """The runner's computation of `stage` (its `outputs`: the last stage's outputs per microbatch;
    `route`: whether DTensor activations may travel between its stages)."""
    return _OutputKeeping(_StageRun(stage, route), stage)
