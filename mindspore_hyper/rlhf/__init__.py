"""RLHF on HyperMPMD: a PPO step (actor, critic, reward, reference) with roles on device groups."""
from mindspore_hyper.rlhf.models import PPOModels, TinyPolicy, TinyReward, TinyValue
from mindspore_hyper.rlhf.ppo import PPOResult, PPOSettings, ppo_step
from mindspore_hyper.rlhf.trainer import PPOTrainer

__all__ = ["PPOModels", "TinyPolicy", "TinyReward", "TinyValue", "PPOResult", "PPOSettings", "ppo_step", "PPOTrainer"]
