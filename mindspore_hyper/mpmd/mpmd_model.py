"""MPMDModel: a model whose submodules run on their own device groups (HyperMPMD, simulation).

Each device group (a `process_groups` entry or a `strategy: mpmd` module entry) runs its Cells
on a mesh of its own ranks with its own strategy (`GroupRunner`), the group's rows resolved once into
the job's StrategyTable (`MPMDModel.table`) and each Cell's slice run. Activations crossing groups
are gathered from the producer's layout and laid out by the consumer's (forward; the gradient
goes back the same way). Parameter-free code between groups (a concat, the loss) runs on the
global tensors. Every step yields a per-group timeline (`GroupTimeline`): the measured forward
time of each group call, placed by data dependencies, so groups that do not read each other's
outputs overlap (`train_step` adds each call's measured backward after the backwards of the
calls that read its outputs). With `scheduler: dynamic`, measured group times feed a `GroupRebalancer` and
its device moves are applied between steps (a group re-sharded over more or fewer ranks: the
computation, hence the numerics, stays the same).
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, Optional, Tuple, Type

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindspore_hyper.autodiff import value_and_grad
from mindspore_hyper.comm.collective_cause import CLIP_NORM_CAUSE, GRAD_NORM_CAUSE
from mindspore_hyper.dtensor.accounting import Accounting
from mindspore_hyper.mpmd.group_runner import GroupRunner
from mindspore_hyper.mpmd.group_placement import (GroupPlacement, check_unshared_parameters, place_groups,
                                                   resolve_placements)
from mindspore_hyper.mpmd.rebalancing import DeviceRebalancing, RebalanceRecord, apply_device_plan
from mindspore_hyper.mpmd.gradient_norm import mpmd_grad_norm
from mindspore_hyper.mpmd.group_timeline import GroupTimeline
from mindspore_hyper.mpmd.mpmd_report import mpmd_report
from mindspore_hyper.runtime import loss_scale as scaling
from mindspore_hyper.runtime.grad_clip import check_max_norm
from mindspore_hyper.runtime.gradient_sync import GradientSync
from mindspore_hyper.runtime.guarded_update import guarded_update
from mindspore_hyper.runtime.optimizer_check import check_optimizer, optimizer_gradients
from mindspore_hyper.runtime.parallel_model import check_loss
from mindspore_hyper.runtime.report import StepReport
from mindspore_hyper.runtime.training_options import refuse_unsupported
from mindspore_hyper.schedule.rebalance import GroupSharePlan, RebalancePolicy
from mindspore_hyper.shard.model_strategy import Strategy
from mindspore_hyper.strategy.resolve import StrategyTable

__all__ = ["MPMDModel", "RebalanceRecord"]

HOST = "<between groups>"  # source of tensors computed by parameter-free code between groups


class MPMDModel(nn.Cell):
    """`network` with its device groups run as separate programs (see module docstring).

    Args:
        network: the model; every Cell with parameters must belong to a device group.
        table: the job's StrategyTable, resolved from a config holding the groups (`table.config`);
            each group's rows are resolved into it here, once, on the group's own mesh
            (`resolve_placements`), and each group's runtime runs its slice. Its `optimizer_states`
            are the memory reports' assumption.
        runtime: the simulation runtime.
        group_strategies: optional explicit Strategy per group name (mesh size = group size;
            override patterns name parameters relative to each of the group's Cells);
            default: data parallel over the group's ranks.
        policy: the dynamic scheduler's thresholds and smoothing.
        runner_class: how a group runs: `GroupRunner` (simulation, every group in this process)
            or `DistributedGroupRunner` (msrun, this process's group only).

    Raises:
        ValueError: see `place_groups` and `resolve_placements` (a group strategy that does not fit
            its Cells, naming the group and the strategy's field); `scheduler: dynamic` on a group
            with an explicit strategy.
    """

    def __init__(self, network: nn.Cell, table: StrategyTable, runtime,
                 group_strategies: Optional[Mapping[str, Strategy]] = None,
                 policy: RebalancePolicy = RebalancePolicy(), runner_class: Type[GroupRunner] = GroupRunner):
        super().__init__(auto_prefix=False)
        config = table.config
        self.network = network
        self.config = config
        self.table = table
        self.runtime = runtime
        self._zero = config.optimizer_sharding is not None
        placements = place_groups(network, config, group_strategies)
        if not runtime.in_one_process():
            check_unshared_parameters(network, placements)
        for p in placements:
            if p.group.scheduler == "dynamic" and p.explicit:
                raise ValueError(f"{p.group.path}.scheduler: dynamic moves devices between data-parallel groups; "
                                 f"group {p.name!r} has an explicit strategy (drop it or use scheduler: static)")
        resolve_placements(table, network, placements)
        self.runners: Dict[str, GroupRunner] = {
            p.name: runner_class(network, p, runtime, table, self._on_call) for p in placements}
        # a scalar the training step also differentiates, so each group's backward end is marked
        self.__dict__["_anchor"] = Parameter(Tensor(0.0, ms.float32), name="mpmd_backward_anchor")
        for runner in self.runners.values():
            runner.on_output_gradient = self._on_output_gradient
            runner.on_backward_end = self._on_backward_end
            runner.backward_anchor = self._anchor
        dynamic = [p.name for p in placements if p.group.scheduler == "dynamic"]
        self.rebalancing = DeviceRebalancing(self.runners, dynamic, policy, self._zero) if len(dynamic) >= 2 else None
        self.steps = 0
        self.last_step_seconds = 0.0  # wall time of the last forward, or of the whole last train_step
        self.last_grad_norm: Optional[float] = None  # global gradient norm (every group) of the last train_step
        self.last_step_skipped = False  # the last train_step's update was skipped (loss scaling overflow)
        self.last_gradients: Dict[str, Any] = {}
        self._needs_loss = False  # set by train_step: the forward must return a scalar loss
        self._loss_factor: Optional[float] = None  # set by train_step under loss scaling
        # the global norm's scalar all-reduce over the job's mesh, recorded here (its report rows)
        self.norm_sync = GradientSync(Accounting(config.mesh.size),
                                      None if runtime.in_one_process() else runtime.make_collectives(config.mesh))
        self._reset_step(())

    # -- the forward -------------------------------------------------------------------------
    def construct(self, *inputs):
        start = time.perf_counter()
        self._reset_step(inputs)
        for runner in self.runners.values():
            runner.begin_step(inputs)
        result = self.network(*inputs)
        if self._needs_loss:  # inside train_step: refused before any backward runs
            check_loss(result, "train_step")
        if self._loss_factor is not None:
            result = result * self._loss_factor
        self.last_step_seconds = time.perf_counter() - start
        return result

    def _reset_step(self, inputs) -> None:
        self.norm_sync.accounting.reset_step()
        self.timeline = GroupTimeline(tuple(self.runners))
        self._raw = {id(x) for x in inputs if isinstance(x, Tensor)}
        self._produced: Dict[int, int] = {}
        self._keep: List[Any] = list(inputs)  # keeps ids unique while the step runs
        self.cross_group_bytes: Dict[Tuple[str, str], int] = {}
        self.group_seconds: Dict[str, float] = {name: 0.0 for name in self.runners}
        self.group_batches: Dict[str, List[int]] = {name: [] for name in self.runners}
        self._arrivals: List[Tuple[float, int]] = []  # (perf_counter, task index) when the backward reached a call
        self._ends: Dict[int, float] = {}  # task index -> when the backward left the call

    def _on_call(self, runner: GroupRunner, cell: str, args: tuple, out, seconds: float) -> None:
        deps = set()
        for arg in args:
            if not isinstance(arg, Tensor) or id(arg) in self._raw:
                continue
            if id(arg) in self._produced:
                task = self._produced[id(arg)]
                deps.add(task)
                source = self.timeline.spans[task].lane
            else:  # computed between groups: conservatively after everything before it
                deps.update(range(len(self.timeline.spans)))
                source = HOST
            if source != runner.name:
                key = (source, runner.name)
                self.cross_group_bytes[key] = self.cross_group_bytes.get(key, 0) + arg.nbytes
        index = self.timeline.add(runner.name, f"{cell} forward", seconds, deps)
        for o in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, Tensor):
                self._produced[id(o)] = index
                self._keep.append(o)
        self._keep.extend(args)
        self.group_seconds[runner.name] += seconds
        self.group_batches[runner.name].extend(runner.batch_sizes(args))
        return index

    def _on_output_gradient(self, index: int) -> None:
        self._arrivals.append((time.perf_counter(), index))

    def _on_backward_end(self, index: int) -> None:
        self._ends.setdefault(index, time.perf_counter())

    def _place_backward(self, finished: float) -> None:
        """Add each group call's backward to the timeline. The backward runs the recorded ops in
        reverse, so a call's backward lasts from the moment autograd reaches its outputs to the
        moment it passes its first floating-point input (marked by `_BackwardEnd`); without such
        an input, to the next call's start (or the end of the backward). It follows the
        backwards of the calls that read its outputs, or, when only the loss does, the whole
        forward."""
        first: Dict[int, float] = {}
        for t, i in self._arrivals:
            first[i] = min(t, first.get(i, t))
        times = sorted(first.values())
        forward = list(self.timeline.spans)
        placed: Dict[int, int] = {}
        for i in sorted(first, key=first.get):
            start = first[i]
            end = self._ends.get(i) or next((t for t in times if t > start), finished)
            consumers = [placed[j] for j, t in enumerate(forward) if i in t.args["depends_on"] and j in placed]
            task = forward[i]
            label = task.label[:-len(" forward")] if task.label.endswith(" forward") else task.label
            placed[i] = self.timeline.add(task.lane, f"{label} backward", end - start,
                                          consumers or range(len(forward)))

    # -- training ----------------------------------------------------------------------------
    def optimizer_parameters(self) -> List[Parameter]:
        """The Parameters an optimizer must update: those of the groups this process belongs to
        (every group in simulation; under msrun, this process's group), each once (a Parameter
        the Cells of two groups share, in simulation)."""
        mine = [cell for runner in self.runners.values() if getattr(runner, "member", True)
                for cell in runner.cells.values()]
        return list({id(p): p for cell in mine for p in cell.trainable_params()}.values())

    def train_step(self, optimizer: nn.Optimizer, *inputs, max_grad_norm: Optional[float] = None,
                   accumulation_steps: int = 1, loss_scale=None) -> Tensor:
        """One training step, as `ParallelModel.train_step`: forward (the model returns the
        loss), backward through every group, optimizer update, then, under `scheduler: dynamic`,
        one rebalancing decision applied before the next step. Sets `last_gradients`,
        `last_grad_norm` (the global norm before clipping over every group, each element counted
        once, see `gradient_norm.py`) and `last_step_skipped`.

        Args:
            optimizer: built on `optimizer_parameters()`.
            *inputs: the model's inputs.
            max_grad_norm: clip the gradients to this global norm over every group (as
                `mindspore.ops.clip_by_global_norm` on one device), or None.
            accumulation_steps: 1 (gradient accumulation is not supported by MPMD yet).
            loss_scale: None, a number >= 1 or a `mindspore.amp` loss scaler (see
                `ParallelModel.train_step`): the loss scaled before the backward, the gradients
                unscaled, the update skipped (in every process) when a gradient of any group is
                not finite.

        Returns:
            The loss (unscaled).

        Raises:
            ValueError: the optimizer is not built on `optimizer_parameters()`; the model returns
                something else than a scalar loss (before any backward or update runs); a bad
                `max_grad_norm` or `loss_scale`; `accumulation_steps` other than 1.
        """
        refuse_unsupported("MPMD", accumulation_steps=accumulation_steps,
                           accumulation_hint="pass the whole batch to one step (each group splits it over its "
                                             "own ranks)")
        if max_grad_norm is not None:
            max_grad_norm = check_max_norm(max_grad_norm, "max_grad_norm")
        scaler = scaling.as_loss_scaler(loss_scale)
        mine = self.optimizer_parameters()
        check_optimizer(optimizer, mine, mine, self.config.optimizer_sharding, "train_step")
        start = time.perf_counter()
        factor = scaling.scale_value(scaler) if scaler is not None else None
        # gradients of every parameter (also other groups' unused copies under msrun), so the
        # backward takes the same path in every process and cross-group gradients meet
        weights = tuple(self.network.trainable_params())
        if getattr(self, "_grad_fn", None) is None or self._grad_weights != weights:
            self._grad_fn = value_and_grad(self, None, weights + (self._anchor,))
            self._grad_weights = weights
        self._needs_loss, self._loss_factor = True, factor
        try:
            loss, grads = self._grad_fn(*inputs)
        finally:
            self._needs_loss, self._loss_factor = False, None
        grads = grads[:-1]  # the anchor's (zero) gradient
        self._place_backward(time.perf_counter())
        if factor is not None:
            loss = loss / factor
            grads = tuple(scaling.unscale(g, factor) for g in grads)
        self._update(optimizer, weights, grads, scaler, max_grad_norm)
        self.last_step_seconds = time.perf_counter() - start
        return loss

    def optimizer_step(self, optimizer: nn.Optimizer, max_grad_norm: Optional[float] = None) -> None:
        """The rest of a step whose backward ran as torch-style `loss.backward()` (under
        `enable_mindspore_backward_compat()`): `loss = model(*inputs); loss.backward();
        model.optimizer_step(optimizer)` equals `train_step(optimizer, *inputs)`. Takes each
        Parameter's `param.grad` (none: zero, as `value_and_grad` gives), then does what `train_step`
        does after its backward, and clears the gradients (torch's `zero_grad(set_to_none=True)`;
        two backwards before it add up). Loss scaling is the caller's (scale the loss, unscale).

        Args:
            optimizer: built on `optimizer_parameters()`.
            max_grad_norm: clip the gradients to this global norm over every group, or None.

        Raises:
            ValueError: the optimizer is not built on `optimizer_parameters()`; a bad `max_grad_norm`.
            RuntimeError: no Parameter of the model has a gradient (no `loss.backward()` since the
                last update).
        """
        if max_grad_norm is not None:
            max_grad_norm = check_max_norm(max_grad_norm, "max_grad_norm")
        mine = self.optimizer_parameters()
        check_optimizer(optimizer, mine, mine, self.config.optimizer_sharding, "optimizer_step")
        # every parameter, as train_step's value_and_grad (under msrun other groups' unused copies get zeros)
        weights = tuple(self.network.trainable_params())
        accumulated = [w._grad for w in weights]  # pylint: disable=protected-access  # what `param.grad` reads
        if all(g is None for g in accumulated):
            raise RuntimeError("optimizer_step: no Parameter of the model has a gradient; run loss.backward() on the "
                               "loss this model returned (after enable_mindspore_backward_compat()) first, or use "
                               "train_step(optimizer, *inputs)")
        self._place_backward(time.perf_counter())
        grads = tuple(ops.zeros_like(w) if g is None else g for w, g in zip(weights, accumulated))
        for w in weights + (self._anchor,):
            w._grad = None  # pylint: disable=protected-access
        self._update(optimizer, weights, grads, None, max_grad_norm)

    def _update(self, optimizer: nn.Optimizer, weights: tuple, grads: tuple, scaler, max_grad_norm) -> None:
        """The step after its backward: `last_gradients` (this process's groups), the global norm,
        the (clipped, unless skipped) update, the wait for the sends and the rebalancing decision."""
        held = {id(p) for p in self.optimizer_parameters()}
        self.last_gradients = {w.name: g.asnumpy() for w, g in zip(weights, grads) if id(w) in held}
        norm = mpmd_grad_norm(self, grads, GRAD_NORM_CAUSE if max_grad_norm is None else CLIP_NORM_CAUSE)
        guarded_update(self, grads, norm, scaler, max_grad_norm,
                       lambda g: optimizer(optimizer_gradients(optimizer, {id(w): g_w for w, g_w in zip(weights, g)})))
        self.steps += 1
        self.end_step()
        self.rebalance()

    def end_step(self) -> None:
        """After the optimizer step (under msrun: wait until this process's cross-group sends left)."""
        for runner in self.runners.values():
            runner.end_step()

    def rebalance(self) -> Optional[RebalanceRecord]:
        """Feed the last step's measured group times to the dynamic scheduler and apply its plan
        (see `DeviceRebalancing.step`). Returns the decision, or None."""
        if self.rebalancing is None:
            return None
        return self.rebalancing.step(self.steps, self.group_seconds, self.group_batches)

    @property
    def rebalances(self) -> List[RebalanceRecord]:
        return self.rebalancing.records if self.rebalancing is not None else []

    def apply(self, plan: GroupSharePlan) -> None:
        """Move devices between groups as `plan` says (see `apply_device_plan`)."""
        apply_device_plan(self.runners, plan, self._zero)

    def placements(self) -> Dict[str, GroupPlacement]:
        return {n: r.placement for n, r in self.runners.items()}

    def report(self, optimizer: Optional[nn.Optimizer] = None) -> StepReport:
        """The last step's StepReport: memory per global rank of the groups it holds (each
        group's Cells summed), the groups' collectives (mesh axis named `axis@group`), and the
        MPMD section `report.mpmd` (an `MPMDSection`: per-group ranks and forward times,
        cross-group bytes, the per-group timeline, the dynamic scheduler's decisions).

        Args:
            optimizer: the training optimizer (its real states are counted), or None (each
                group's `optimizer_states` per parameter assumed).

        Raises:
            ValueError: the optimizer updates none of `optimizer_parameters()`.
        """
        if optimizer is not None:
            mine = self.optimizer_parameters()
            check_optimizer(optimizer, mine, mine, self.config.optimizer_sharding, "report")
        return mpmd_report(self, optimizer)
