"""PPOTrainer: the PPO step with each RLHF role on its device group (HyperMPMD, simulation or msrun).

Roles map to device groups by the config's `modules` patterns (the RLHF config: `actor` on ranks
0-7, `critic` on 8-11, `reward_model` on 12-15). A role no group names is colocated with
another role's group (default: the frozen `reference` time-shares the actor's devices). Each
group runs its roles data parallel over its ranks. Every unit of work (a generation step, a
scoring pass, a role's update) is timed and placed on a per-group timeline: a unit starts when
its group is free and the previous phase has finished, so disjoint groups overlap (reward,
critic and the actor's scoring; the actor's and the critic's updates) while colocated roles
queue on their shared group. The numbers are those of the roles run one after another
(`ppo_step` on the bare Cells).

Under msrun (`mode="distributed"`) each process belongs to one group and runs only its roles
(data parallel over the group's processes); each phase's results cross groups point-to-point
(`ProcessPhases`), so disjoint groups compute at the same time in their processes, and
`phases.events` holds the measured start and end of every unit and wait. With `scheduler:
dynamic` under msrun no process changes group: the frozen roles' scoring (reward score,
reference log-probs) is split by rows between the dynamic groups, and each group's share of
the rows moves between steps by the planner's decision on the measured scoring times, gathered
to every process (`ShareRebalancing`).
"""
from __future__ import annotations

import os
import time
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
from mindspore import Tensor, nn

from mindspore_hyper.context import get_context
from mindspore_hyper.rlhf.models import PPOModels
from mindspore_hyper.rlhf.ppo import PHASES, PPOResult, PPOSettings, Unit, ppo_step
from mindspore_hyper.rlhf.process_phases import ProcessPhases
from mindspore_hyper.mpmd import check_mpmd_enabled
from mindspore_hyper.mpmd.group_runner import GroupRunner
from mindspore_hyper.mpmd.group_placement import place_groups, resolve_placements
from mindspore_hyper.mpmd.rebalancing import DeviceRebalancing, RebalanceRecord
from mindspore_hyper.mpmd.share_rebalancing import ShareRebalancing, gather_group_seconds, proportional_shares
from mindspore_hyper.mpmd.group_timeline import GroupTimeline
from mindspore_hyper.runtime.modes import runtime_for
from mindspore_hyper.schedule.rebalance import RebalancePolicy
from mindspore_hyper.strategy.config import ParallelConfig, load_parallel_config
from mindspore_hyper.strategy.resolve import resolve_strategy

__all__ = ["PPOTrainer", "ROLES"]

ROLES = ("actor", "critic", "reward_model", "reference")


class PPOTrainer:
    """Runs `ppo_step` with the roles on their device groups (see module docstring).

    Args:
        models: the four roles.
        config: a ParallelConfig or YAML path/mapping with the groups (e.g.
            configs/rlhf_process_groups.yaml); its mesh size must equal context `device_num`.
        colocate: role -> role whose group it shares, for roles no group names.
        settings: PPO hyper-parameters.
        actor_lr, critic_lr: Adam learning rates.
        policy: the dynamic scheduler's thresholds (groups with `scheduler: dynamic`): device moves in
            simulation; under msrun, moves of the frozen roles' scoring rows between the groups.

    Attributes:
        table: the job's StrategyTable, every group's rows resolved on the group's own mesh.
        phases: under msrun, this process's `ProcessPhases` (measured events); None in simulation.
        timeline: in simulation, the last step's per-group timeline.

    Raises:
        ValueError: a mode other than simulation / distributed, hyper_mpmd off, a device_num (simulation) or
            process count (msrun) mismatch, a role without a group, a bad `colocate` entry, and under msrun:
            a single dynamic group, ZeRO-1 or a group `hardware` other than the process's (named in the message).
    """

    def __init__(self, models: PPOModels, config: Union[ParallelConfig, str, os.PathLike, dict],
                 colocate: Optional[Mapping[str, str]] = None, settings: PPOSettings = PPOSettings(),
                 actor_lr: float = 1e-3, critic_lr: float = 1e-3, policy: RebalancePolicy = RebalancePolicy()):
        mode = get_context("mode")
        runtime = runtime_for(mode)  # the one look-up of the mode: below, only the runtime is asked
        if runtime is None or not runtime.runs_op_by_op():
            raise ValueError(f"PPOTrainer runs its device groups in simulation or under msrun (distributed); mode="
                             f"{mode!r}")
        config = load_parallel_config(config)
        check_mpmd_enabled(config.groups)
        if not config.groups:
            raise ValueError("config: no device groups (process_groups); PPOTrainer places each role on a group")
        if runtime.in_one_process() and config.mesh.size != runtime.device_count():
            raise ValueError(f"config: the mesh has {config.mesh.size} devices but "
                             f"{runtime.device_count_text(runtime.device_count())}; call "
                             f"set_context(device_num={config.mesh.size})")
        colocate = dict({"reference": "actor"} if colocate is None else colocate)
        host_groups = {}
        for role, host in colocate.items():
            if role not in ROLES or host not in ROLES:
                raise ValueError(f"colocate[{role!r}] = {host!r}: expected role names from {ROLES}")
            group = config.group_of_module(host)
            if group is None:
                raise ValueError(f"colocate[{role!r}] = {host!r}: role {host!r} is in no device group")
            if config.group_of_module(role) is None:
                host_groups[role] = group.name
        for role in ROLES:
            if config.group_of_module(role) is None and role not in host_groups:
                raise ValueError(f"role {role!r} runs in no device group: name it in a group's modules or "
                                 f"colocate it (colocate={{{role!r}: 'actor'}})")
        self.models = models
        self.settings = settings
        placements = place_groups(models, config, colocated=host_groups)
        # the job's strategy table: every group's rows resolved once on its own mesh (each runner runs its slices)
        self.table = resolve_placements(resolve_strategy(models, config), models, placements)
        self.phases: Optional[ProcessPhases] = None
        if not runtime.in_one_process():
            self.runners = self._process_runners(models, config, placements)
        else:
            self.runners = {p.name: GroupRunner(models, p, runtime, self.table) for p in placements}
        self.role_group = {}
        for role in ROLES:
            self.role_group[role] = next(p.name for p in placements if role in p.cells)
        self.policy = policy
        self.share_rebalancing: Optional[ShareRebalancing] = None
        if not runtime.in_one_process():
            processes = runtime.processes
            self.phases = ProcessPhases(processes.rank, processes.size,
                                        {role: self.runners[g].placement.ranks for role, g in self.role_group.items()},
                                        bare=lambda role: self.runners[self.role_group[role]].bare(role))
        self.actor_optimizer = nn.Adam(models.actor.trainable_params(), learning_rate=actor_lr)
        self.critic_optimizer = nn.Adam(models.critic.trainable_params(), learning_rate=critic_lr)
        dynamic = [p.name for p in placements if p.group.scheduler == "dynamic"]
        self.dynamic_groups = dynamic if len(dynamic) >= 2 else []
        self.rebalancing = (DeviceRebalancing(self.runners, dynamic, policy, config.optimizer_sharding is not None)
                            if self.dynamic_groups and runtime.in_one_process() else None)
        self.steps = 0
        self.timeline = GroupTimeline(tuple(self.runners))

    def _process_runners(self, models: PPOModels, config: ParallelConfig, placements) -> Dict[str, GroupRunner]:
        """Under msrun: check this process's group and build every group's runner (only members hold models)."""
        from mindspore_hyper.mpmd.distributed import MemberGroupRunner, check_group_process

        dynamic = [g for g in config.groups if g.scheduler == "dynamic"]
        if len(dynamic) == 1:
            raise ValueError(f"{dynamic[0].path}.scheduler: dynamic: group {dynamic[0].name!r} is the only dynamic "
                             "group; under msrun rows of the frozen roles' scoring move between two or more dynamic "
                             "groups (make another group dynamic or use scheduler: static)")
        check_group_process(config)
        return {p.name: MemberGroupRunner(models, p, None, self.table) for p in placements}

    def step(self, prompts: Tensor) -> PPOResult:
        """One PPO step (generation, scoring, training) with the roles on their groups; then,
        under `scheduler: dynamic`, one rebalancing decision applied before the next step."""
        if self.phases is not None:
            return self._process_step(prompts)
        self.timeline = GroupTimeline(tuple(self.runners))
        phase_tasks: Dict[str, List[int]] = {p: [] for p in PHASES}
        seconds = {n: 0.0 for n in self.runners}

        def run_phase(phase: str, units: Sequence[Unit]) -> List[np.ndarray]:
            before = PHASES[:PHASES.index(phase)]
            deps = list(phase_tasks[before[-1]]) if before else []
            results = []
            for unit in units:
                start = time.perf_counter()
                results.append(unit.work())
                duration = time.perf_counter() - start
                group = self.role_group[unit.role]
                phase_tasks[phase].append(self.timeline.add(group, unit.label, duration, deps))
                seconds[group] += duration
            return results

        result = ppo_step(self.models, self.actor_optimizer, self.critic_optimizer, prompts, self.settings, run_phase)
        self.steps += 1
        if self.rebalancing is not None:
            batches = {n: [prompts.shape[0]] for n in self.runners}
            self.rebalancing.step(self.steps, seconds, batches)
        return result

    def _process_step(self, prompts: Tensor) -> PPOResult:
        """The step in this msrun process; with dynamic groups, the frozen roles' scoring rows are
        split by the groups' shares, and the measured scoring seconds (gathered to every
        process) decide the shares of the next step."""
        batch = prompts.shape[0]
        if self.dynamic_groups:
            if self.share_rebalancing is None:
                sizes = [self.runners[n].placement.size for n in self.dynamic_groups]
                self.share_rebalancing = ShareRebalancing(self.dynamic_groups, proportional_shares(batch, sizes),
                                                          self.policy)
            if batch != self.share_rebalancing.total:
                raise ValueError(f"prompts: batch {batch}, but the dynamic groups share {self.share_rebalancing.total} "
                                 "rows (the batch of the first step); keep the prompt batch fixed under "
                                 "scheduler: dynamic")
            rows = self.share_rebalancing.rows()
            self.phases.row_blocks = [(self.runners[n].placement.ranks, rows[n]) for n in self.dynamic_groups]
        result = ppo_step(self.models, self.actor_optimizer, self.critic_optimizer, prompts, self.settings,
                          self.phases)
        self.steps += 1
        if self.share_rebalancing is not None:
            seconds = gather_group_seconds(self.phases.seconds.get("scoring", 0.0),
                                           {n: self.runners[n].placement.ranks for n in self.dynamic_groups},
                                           self.phases.size)
            self.share_rebalancing.step(self.steps, seconds)
        self.phases.end_step()
        return result

    @property
    def rebalances(self) -> List[RebalanceRecord]:
        if self.share_rebalancing is not None:
            return self.share_rebalancing.records
        return self.rebalancing.records if self.rebalancing is not None else []
