"""PipelineModel: a model cut into pipeline stages, trained by running a Schedule.

`train_step(optimizer, *inputs)` splits the batch into microbatches, runs every rank's action
list (all ranks interleaved in this process in simulation; this process's rank under msrun),
sums each Parameter's gradient over the microbatches and steps the optimizer once.
In simulation a stage whose mesh has data / tensor axes runs as a SimulatedModel on that
sub-mesh (the strategy without the pipeline axis).
"""
from __future__ import annotations

import fnmatch
import time
from typing import Dict, List, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mindspore_hyper.dtensor.meta import meta
from mindspore_hyper.pipeline.aux_loss import AuxLosses
from mindspore_hyper.pipeline.computation import StageComputation
from mindspore_hyper.pipeline.dropout_replay import DropoutReplay
from mindspore_hyper.pipeline.microbatch import loss_scale, split_microbatches
from mindspore_hyper.pipeline.options import PipelineOptions
from mindspore_hyper.pipeline.stage_transport import LocalTransport
from mindspore_hyper.pipeline.runner import StageRunner
from mindspore_hyper.pipeline.stages import PipelineLayers, StageCell, check_unshared
from mindspore_hyper.pipeline.traced_chain import TracedStageCell
from mindspore_hyper.runtime.parallel_model import register_model
from mindspore_hyper.runtime.optimizer_check import optimizer_gradients
from mindspore_hyper.runtime.training_options import refuse_unsupported
from mindspore_hyper.schedule.actions import ActionKind
from mindspore_hyper.schedule.schedule import Schedule
from mindspore_hyper.schedule.simulation import simulate_schedule
from mindspore_hyper.schedule.schedule_timeline import ScheduleTimeline
from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.strategy.strategy import Strategy

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
        mode: the runtime's name ("simulation" or "distributed").
        in_one_process: whether every pipeline rank runs in this process (the runtime's answer).
        ranks: the pipeline ranks this process runs (all in simulation).
        rebalance_log: the StageMovePlans applied between steps (scheduler: dynamic).
        from_config: pipelined by a config's `pipeline: N` rather than an explicit `pipeline=`.
    """

    def __init__(self, network: nn.Cell, layers: PipelineLayers, schedule: Schedule, split: Tuple[int, ...],
                 options: PipelineOptions, strategy: Strategy, runtime, reduction: str, table=None,
                 transport=None, from_config: bool = False):
        super().__init__(auto_prefix=False)
        self.from_config = from_config  # pipelined by a config's `pipeline: N`, not by `pipeline=`
        self.network, self.layers, self.schedule, self.options = network, layers, schedule, options
        self.strategy, self.reduction, self.table = strategy, reduction, table
        self.runtime, self.mode, self.in_one_process = runtime, runtime.name, runtime.in_one_process()
        self.world = runtime.processes
        self.mesh = strategy.mesh
        axis_index = self.mesh.axis_index(options.axis)
        self.held_devices = tuple(runtime.local_ranks(self.mesh))  # the mesh ranks this process runs
        self.stage_mesh = _without_axis(self.mesh, options.axis)
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
        self.rebalance_log: List[object] = []
        self.migrated_bytes = 0  # under msrun: bytes of Parameters and optimizer states moved by rebalancing
        self.last_step_seconds = 0.0
        self.last_events: List[tuple] = []
        self.last_loss: Optional[float] = None
        self._rebalancer = None
        self._steps = 0
        self.last_measured: Optional[ScheduleTimeline] = None  # the gathered timeline of step `_measured_step`
        self._measured_step = -1
        self.split = tuple(split)
        register_model(self)
        if layers.chain is None or layers.chain.traced:
            self._build_stages(self.split)
        else:  # built on the first call, after the chain's trace (which needs inputs)
            self.runners, self.computations = {}, {}
        if not self.in_one_process:
            counts: Dict[int, int] = {}
            for a in schedule.actions[self.ranks[0]]:
                if a.kind is ActionKind.RECV:
                    counts[a.peer] = counts.get(a.peer, 0) + 1
            self._recv_counts = counts

    # -- stages -----------------------------------------------------------------------------------
    def _build_stages(self, split: Tuple[int, ...]) -> None:
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
                run = self._parallel_stage(cell)
                self.stage_models[s] = run
            self.computations[s] = StageComputation(run, cell.trainable_params(), s == 0, s == last, scale,
                                                    DropoutReplay(cell), grad=self.runtime.grad)
        self.runners = {r: StageRunner(self.schedule, r, {s: self.computations[s] for s in self.schedule.stages_of(r)},
                                       self.transport, all_inputs=self.layers.chain is not None) for r in self.ranks}

    def _trace(self, inputs, require_loss: bool) -> None:
        """A model pipelined through its construct: record and check one forward on `inputs`
        (the first call's first microbatch), then cut the stages."""
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
        self._build_stages(self.split)

    def _parallel_stage(self, cell: StageCell):
        """The stage on its data/tensor sub-mesh, wrapped by the runtime of the stage's devices
        (`sub_runtime`): a SimulatedModel (simulation) or a DistributedModel over this stage's
        processes (msrun)."""
        from mindspore_hyper.strategy.resolve import resolve_strategy

        names = [n for n, _ in cell.parameters_and_names()]
        overrides = {p: t for p, t in self.strategy.overrides.items() if any(fnmatch.fnmatchcase(n, p) for n in names)}
        optimizer_axis = self.strategy.optimizer_state if self.strategy.optimizer_state != self.options.axis else None
        context = self.strategy.context
        strategy = Strategy(self.stage_mesh, self.strategy.tensor_map, optimizer_axis, self.strategy.data_axis,
                            self.strategy.input_map, overrides, context_parallel=context and context.axis,
                            context_method=context and context.method)
        table = resolve_strategy(cell, strategy)
        for row in table:
            row.layout.check_shape(row.global_shape)
        # under msrun the build broadcast every Parameter from rank 0 already (every process builds
        # the whole model, but only a stage's processes build its stage: no broadcast over the job here)
        # (in one process every stage's devices are virtual ones of this process: any ranks do)
        stage_devices = self.mesh.ranks if self.in_one_process else self.stage_processes
        runtime = self.runtime.sub_runtime(stage_devices, same_initial_values=True)
        return runtime.wrap(cell, table, return_dtensor=False)

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
        if self.in_one_process or self._rebalancing() or self.layers.chain is not None:
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
        go stage to stage point-to-point, and the output is broadcast from the last stage."""
        self._trace(inputs, require_loss=False)
        if self.in_one_process:
            x = inputs[0]
            with AuxLosses() as aux:
                for s in range(len(self.split)):
                    run = self.stage_models.get(s, self.stage_cells[s])
                    x = run(x, *self._stage_inputs(s, inputs))
            if aux and self.layers.loss is not None:  # the layers' auxiliary losses join the loss
                x = x + aux.total()
            return x
        return self._distributed_forward(inputs)

    def _stage_inputs(self, stage: int, inputs) -> tuple:
        """The model inputs a stage takes besides the activation: all of them for a model
        pipelined through its construct, the loss's targets on the last stage, else none."""
        if self.layers.chain is not None:
            return tuple(inputs)
        return tuple(inputs[1:]) if stage == len(self.split) - 1 else ()

    def _distributed_forward(self, inputs) -> Tensor:
        from mindspore_hyper.schedule.actions import P2PTensor, Payload

        me, owner = self.ranks[0], self.schedule.stage_to_rank
        tag = self.schedule.num_microbatches  # a microbatch index no schedule action uses
        incoming: Dict[int, int] = {}
        for s in range(1, len(self.split)):
            if owner[s] == me and owner[s - 1] != me:
                incoming[owner[s - 1]] = incoming.get(owner[s - 1], 0) + 1
        self.transport.expect(incoming)
        x, last, out = inputs[0], len(self.split) - 1, None
        with AuxLosses() as aux:
            for s in self.held_stages():
                if s > 0 and owner[s - 1] != me:
                    x = self.transport.recv(P2PTensor(Payload.ACTIVATION, s - 1, s, tag), owner[s - 1])
                    x = x if isinstance(x, Tensor) else Tensor(x)
                run = self.stage_models.get(s, self.stage_cells[s])
                x = run(x, *self._stage_inputs(s, inputs))
                if s == last:
                    out = x
                elif owner[s + 1] != me:
                    self.transport.send(me, P2PTensor(Payload.ACTIVATION, s, s + 1, tag), x, owner[s + 1])
        self.transport.flush()
        out = self._broadcast_output(out, self.process_of(owner[last]))
        if self.layers.loss is not None and self.world.size > 1:  # the stages' auxiliary losses join the loss
            local = float(aux.total().asnumpy()) if aux else 0.0
            parts = self.runtime.gather_values(np.array([local], dtype=np.float64))
            out = out + float(sum(parts[self.process_of(r), 0] for r in range(self.schedule.num_ranks)))
        return out

    def _broadcast_output(self, out: Optional[Tensor], root: int) -> Tensor:
        """The last stage's output on every process (its shape first, then its values)."""
        header = np.zeros(9, dtype=np.int64)
        if out is not None:
            header[0] = out.ndim
            header[1:1 + out.ndim] = out.shape
        header = self.runtime.broadcast_values(header, root)
        shape = tuple(int(d) for d in header[1:1 + int(header[0])])
        value = out.asnumpy().astype(np.float32) if out is not None else np.zeros(shape, np.float32)
        return Tensor(self.runtime.broadcast_values(np.ascontiguousarray(value), root))

    def train_step(self, optimizer: nn.Optimizer, *inputs, max_grad_norm=None, accumulation_steps: int = 1,
                   loss_scale=None) -> Tensor:
        """One step: the schedule over microbatches of `inputs`, one optimizer update.

        Args:
            optimizer: built on `optimizer_parameters()`.
            *inputs: the model input (fed to stage 0), then the loss's targets; global batch.
            max_grad_norm, accumulation_steps, loss_scale: ParallelModel.train_step's options,
                not supported by a pipeline yet: refused unless left at their defaults.

        Returns:
            The batch loss (on every process).

        Raises:
            ValueError: the microbatches do not divide the batch; the optimizer updates other
                Parameters than `optimizer_parameters()`; a clipping, accumulation or loss-scaling
                option is set.
        """
        refuse_unsupported("pipeline", max_grad_norm, accumulation_steps, loss_scale,
                           "a pipeline already accumulates over its microbatches: raise the schedule's "
                           "num_microbatches")
        start = time.perf_counter()
        microbatches = split_microbatches(inputs, self.schedule.num_microbatches)
        self._trace(microbatches[0], require_loss=True)
        for c in self.computations.values():
            c.reset()
        for runner in self.runners.values():
            runner.start_step(microbatches)
        if self.in_one_process:
            self._run_in_process()
        else:
            self.transport.expect(self._recv_counts)
            self.runners[self.ranks[0]].advance(blocking=True)
            self.transport.flush()
        if not self.runtime.computes_values():  # a dry run: shapes recorded, nothing to update
            return self._dry_step(start)
        grads = self._gradients(optimizer)
        optimizer(grads)
        loss = self._loss()
        self.last_events = [e for r in self.ranks for e in self.runners[r].events]
        self.last_step_seconds = time.perf_counter() - start
        self.last_loss = loss
        self._steps += 1
        if self._rebalancing() and self._steps > 1:  # the first step's times include building the grad graphs
            self._rebalance(optimizer)
        return Tensor(np.float32(loss))

    def _dry_step(self, start: float):
        """The end of a dry run's step: no gradients to apply, the loss has a shape only."""
        self.last_events = [e for r in self.ranks for e in self.runners[r].events]
        self.last_step_seconds = time.perf_counter() - start
        self._steps += 1
        return meta((), ms.float32)

    def _run_in_process(self) -> None:
        runners = list(self.runners.values())
        while not all(r.done for r in runners):
            if sum(r.advance(blocking=False) for r in runners) == 0:
                stuck = {r.rank: str(r.actions[r.pc]) for r in runners if not r.done}
                raise RuntimeError(f"pipeline: no rank can progress (waiting: {stuck})")

    def _gradients(self, optimizer: nn.Optimizer) -> tuple:
        found: Dict[int, Tensor] = {}
        for c in self.computations.values():
            for key, g in c.grads.items():
                found[key] = g if key not in found else found[key] + g
        out = optimizer_gradients(optimizer, found, allowed={id(p) for p in self.optimizer_parameters()},
                                  missing=lambda p: ops.zeros(p.shape, p.dtype))
        self.last_gradients = {self.layers.param_names.get(id(p), p.name): g.asnumpy()
                               for p, g in zip(optimizer.parameters, out)}
        return out

    def _loss(self) -> float:
        last = len(self.split) - 1
        scale = loss_scale(self.reduction, self.schedule.num_microbatches)
        owner = self.process_of(self.schedule.stage_to_rank[last])
        value = sum(self.computations[last].losses) * scale if last in self.computations else 0.0
        aux = sum(sum(c.aux_losses) for c in self.computations.values()) * scale
        if not self.in_one_process and self.world.size > 1:
            # the last stage's loss, plus every stage's auxiliary losses (each pipeline rank's as
            # its first process computed them), on every process
            parts = self.runtime.gather_values(np.array([value, aux], dtype=np.float64))
            value = float(parts[owner, 0])
            aux = sum(float(parts[self.process_of(r), 1]) for r in range(self.schedule.num_ranks))
        return float(value + aux)

    # -- timelines ----------------------------------------------------------------------------------
    def stage_times(self) -> Tuple[float, ...]:
        """Seconds of compute per virtual stage in the last step (this process's stages; 0 for others)."""
        times = [0.0] * len(self.split)
        for _, action, start, end in self.last_events:
            if action.is_compute:
                times[action.stage] += end - start
        return tuple(times)

    def measured_timeline(self) -> ScheduleTimeline:
        """The last step's real start/end of every action. Under msrun every process must call
        this (the records are all-gathered); the clock is the host's monotonic clock."""
        records = list(self.last_events)
        if not self.in_one_process and self.world.size > 1:
            records = self._gather_records()
        self.last_measured = ScheduleTimeline.from_records(records, num_ranks=self.schedule.num_ranks,
                                                   label=f"{self.schedule.kind} measured")
        self._measured_step = self._steps
        return self.last_measured

    def _gather_records(self) -> List[tuple]:
        longest = max(len(a) for a in self.schedule.actions)
        table = np.full((longest, 2), np.nan)
        for index, (_, _, start, end) in enumerate(self.last_events):
            table[index] = (start, end)
        gathered = self.runtime.gather_values(table)
        records = []
        for rank in range(self.schedule.num_ranks):  # each pipeline rank as its first process ran it
            rows = gathered[self.process_of(rank)]
            for index, action in enumerate(self.schedule.actions[rank]):
                records.append((rank, action, rows[index, 0], rows[index, 1]))
        return records

    def simulated_timeline(self, measured: Optional[ScheduleTimeline] = None) -> ScheduleTimeline:
        """The schedule simulated with the measured mean cost per (action kind, stage) and the
        measured p2p latency (`p2p_latency`) of `measured` (default: this process's last step)."""
        if measured is None:
            if not self.in_one_process and self._measured_step != self._steps:
                raise ValueError("simulated_timeline(): under msrun, call measured_timeline() on every process "
                                 "after the step first (each process holds only its own actions' times)")
            measured = self.last_measured if not self.in_one_process else \
                ScheduleTimeline.from_records(self.last_events, num_ranks=self.schedule.num_ranks)
        return simulate_schedule(self.schedule, measured=measured.mean_costs(), p2p=p2p_latency(measured))

    # -- rebalancing --------------------------------------------------------------------------------
    def _rebalancing(self) -> bool:
        if self.options.rebalance is not None:
            return self.options.rebalance
        return self.table is not None and self.table.config is not None and self.table.config.scheduler == "dynamic"

    def _rebalance(self, optimizer: nn.Optimizer) -> None:
        """Feed every stage's measured time to the planner; apply a move: the stages are re-cut
        at the new boundaries. In one process the optimizer holds every Parameter and its
        states, so nothing else moves; under msrun each moved layer's Parameters and optimizer
        states are sent from the process that ran it to every process (`_migrate`), and every
        process plans from the same all-gathered times, so all apply the same plan."""
        from mindspore_hyper.schedule.rebalance import LayerSpec, StageRebalancer

        if self._rebalancer is None:
            weights = self.layers.weights(self.network)
            specs = [LayerSpec(name, w, params) for name, w, params in
                     zip(self.layers.names, weights, self.layers.parameters)]
            self._rebalancer = StageRebalancer(specs, self.split)
        plan = self._rebalancer.observe(self._all_stage_times())
        if plan.is_empty:
            return
        if not self.in_one_process:
            self._migrate(plan, optimizer)
        self._build_stages(plan.after)
        self._rebalancer.commit(plan)
        self.rebalance_log.append(plan)

    def _all_stage_times(self) -> Tuple[float, ...]:
        times = np.asarray(self.stage_times(), dtype=np.float64)
        if not self.in_one_process and self.world.size > 1:
            times = self.runtime.gather_values(times).sum(axis=0)
        return tuple(float(t) for t in times)

    def _migrate(self, plan, optimizer: nn.Optimizer) -> None:
        """Bring each moved layer's Parameters and optimizer states (the optimizer's state
        Parameters named `<state>.<parameter name>`) from the process of its old stage to every
        process; counts the bytes in `migrated_bytes`."""
        states: Dict[str, List[Parameter]] = {}
        for _, state in optimizer.parameters_and_names():
            prefix, _, pname = state.name.partition(".")
            if pname and prefix:
                states.setdefault(pname, []).append(state)
        for move in plan.moves:
            src = self.schedule.stage_to_rank[move.source_stage]
            if src == self.schedule.stage_to_rank[move.target_stage]:
                continue
            for param in self.layers.cells[move.layer].trainable_params():
                for tensor in [param] + states.get(param.name, []):
                    value = self.runtime.broadcast_values(np.ascontiguousarray(tensor.asnumpy()), src)
                    # in place: after set_data, MindSpore's optimizer kernels keep updating the old buffer
                    ops.assign(tensor, Tensor(value, dtype=tensor.dtype))
                    self.migrated_bytes += int(value.nbytes)

    # -- report -----------------------------------------------------------------------------------
    def report(self, optimizer: Optional[nn.Optimizer] = None):
        """The last step's StepReport: memory per device of the stages it holds, the stages'
        collectives (axis named `axis@stageK`), the stage-boundary send/recv bytes (`p2p`) and
        the schedule's timeline with the measured per-stage costs (`timeline`)."""
        from mindspore_hyper.pipeline.report import pipeline_report

        return pipeline_report(self, optimizer)


def p2p_latency(timeline: ScheduleTimeline) -> float:
    """Median seconds from a send's start to its receive's end, over the transfers whose receiver
    was already waiting (so the time is the transfer's, not the receiver's lateness); 0 if none.
    In simulation all ranks share one process and transfers are dictionary puts (about 0)."""
    sends = {(e.action.tensor, e.lane): e for e in timeline.spans if e.action.kind is ActionKind.SEND}
    latencies = []
    for e in timeline.spans:
        if e.action.kind is ActionKind.RECV:
            send = sends.get((e.action.tensor, e.action.peer))
            if send is not None and e.start <= send.start:
                latencies.append(e.end - send.start)
    return float(np.median(latencies)) if latencies else 0.0


def _without_axis(mesh: Layout, axis: str) -> Optional[Layout]:
    """The mesh of one stage (the pipeline axis dropped; stage ranks in the order of the global
    ranks sharing a pipeline coordinate), or None when that is a single device."""
    a = mesh.axis_index(axis)
    keep = [i for i in range(mesh.ndim) if i != a]
    if not keep or all(mesh.device_matrix[i] == 1 for i in keep):
        return None
    return Layout(tuple(mesh.device_matrix[i] for i in keep), tuple(mesh.alias_names[i] for i in keep))
