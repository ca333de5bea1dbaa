"""Mixture of experts: router, batched experts, expert-parallel dispatch, EPLB placement,
1-bit routing. See docs/moe.md."""
from mindspore_hyper.moe.block import MoEBlock
from mindspore_hyper.moe.token_dispatch import DispatchPlan, DispatchStates, expert_capacity, plan_dispatch
from mindspore_hyper.moe.experts import GroupedExperts, SharedExpert
from mindspore_hyper.moe.layer import MoE
from mindspore_hyper.moe.losses import load_balancing_loss, z_loss
from mindspore_hyper.moe.router import Routing, TopKRouter

__all__ = ["MoE", "MoEBlock", "TopKRouter", "Routing", "GroupedExperts", "SharedExpert", "DispatchPlan", "DispatchStates",
           "plan_dispatch", "expert_capacity", "load_balancing_loss", "z_loss"]
