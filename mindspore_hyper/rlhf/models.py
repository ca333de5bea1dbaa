"""Tiny RLHF role models (plain nn.Cells) and the container that names them for device groups.

`PPOModels` holds the four roles under the Cell names the RLHF config's groups match:
`actor`, `critic`, `reward_model` and `reference` (a frozen copy of the actor's start).
"""
from __future__ import annotations

from mindspore import nn, ops

__all__ = ["TinyPolicy", "TinyValue", "TinyReward", "PPOModels"]


class TinyPolicy(nn.Cell):
    """Token ids (B, L) -> next-token logits (B, L, vocab)."""

    def __init__(self, vocab: int = 16, hidden: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.body = nn.Dense(hidden, hidden, activation="tanh")
        self.head = nn.Dense(hidden, vocab)

    def construct(self, ids):
        return self.head(self.body(self.embed(ids)))


class TinyValue(nn.Cell):
    """Token ids (B, L) -> one value per position (B, L)."""

    def __init__(self, vocab: int = 16, hidden: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.body = nn.Dense(hidden, hidden, activation="tanh")
        self.head = nn.Dense(hidden, 1)

    def construct(self, ids):
        return self.head(self.body(self.embed(ids))).squeeze(-1)


class TinyReward(nn.Cell):
    """Token ids (B, L) -> one score per sequence (B,): a mean-pooled embedding through a Dense."""

    def __init__(self, vocab: int = 16, hidden: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.head = nn.Dense(hidden, 1)

    def construct(self, ids):
        return self.head(ops.tanh(self.embed(ids)).mean(1)).squeeze(-1)


class PPOModels(nn.Cell):
    """The four roles of a PPO step; `reference` is frozen (no trainable parameters)."""

    def __init__(self, actor: nn.Cell, critic: nn.Cell, reward_model: nn.Cell, reference: nn.Cell):
        super().__init__()
        self.actor = actor
        self.critic = critic
        self.reward_model = reward_model
        self.reference = reference
        for cell in (reward_model, reference):
            for p in cell.get_parameters():
                p.requires_grad = False

    def construct(self, ids):
        raise TypeError("PPOModels is a container of roles; run a PPO step with ppo_step or PPOTrainer")
