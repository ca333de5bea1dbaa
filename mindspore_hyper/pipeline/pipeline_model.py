"""PipelineModel: a model cut into pipeline stages, trained by running a Schedule.

`train_step(optimizer, *inputs)` splits the batch into microbatches, runs every rank's action
list (all ranks interleaved in this process in simulation; this process's rank under msrun),
sums each Parameter's gradient over the microbatches and steps the optimizer once
(pipeline_step.py, with ParallelModel's step options). In simulation a stage whose mesh has data /
tensor axes runs as a SimulatedModel on that sub-mesh (the strategy without the pipeline axis;
stage_mesh.py). The model speaks ParallelModel's protocol: `train_step`, `optimizer_parameters()`,
`report() -> StepReport` (with a pipeline section), `last_gradients`, `last_grad_norm`.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
from mindspore import Parameter, Tensor, nn

from mindspore_hyper.dtensor.accounting import Accounting
from mindspore_hyper.pipeline.aux_loss import AuxLosses
from mindspore_hyper.pipeline.computation import StageComputation
from mindspore_hyper.pipeline.distributed_forward import distributed_forward
from mindspore_hyper.pipeline.dropout_replay import DropoutReplay
from mindspore_hyper.pipeline.microbatch import loss_scale
from mindspore_hyper.pipeline.options import PipelineOptions
from mindspore_hyper.pipeline.pipeline_step import run_train_step
from mindspore_hyper.pipeline.runner import StageRunner
from mindspore_hyper.pipeline.stage_mesh import mesh_without_axis, parallel_stage
from mindspore_hyper.pipeline.stage_rebalancing import StageRebalancing
from mindspore_hyper.pipeline.stage_transport import LocalTransport
from mindspore_hyper.pipeline.stages import PipelineLayers, StageCell, check_unshared
from mindspore_hyper.pipeline import step_timelines
from mindspore_hyper.pipeline.traced_chain import TracedStageCell
from mindspore_hyper.runtime.gradient_sync import GradientSync
from mindspore_hyper.runtime.parallel_model import register_model
from mindspore_hyper.schedule.actions import ActionKind
from mindspore_hyper.schedule.schedule import Schedule
from mindspore_hyper.schedule.schedule_timeline import ScheduleTimeline
from mindspore_hyper.shard.model_strategy import Strategy

__all__ = ["PipelineModel"]


class PipelineModel(nn.Cell):
    """A pipelined model (see module docstring).

    Attributes:
        network: the user's model (its Cells and Parameters are the stages').
        schedule: the Schedule run each step.
        split: layers per virtual stage.
        options: the PipelineOptions.
        runtime: the Runtime the stages run on (every pipeline rank in this process, or one per
            process under msrun).
        in_one_process: whether every pipeline rank runs in this process (the runtime's answer).
        ranks: the pipeline ranks this process runs (all in simulation).
        rebalance_log: the StageMovePlans applied between steps (scheduler: dynamic).
        last_gradients: parameter name -> numpy gradient of the last step, for the Parameters
            this process computed (every one in simulation; under msrun its stages', a
            tensor-parallel stage's as this process's shard), after unscaling, before clipping.
        last_grad_norm: the last step's global gradient norm (every element counted once).
        from_config: pipelined by a config's `pipeline: N` rather than an explicit `pipeline=`.
    """

    def __init__(self, network: nn.Cell, layers: PipelineLayers, schedule: Schedule, split: Tuple[int, ...],
                 options: PipelineOptions, strategy: Strategy, runtime, reduction: str, table=None,
                 transport=None, from_config: bool = False):
        super().__init__(auto_prefix=False)
        self.from_config = from_config  # pipelined by a config's `pipeline: N`, not by `pipeline=`
        self.network, self.layers, self.schedule, self.options = network, layers, schedule, options
        self.strategy, self.reduction, self.table = strategy, reduction, table
        self.runtime, self.in_one_process = runtime, runtime.in_one_process()
        self.world = runtime.processes
        self.mesh = strategy.mesh
        axis_index = self.mesh.axis_index(options.axis)
        self.held_devices = tuple(runtime.local_ranks(self.mesh))  # the mesh ranks this process runs
        self.stage_mesh = mesh_without_axis(self.mesh, options.axis)
        if self.stage_mesh is None and not runtime.computes_values():
            raise ValueError(f"dry run: a pipeline over a mesh of the {options.axis!r} axis alone runs its stages as "
                             f"plain cells, on values; give the mesh a data axis (of size 1 if need be), so each stage "
                             f"runs as a dry-run model on its own mesh")
        if self.in_one_process:
            self.ranks = tuple(range(schedule.num_ranks))
        else:  # this process: its pipeline coordinate, and the processes of its stage as the stage mesh
            self.ranks = (self.mesh.coords(self.held_devices[0])[axis_index],)
            self.stage_processes = tuple(g for g in self.mesh.ranks if self.mesh.coords(g)[axis_index] == self.ranks[0])
        self.transport = transport if transport is not None else LocalTransport(schedule.num_ranks)
        self.rebalancing = StageRebalancing()
        self.steps_run = 0  # train_steps run
        self.last_step_seconds = 0.0
        self.last_events: List[tuple] = []  # the last step's (rank, action, start, end) of this process's ranks
        self.last_loss: Optional[float] = None
        self.last_gradients: Dict[str, np.ndarray] = {}  # name -> this process's gradient (before clipping)
        self.last_grad_norm: Optional[float] = None  # the last step's global gradient norm, before clipping
        self.last_step_skipped = False  # the last step's update was skipped (loss scaling overflow)
        # the global norm's scalar all-reduce over the whole mesh, recorded here (its report rows)
        self.norm_sync = GradientSync(Accounting(self.mesh.size),
                                      None if self.in_one_process else runtime.make_collectives(self.mesh))
        self.last_measured: Optional[ScheduleTimeline] = None  # the gathered timeline of step `measured_step`
        self.measured_step = -1
        self.split = tuple(split)
        register_model(self)
        if layers.chain is None or layers.chain.traced:
            self.build_stages(self.split)
        else:  # built on the first call, after the chain's trace (which needs inputs)
            self.runners, self.computations, self.stage_models = {}, {}, {}
        self.recv_counts: Dict[int, int] = {}  # under msrun: per peer rank, the receives of a step
        if not self.in_one_process:
            for a in schedule.actions[self.ranks[0]]:
                if a.kind is ActionKind.RECV:
                    self.recv_counts[a.peer] = self.recv_counts.get(a.peer, 0) + 1

    # -- stages -----------------------------------------------------------------------------------
    def build_stages(self, split: Tuple[int, ...]) -> None:
        """Cut the stages at `split` (layers per virtual stage): their Cells, the parallel models
        of the stages this process holds (on a stage sub-mesh), computations and runners."""
        self.split = tuple(split)
        m = self.schedule.num_microbatches
        scale = loss_scale(self.reduction, m)
        bounds = np.cumsum((0,) + self.split)
        held = {s for r in self.ranks for s in self.schedule.stages_of(r)}
        last = len(self.split) - 1
        self.stage_cells: Dict[int, StageCell] = {}
        self.stage_models: Dict[int, object] = {}
        self.computations: Dict[int, StageComputation] = {}
        for s in range(len(self.split)):
            if self.layers.chain is not None:
                cell = TracedStageCell(self.layers.chain, int(bounds[s]), int(bounds[s + 1]), s == last,
                                       self.layers.param_names)
            else:
                cells = self.layers.cells[bounds[s]:bounds[s + 1]]
                cell = StageCell(cells, self.layers.param_names, self.layers.loss if s == last else None)
            self.stage_cells[s] = cell
            if s not in held:
                continue
            run = cell
            if self.stage_mesh is not None:
                run = parallel_stage(self, cell)
                self.stage_models[s] = run
            self.computations[s] = StageComputation(run, cell.trainable_params(), s == 0, s == last, scale,
                                                    DropoutReplay(cell), grad=self.runtime.grad)
        self.runners = {r: StageRunner(self.schedule, r, {s: self.computations[s] for s in self.schedule.stages_of(r)},
                                       self.transport, all_inputs=self.layers.chain is not None) for r in self.ranks}

    def trace(self, inputs, require_loss: bool) -> None:
        """A model pipelined through its construct: record and check one forward on `inputs`
        (the first call's first microbatch), then cut the stages; nothing for a chain of Cells
        or once traced."""
        chain = self.layers.chain
        if chain is None or chain.traced:
            return
        if not self.runtime.computes_values():
            raise ValueError(f"dry run: {type(self.network).__name__} is pipelined through its construct, whose stages "
                             f"are found by running it once on values (traced_chain.py); give the model "
                             f"pipeline_layers() (its chain of layers) and pipeline_loss(output, *targets), or dry-run "
                             f"it without pipeline stages")
        if any(p.has_init for p in self.network.get_parameters()):
            self.network.init_parameters_data()  # built under no_init_parameters(): the trace reads values
        try:
            chain.trace(inputs, require_loss)
        except ValueError as exc:
            if not self.from_config:
                raise
            raise ValueError(f"{exc} (the config's `pipeline: N` pipelines this model; auto_parallelize(..., "
                             f"pipeline=False) runs it as one SPMD program whose stages only place parameters)") from None
        self.layers = self.layers.with_outer_parameters()
        if not self.in_one_process:
            check_unshared(self.layers, self.schedule, self.split)
        self.build_stages(self.split)

    def process_of(self, pipeline_rank: int, like: Optional[int] = None) -> int:
        """The global rank running `pipeline_rank` at the stage-mesh coordinates of global rank
        `like` (default: the first process of that pipeline rank)."""
        a = self.mesh.axis_index(self.options.axis)
        coords = list(self.mesh.coords(like if like is not None else self.mesh.ranks[0]))
        coords[a] = pipeline_rank
        return self.mesh.rank_at(coords)

    def held_stages(self) -> Tuple[int, ...]:
        """The virtual stages this process runs."""
        return tuple(sorted(self.computations))

    # -- parameters -------------------------------------------------------------------------------
    def parameters_and_names(self, name_prefix: str = "", expand: bool = True):
        return self.network.parameters_and_names(name_prefix, expand)

    def optimizer_parameters(self) -> List[Parameter]:
        """The Parameters the optimizer of this process updates: every trainable parameter in
        simulation, and under msrun with rebalancing (a layer may move here later, so its
        optimizer states are kept; a Parameter of another process's stage gets a zero gradient
        and its values here are replaced by its owner's when it moves in) or for a model
        pipelined through its construct (the stages are cut at its first step; a Parameter of
        another process's stage gets a zero gradient); otherwise the ones of this process's stages."""
        if self.in_one_process or self.rebalancing.active(self) or self.layers.chain is not None:
            return list(self.network.trainable_params())
        out, seen = [], set()
        for s in self.held_stages():
            for p in self.stage_cells[s].trainable_params():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    # -- running ----------------------------------------------------------------------------------
    def construct(self, *inputs):
        """Forward of the whole batch through the stages in order, no microbatches (e.g. an
        evaluation). Under msrun every process must call it: each runs its stages, activations
        go stage to stage point-to-point, and the output is broadcast from the last stage
        (distributed_forward.py)."""
        self.norm_sync.accounting.reset_step()  # no gradient norm in this step's report
        self.trace(inputs, require_loss=False)
        if not self.in_one_process:
            return distributed_forward(self, inputs)
        x = inputs[0]
        with AuxLosses() as aux:
            for s in range(len(self.split)):
                run = self.stage_models.get(s, self.stage_cells[s])
                x = run(x, *self.stage_inputs(s, inputs))
        if aux and self.layers.loss is not None:  # the layers' auxiliary losses join the loss
            x = x + aux.total()
        return x

    def stage_inputs(self, stage: int, inputs) -> tuple:
        """The model inputs a stage takes besides the activation: all of them for a model
        pipelined through its construct, the loss's targets on the last stage, else none."""
        if self.layers.chain is not None:
            return tuple(inputs)
        return tuple(inputs[1:]) if stage == len(self.split) - 1 else ()

    def train_step(self, optimizer: nn.Optimizer, *inputs, max_grad_norm: Optional[float] = None,
                   accumulation_steps: int = 1, loss_scale=None) -> Tensor:
        """One step: the schedule over microbatches of `inputs`, one optimizer update
        (pipeline_step.py). Sets `last_grad_norm` (the global gradient norm before clipping, every
        element counted once over all stages), `last_gradients` and `last_step_skipped`.

        Args:
            optimizer: built on `optimizer_parameters()`.
            *inputs: the model input (fed to stage 0), then the loss's targets; global batch.
            max_grad_norm: clip the gradients to this global norm (over every stage, as
                `mindspore.ops.clip_by_global_norm` on one device), or None.
            accumulation_steps: must be 1: a pipeline already accumulates over its microbatches
                (k steps of m microbatches = one step of k*m; raise `pipeline.microbatches`).
            loss_scale: None, a number >= 1 or a `mindspore.amp` loss scaler: every microbatch's
                loss is scaled in the backward and the gradients unscaled; the update is skipped
                (on every process) when a gradient is not finite, and the scaler adjusted.

        Returns:
            The batch loss (on every process; unscaled).

        Raises:
            ValueError: the microbatches do not divide the batch; the optimizer updates other
                Parameters than `optimizer_parameters()`; a bad `max_grad_norm` or `loss_scale`;
                `accumulation_steps` other than 1; clipping or loss scaling in a dry run.
        """
        return run_train_step(self, optimizer, inputs, max_grad_norm, accumulation_steps, loss_scale)

    # -- timelines ----------------------------------------------------------------------------------
    def stage_times(self) -> Tuple[float, ...]:
        """Seconds of compute per virtual stage in the last step (this process's stages; 0 for others)."""
        return step_timelines.stage_times(self)

    def measured_timeline(self) -> ScheduleTimeline:
        """The last step's real start/end of every action. Under msrun every process must call
        this (the records are all-gathered); the clock is the host's monotonic clock."""
        return step_timelines.measured_timeline(self)

    def simulated_timeline(self, measured: Optional[ScheduleTimeline] = None) -> ScheduleTimeline:
        """The schedule simulated with the measured mean cost per (action kind, stage) and the
        measured p2p latency (`step_timelines.p2p_latency`) of `measured` (default: this
        process's last step)."""
        return step_timelines.simulated_timeline(self, measured)

    # -- rebalancing --------------------------------------------------------------------------------
    @property
    def rebalance_log(self) -> List[object]:
        """The StageMovePlans applied between steps (scheduler: dynamic)."""
        return self.rebalancing.log

    @property
    def migrated_bytes(self) -> int:
        """Under msrun: bytes of Parameters and optimizer states moved by rebalancing."""
        return self.rebalancing.migrated_bytes

    # -- report -----------------------------------------------------------------------------------
    def report(self, optimizer: Optional[nn.Optimizer] = None):
        """The last step's StepReport: memory per device of the stages it holds, the stages'
        collectives (axis named `axis@stageK`), the global gradient norm's all-reduce over the
        whole mesh (axis: the mesh's axes joined by "+"), and its `pipeline` section
        (pipeline/report.py): the schedule, the stage-boundary send/recv bytes (`p2p`) and the
        schedule's timeline with the measured per-stage costs (`timeline`)."""
        from mindspore_hyper.pipeline.report import pipeline_report

        return pipeline_report(self, optimizer)
