"""RLHF on HyperMPMD: a PPO step (actor, critic, reward, reference) with roles on device groups
(simulation, or one group per msrun process)."""
from mindspore_hyper.rlhf.models import PPOModels, TinyPolicy, TinyReward, TinyValue
from mindspore_hyper.rlhf.ppo import PPOResult, PPOSettings, Unit, ppo_step, run_in_order
from mindspore_hyper.rlhf.process_phases import PhaseEvent, ProcessPhases
from mindspore_hyper.rlhf.trainer import PPOTrainer

__all__ = ["PPOModels", "TinyPolicy", "TinyReward", "TinyValue", "PPOResult", "PPOSettings", "Unit", "ppo_step",
           "run_in_order", "PhaseEvent", "ProcessPhases", "PPOTrainer"]
