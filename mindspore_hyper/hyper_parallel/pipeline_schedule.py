"""Upstream's pipeline schedules (`ScheduleGPipe`, `Schedule1F1B`, `ScheduleInterleaved1F1B`)
over this package's schedules as data and stage runner.

A schedule holds this rank's PipelineStages (one; several for the interleaved schedule, stage
s living on pipeline rank s % p, upstream's "loop" placement). `run(*inputs)` on the rank of
stage 0 (plain `run()` on the others) splits the inputs into microbatches, executes the rank's
action list of the package's `Schedule` of that family (`mindspore_hyper.schedule`), sending
activations and gradients to the neighbouring ranks, and returns, on the rank of the last
stage, its output for each microbatch (upstream's losses; [] elsewhere). Each Parameter's
gradient, summed over the microbatches, is added to its `.grad` (set `param.grad = None` to
start afresh), as upstream's stages leave it for the optimizer.

Under msrun each process is one pipeline rank; in a per-rank simulation (`mindspore-hyper run
--devices N --per-rank`, rank_threads.py) each thread is one. The plain simulation runs a script
once for all devices, while a PipelineStage is one rank's stage (upstream's scripts build it
from their rank): `run()` there is refused with the script's line. `run_ranks_in_process`
executes every rank's schedule of one step in this process (the same runner, in-process).

Under msrun a refusal on one rank reaches every rank (pipeline/step_refusal.py): the step's
checks (inputs, microbatches, the rank's block) run on every process and are agreed on by a tiny
all-gather before any transfer; a rank that fails during the step (a stage refusing its output,
any error in a stage) sends its refusal in place of the tensors it still owes, and each rank
waiting for one raises it and passes it on. Every rank raises the same exception class naming
the refusing rank. After such a step the pipeline's channels may still hold its tensors, so a
later step in the same job is refused on every rank.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from mindspore import Tensor

from mindspore_hyper.hyper_parallel.pipeline_activations import WireRoute
from mindspore_hyper.hyper_parallel.pipeline_microbatches import check_batch_dims, split_inputs
from mindspore_hyper.hyper_parallel.pipeline_stage import PipelineStage, stage_computation
from mindspore_hyper.hyper_parallel.pipeline_steps import meta_steps
from mindspore_hyper.hyper_parallel.rank_threads import per_rank_transport, thread_rank
from mindspore_hyper.hyper_parallel.session import RankDependentError, holds_all_ranks, job_size, mesh_of, script_line
from mindspore_hyper.pipeline.runner import StageRunner
from mindspore_hyper.pipeline.stage_transport import LocalTransport
from mindspore_hyper.pipeline.step_refusal import agree
from mindspore_hyper.schedule.build import build_schedule

__all__ = ["ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "run_ranks_in_process"]

class _PipelineSchedule:
    """What the three schedules share (see module docstring); `_KIND`: the package's family."""

    _KIND = ""
    _failed_step: Optional[str] = None  # under msrun: why a step failed after its transfers began (this process)

    def __init__(self, stages, micro_batch_num: int, args_batch_dim=None, kwargs_batch_dim=None,
                 output_concat_dim=None):
        name = type(self).__name__
        self.stages = self._check_stages(stages)
        if isinstance(micro_batch_num, bool) or not isinstance(micro_batch_num, int) or micro_batch_num < 1:
            raise ValueError(f"{name}: micro_batch_num must be a positive int, but got {micro_batch_num!r}")
        if kwargs_batch_dim is not None:
            raise ValueError(f"{name}(kwargs_batch_dim=...): keyword inputs to run() are not supported yet; pass the "
                             f"inputs positionally (args_batch_dim)")
        if output_concat_dim is not None:
            raise ValueError(f"{name}(output_concat_dim=...): concatenating the microbatch outputs is not supported; "
                             f"run() returns one output per microbatch")
        self._batch_dims = check_batch_dims(args_batch_dim)
        self.micro_batch_num = micro_batch_num
        self.n_local_stages = len(self.stages)
        stage_num = self.stages[0].stage_num
        if any(s.stage_num != stage_num for s in self.stages):
            raise ValueError(f"{name}: the stages disagree on stage_num ({[s.stage_num for s in self.stages]})")
        if stage_num % self.n_local_stages:
            raise ValueError(f"{name}: {self.n_local_stages} stages per rank do not divide stage_num={stage_num}")
        self.real_stage_num = stage_num // self.n_local_stages
        self.pipeline_rank = self.stages[0].stage_index % self.real_stage_num
        expected = [self.pipeline_rank + c * self.real_stage_num for c in range(self.n_local_stages)]
        if sorted(s.stage_index for s in self.stages) != expected:
            raise ValueError(f"{name}: a rank holds stages r, r + p, r + 2p, ... (p={self.real_stage_num} pipeline "
                             f"ranks); got stage indices {[s.stage_index for s in self.stages]}, expected {expected}")
        chunks = self._chunks(self.n_local_stages)
        try:
            self.schedule = build_schedule(self._KIND, self.real_stage_num, micro_batch_num, chunks)
        except ValueError as exc:
            raise ValueError(f"{name} with {self.real_stage_num} pipeline ranks and micro_batch_num="
                             f"{micro_batch_num}: {exc}") from None
        self._route = WireRoute()
        self._computations = {s.stage_index: stage_computation(s, self._route) for s in self.stages}
        self._transport = None

    @staticmethod
    def _check_stages(stages) -> List[PipelineStage]:
        stages = [stages] if isinstance(stages, PipelineStage) else stages
        if not isinstance(stages, (list, tuple)) or not stages or not all(isinstance(s, PipelineStage) for s in stages):
            raise TypeError(f"stages must be a PipelineStage or a non-empty list/tuple of PipelineStage, but got "
                            f"{stages!r}")
        return sorted(stages, key=lambda s: s.stage_index)

    def _chunks(self, n_local: int) -> int:
        if n_local != 1:
            raise ValueError(f"{type(self).__name__} runs one stage per rank, but got {n_local}; use "
                             f"ScheduleInterleaved1F1B for several")
        return 1

    @property
    def exec_order(self) -> Dict[int, list]:
        """Every pipeline rank's execution order as upstream's MetaSteps (read-only)."""
        return meta_steps(self.schedule)

    @exec_order.setter
    def exec_order(self, value) -> None:
        raise ValueError("exec_order: running a hand-made MetaStep order is not supported yet; use ScheduleGPipe, "
                         "Schedule1F1B or ScheduleInterleaved1F1B")

    @property
    def holds_first_stage(self) -> bool:
        return self.stages[0].is_first_stage

    # -- one step ---------------------------------------------------------------------------------
    def _microbatches(self, args, kwargs) -> list:
        name = type(self).__name__
        if kwargs:
            raise ValueError(f"{name}.run(): keyword inputs ({sorted(kwargs)}) are not supported yet; pass them "
                             f"positionally")
        if self.holds_first_stage and not args:
            raise ValueError(f"{name}.run(): this rank holds stage 0, which takes the step's inputs: run(*inputs)")
        if args and not self.holds_first_stage:
            raise ValueError(f"{name}.run(): inputs given on pipeline rank {self.pipeline_rank}, which does not hold "
                             f"stage 0; call run() without inputs here")
        if not args:
            return [()] * self.micro_batch_num
        return split_inputs(args, self.micro_batch_num, self._batch_dims)

    def _start(self, microbatches, transport) -> StageRunner:
        for c in self._computations.values():
            c.reset()
        runner = StageRunner(self.schedule, self.pipeline_rank, self._computations, transport, all_inputs=True)
        runner.start_step(microbatches)
        return runner

    def _finish(self) -> List[Tensor]:
        """Add the step's gradients to the Parameters' `.grad`; the last stage's outputs."""
        outputs: List[Tensor] = []
        for c in self._computations.values():
            for param in c.params:
                g = c.grads.get(id(param))
                if g is not None:
                    held = getattr(param, "grad", None)
                    param.grad = g if held is None else held + g
            outputs += c.outputs
        return outputs

    def _process_transport(self):
        """This rank's transport to its neighbouring pipeline ranks: with d = devices / pipeline
        ranks, pipeline rank q runs on the job's ranks q*d .. q*d+d-1 (upstream's contiguous
        blocks), and the rank at position i of its block exchanges with position i of the
        neighbouring blocks.

        Raises:
            RankDependentError: in the plain simulation (see module docstring).
            ValueError: the pipeline ranks do not divide the job, or this rank holds another block's stages.
        """
        if self._transport is not None:
            return self._transport
        me = thread_rank()
        if me is not None:  # a per-rank simulation: this thread is one rank
            per_block = self._check_rank(me, job_size())
            self._route.rank = me  # a stage without a laid-out Parameter takes a DTensor on its own block
            self._transport = _PeerMapped(per_rank_transport(), _peer_map(me, per_block))
        elif holds_all_ranks():
            raise RankDependentError(
                f"{script_line()}: {type(self).__name__}.run() runs one rank's pipeline stages, and the simulation "
                f"runs the script once for all devices (a script builds its stage from its rank). Run it once per "
                f"rank: mindspore-hyper run --devices {self.real_stage_num} --per-rank SCRIPT, or under msrun: "
                f"mindspore-hyper run --processes {self.real_stage_num} SCRIPT")
        else:
            from mindspore_hyper.pipeline.stage_transport import ShmTransport, peer_pairs
            from mindspore_hyper.runtime.distributed.world import world

            w = world()
            per_block = self._check_rank(w.rank, w.size)
            self._route.local_pieces = True  # a DTensor activation travels as this rank's piece, with a header
            self._route.rank = w.rank
            peer_of = _peer_map(w.rank, per_block)
            pairs = [(peer_of(a), peer_of(b)) for a, b in peer_pairs(self.schedule)]
            self._transport = ShmTransport(w, pairs, peer_of=peer_of)
        return self._transport

    def _check_rank(self, rank: int, size: int) -> int:
        """The devices per pipeline rank; raise unless they divide the job, `rank` lies in the block
        of these stages' pipeline rank, and every laid-out Parameter of the stages lies on it.

        Raises:
            ValueError: naming what does not fit.
        """
        name, p = type(self).__name__, self.real_stage_num
        if size % p:
            raise ValueError(f"{name}: {p} pipeline ranks do not divide the job's {size} devices (each pipeline "
                             f"rank runs devices / {p} of them, in contiguous blocks)")
        per_block = size // p
        block = range(self.pipeline_rank * per_block, (self.pipeline_rank + 1) * per_block)
        if rank not in block:
            raise ValueError(f"{name}: rank {rank} holds stage(s) {[s.stage_index for s in self.stages]}, which "
                             f"belong to pipeline rank {self.pipeline_rank} (ranks {block.start}..{block.stop - 1}: "
                             f"stage s runs on the ranks of block s % {p}, {per_block} per block)")
        for stage in self.stages:
            for param in stage.submodule.trainable_params():
                mesh = mesh_of(param)
                if mesh is not None and not set(mesh.members) <= set(block):
                    raise ValueError(f"{name}: Parameter {param.name!r} of stage {stage.stage_index} is laid out on "
                                     f"ranks {list(mesh.members)}, outside its pipeline rank's ranks "
                                     f"{block.start}..{block.stop - 1}: build the stage's mesh on its block "
                                     f"(init_device_mesh with the block's size)")
        return per_block

    def run(self, *args, **kwargs) -> List[Tensor]:
        """One step over `micro_batch_num` microbatches (see module docstring).

        Args:
            *args: on the rank of stage 0, the step's inputs (split along their batch
                dimension; a DTensor per device, keeping its placements:
                pipeline_microbatches.py); nothing on the other ranks.

        Returns:
            On the rank of the last stage, its output for each microbatch; else [].

        Raises:
            RankDependentError: in the one-process simulation (names the script's line).
            ValueError: inputs on the wrong rank, keyword inputs, a batch the microbatches do not
                divide (a DTensor's: on some device), a stage returning something else than one
                Tensor or DTensor, or (under msrun) a DTensor activation that cannot travel (a
                layout too large for its header; a receiving stage whose mesh has another shape
                than the sender's: pipeline_activations.py).
            RuntimeError: (one process per device) an earlier step of the job failed.
            Under msrun, what any rank raises (before or during the step) is raised on every
            rank: the same class, naming the refusing rank and carrying its message.
        """
        processes = self._processes()
        if processes is None:
            microbatches = self._microbatches(args, kwargs)
        else:  # every process checks its step and learns whether all passed before any transfer
            microbatches = agree(lambda: self._checked_step(args, kwargs, processes),
                                 processes.communicator(tuple(range(processes.size))), processes.rank)
        transport = self._process_transport()
        counts: Dict[int, int] = {}
        for a in self.schedule.actions[self.pipeline_rank]:
            if a.kind.value == "recv":
                counts[a.peer] = counts.get(a.peer, 0) + 1
        transport.expect(counts)
        runner = self._start(microbatches, transport)
        try:
            runner.advance(blocking=True)
            transport.flush()
        except Exception as exc:
            abort = getattr(transport, "abort", None)  # between processes: tell the peers still waiting
            if abort is not None:
                _PipelineSchedule._failed_step = str(exc)
                abort([(a.tensor, a.peer) for a in runner.actions[runner.pc:] if a.kind.value == "send"], exc)
            raise
        return self._finish()

    @staticmethod
    def _processes():
        """The job's World where each process is one rank (msrun), else None."""
        if thread_rank() is not None or holds_all_ranks():
            return None
        from mindspore_hyper.runtime.distributed.world import world

        return world()

    def _checked_step(self, args, kwargs, processes) -> list:
        """The step's microbatches after the checks every process agrees on under msrun.

        Raises:
            RuntimeError: an earlier step failed after its transfers began.
            ValueError: as `run` and `_check_rank`.
        """
        if _PipelineSchedule._failed_step is not None:
            raise RuntimeError(f"{type(self).__name__}.run(): an earlier pipeline step of this job failed "
                               f"({_PipelineSchedule._failed_step}); its tensors may still be in flight between the "
                               f"ranks, so no pipeline step runs again in this job: restart it")
        microbatches = self._microbatches(args, kwargs)
        self._check_rank(processes.rank, processes.size)
        return microbatches


def _peer_map(rank: int, per_block: int):
    """The job rank of pipeline rank q's device at `rank`'s position in its block."""
    return lambda q: q * per_block + rank % per_block


class _PeerMapped:
    """A transport addressed by pipeline ranks over one addressed by the job's ranks."""

    def __init__(self, inner, peer_of):
        self.inner, self.peer_of = inner, peer_of

    def send(self, src: int, key, value: Tensor, peer: int) -> None:
        self.inner.send(src, key, value, self.peer_of(peer))

    def recv(self, key, peer: int):
        return self.inner.recv(key, self.peer_of(peer))

    def expect(self, counts) -> None:
        self.inner.expect({self.peer_of(q): n for q, n in counts.items()})

    def flush(self) -> None:
        self.inner.flush()


class ScheduleGPipe(_PipelineSchedule):
    """GPipe: every microbatch's forward, then every backward (one stage per rank)."""

    _KIND = "gpipe"


class Schedule1F1B(_PipelineSchedule):
    """1F1B: after a warm-up of forwards, one forward and one backward alternate (one stage per
    rank; micro_batch_num >= the number of pipeline ranks)."""

    _KIND = "1f1b"


class ScheduleInterleaved1F1B(_PipelineSchedule):
    """Interleaved 1F1B: v stages per rank (stage s on rank s % p); with one stage per rank it
    is 1F1B. micro_batch_num must be a multiple of the number of pipeline ranks."""

    _KIND = "interleaved_1f1b"

    def _chunks(self, n_local: int) -> int:
        return n_local

    def __init__(self, stages, micro_batch_num: int, args_batch_dim=None, kwargs_batch_dim=None,
                 output_concat_dim=None):
        n_local = len(stages) if isinstance(stages, (list, tuple)) else 1
        self._KIND = "1f1b" if n_local == 1 else "interleaved_1f1b"
        super().__init__(stages, micro_batch_num, args_batch_dim, kwargs_batch_dim, output_concat_dim)


def run_ranks_in_process(schedules: Sequence[_PipelineSchedule], *args) -> List[Tensor]:
    """One step of every pipeline rank's schedule, in this process over in-process transfers.

    Args:
        schedules: one schedule per pipeline rank (any order), of one family and microbatch count.
        *args: the step's inputs (for the rank of stage 0).

    Returns:
        The last stage's output for each microbatch.

    Raises:
        ValueError: not exactly one schedule per pipeline rank, or the schedules disagree.
        RuntimeError: no rank can progress (an invalid schedule).
    """
    by_rank = {s.pipeline_rank: s for s in schedules}
    first = schedules[0]
    if sorted(by_rank) != list(range(first.real_stage_num)) or len(schedules) != first.real_stage_num or any(
            s.schedule != first.schedule for s in schedules):
        raise ValueError(f"run_ranks_in_process: expected one schedule of the same family and micro_batch_num per "
                         f"pipeline rank 0..{first.real_stage_num - 1}, got ranks {sorted(by_rank)}")
    transport = LocalTransport(first.real_stage_num)
    runners = [s._start(s._microbatches(args if s.holds_first_stage else (), {}), transport)
               for s in by_rank.values()]
    while not all(r.done for r in runners):
        if sum(r.advance(blocking=False) for r in runners) == 0:
            stuck = {r.rank: str(r.actions[r.pc]) for r in runners if not r.done}
            raise RuntimeError(f"pipeline: no rank can progress (waiting: {stuck})")
    outputs: List[Tensor] = []
    for s in by_rank.values():
        outputs += s._finish()
    return outputs
