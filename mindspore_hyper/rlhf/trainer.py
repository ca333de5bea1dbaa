"""PPOTrainer: the PPO step with each RLHF role on its device group (HyperMPMD, simulation).

Roles map to device groups by the config's `modules` patterns (the RLHF config: `actor` on ranks
0-7, `critic` on 8-11, `reward_model` on 12-15). A role no group names is colocated with
another role's group (default: the frozen `reference` time-shares the actor's devices). Each
group runs its roles data parallel over its ranks. Every unit of work (a generation step, a
scoring pass, a role's update) is timed and placed on a per-group timeline: a unit starts when
its group is free and the previous phase has finished, so disjoint groups overlap (reward,
critic and the actor's scoring; the actor's and the critic's updates) while colocated roles
queue on their shared group. The numbers are those of the roles run one after another
(`ppo_step` on the bare Cells).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

from mindspore import Tensor, nn

from mindspore_hyper.context import get_context
from mindspore_hyper.rlhf.models import PPOModels
from mindspore_hyper.rlhf.ppo import PHASES, PPOResult, PPOSettings, ppo_step
from mindspore_hyper.runtime.mpmd import check_mpmd_enabled
from mindspore_hyper.runtime.mpmd.group_runner import GroupRunner
from mindspore_hyper.runtime.mpmd.placement import place_groups
from mindspore_hyper.runtime.mpmd.rebalancing import DeviceRebalancing, RebalanceRecord
from mindspore_hyper.runtime.mpmd.timeline import GroupTimeline
from mindspore_hyper.schedule.rebalance import RebalancePolicy
from mindspore_hyper.strategy.config import ParallelConfig, load_parallel_config

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
        policy: the dynamic scheduler's thresholds (groups with `scheduler: dynamic`).

    Raises:
        ValueError: not simulation mode, hyper_mpmd off, a device_num mismatch, a role without a group, or a bad
            `colocate` entry (named in the message).
    """

    def __init__(self, models: PPOModels, config: Union[ParallelConfig, str, os.PathLike, dict],
                 colocate: Optional[Mapping[str, str]] = None, settings: PPOSettings = PPOSettings(),
                 actor_lr: float = 1e-3, critic_lr: float = 1e-3, policy: RebalancePolicy = RebalancePolicy()):
        from mindspore_hyper.runtime.simulation.runtime import SimulationRuntime

        if get_context("mode") != "simulation":
            raise ValueError(f"PPOTrainer runs its device groups in simulation mode only; mode="
                             f"{get_context('mode')!r} (set_context(mode='simulation'))")
        config = load_parallel_config(config)
        check_mpmd_enabled(config.groups)
        if not config.groups:
            raise ValueError("config: no device groups (process_groups); PPOTrainer places each role on a group")
        if config.mesh.size != get_context("device_num"):
            raise ValueError(f"config: the mesh has {config.mesh.size} devices but device_num="
                             f"{get_context('device_num')}; call set_context(device_num={config.mesh.size})")
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
        runtime = SimulationRuntime()
        self.runners: Dict[str, GroupRunner] = {p.name: GroupRunner(models, p, runtime) for p in placements}
        self.role_group = {}
        for role in ROLES:
            self.role_group[role] = next(p.name for p in placements if role in p.cells)
        self.actor_optimizer = nn.Adam(models.actor.trainable_params(), learning_rate=actor_lr)
        self.critic_optimizer = nn.Adam(models.critic.trainable_params(), learning_rate=critic_lr)
        dynamic = [p.name for p in placements if p.group.scheduler == "dynamic"]
        self.rebalancing = (DeviceRebalancing(self.runners, dynamic, policy, config.optimizer_sharding is not None)
                            if len(dynamic) >= 2 else None)
        self.steps = 0
        self.timeline = GroupTimeline(tuple(self.runners))

    def step(self, prompts: Tensor) -> PPOResult:
        """One PPO step (generation, scoring, training) with the roles on their groups; then,
        under `scheduler: dynamic`, one rebalancing decision applied before the next step."""
        self.timeline = GroupTimeline(tuple(self.runners))
        phase_tasks: Dict[str, List[int]] = {p: [] for p in PHASES}
        seconds = {n: 0.0 for n in self.runners}

        def execute(phase: str, role: str, label: str, work: Callable[[], Any]) -> Any:
            start = time.perf_counter()
            out = work()
            duration = time.perf_counter() - start
            before = PHASES[:PHASES.index(phase)]
            deps = phase_tasks[before[-1]] if before else []
            group = self.role_group[role]
            phase_tasks[phase].append(self.timeline.add(group, f"{label}", duration, deps))
            seconds[group] += duration
            return out

        result = ppo_step(self.models, self.actor_optimizer, self.critic_optimizer, prompts, self.settings, execute)
        self.steps += 1
        if self.rebalancing is not None:
            batches = {n: [prompts.shape[0]] for n in self.runners}
            self.rebalancing.step(self.steps, seconds, batches)
        return result

    @property
    def rebalances(self) -> List[RebalanceRecord]:
        return self.rebalancing.records if self.rebalancing is not None else []
