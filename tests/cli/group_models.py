"""A tiny model whose Cells carry the names of configs/rlhf_process_groups.yaml's device groups
(actor, critic, reward_model), for `plan` on that config."""
from mindspore import nn


class ThreeRoles(nn.Cell):
    """Three Dense roles on one input; the loss is the mean square of their summed outputs."""

    def __init__(self, dim=4, hidden=8):
        super().__init__()
        self.actor = nn.Dense(dim, hidden)
        self.critic = nn.Dense(dim, hidden)
        self.reward_model = nn.Dense(dim, hidden)

    def construct(self, x):
        return ((self.actor(x) + self.critic(x) + self.reward_model(x)) ** 2).mean()
