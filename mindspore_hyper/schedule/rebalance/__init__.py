"""Dynamic rebalancing planner (data only): predict stage/group times, detect imbalance, plan moves.

Plans move pipeline-stage boundaries (layers with their parameters and optimizer states) or
shift microbatches/devices between MPMD groups; neither changes numerics. Runtimes apply them.
"""
from mindspore_hyper.schedule.rebalance.group_plan import GroupSharePlan, ShareMove, ShareUnit
from mindspore_hyper.schedule.rebalance.group_planner import plan_group_shares
from mindspore_hyper.schedule.rebalance.history import LoadHistory
from mindspore_hyper.schedule.rebalance.imbalance import Imbalance, detect_imbalance
from mindspore_hyper.schedule.rebalance.policy import RebalancePolicy
from mindspore_hyper.schedule.rebalance.rebalancer import GroupRebalancer, StageRebalancer
from mindspore_hyper.schedule.rebalance.stage_plan import LayerMove, LayerSpec, StageMovePlan
from mindspore_hyper.schedule.rebalance.stage_planner import layer_costs_from_stage_times, plan_stage_move

__all__ = ["RebalancePolicy", "LoadHistory", "Imbalance", "detect_imbalance", "LayerSpec", "LayerMove",
           "StageMovePlan", "plan_stage_move", "layer_costs_from_stage_times", "ShareUnit", "ShareMove",
           "GroupSharePlan", "plan_group_shares", "StageRebalancer", "GroupRebalancer"]
