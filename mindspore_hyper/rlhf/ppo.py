"""One PPO step over the four RLHF roles, written on plain Cells (no parallelism in it).

Phases: **generation** (the actor samples a response token by token), **scoring** (reward score
of the full sequence, critic values, actor and reference log-probabilities of the response),
**training** (one clipped-PPO update of the actor and one value-regression update of the
critic). Each phase is a list of `Unit`s (a role's piece of work, independent of the other
units of the phase) handed to a phase runner: `PPOTrainer` runs them on the roles' device
groups (in simulation, or one group per msrun process); the default runner, one unit after
another on the bare Cells, is the "roles one after another" reference.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindspore_hyper.rlhf.models import PPOModels

__all__ = ["PPOSettings", "PPOResult", "ppo_step", "PHASES", "Unit", "RunPhase", "run_in_order"]

PHASES = ("generation", "scoring", "training")


@dataclass(frozen=True)
class Unit:
    """One role's piece of a phase. `work()` returns a numpy array and reads no other unit of
    its phase, so a runner may run the units of a phase in any order or at the same time.

    `rows`, set for a frozen role's work whose batch rows are independent, computes the result
    for a slice of the batch's rows (`work()` is `rows(slice(None))`): a runner may split the
    rows between groups (the msrun dynamic scheduler's microbatch shares)."""

    phase: str
    role: str
    label: str
    work: Callable[[], np.ndarray]
    rows: Optional[Callable[[slice], np.ndarray]] = None


# run_phase(phase, units) -> the units' results, in order
RunPhase = Callable[[str, Sequence[Unit]], List[np.ndarray]]


def run_in_order(phase: str, units: Sequence[Unit]) -> List[np.ndarray]:
    """The reference runner: every unit in this process, one after another."""
    return [unit.work() for unit in units]


@dataclass(frozen=True)
class PPOSettings:
    """PPO hyper-parameters.

    Attributes:
        response_len: tokens generated per prompt.
        kl_coef: weight of the per-token KL penalty against the reference (reward units).
        clip: PPO ratio clip epsilon.
        seed: seed of the sampler (numpy), so two runs draw the same uniforms.
    """

    response_len: int = 4
    kl_coef: float = 0.1
    clip: float = 0.2
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.response_len, bool) or not isinstance(self.response_len, int) or self.response_len < 1:
            raise ValueError(f"response_len={self.response_len!r}: expected an int >= 1")
        if not 0 < self.clip < 1:
            raise ValueError(f"clip={self.clip!r}: expected 0 < clip < 1")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef={self.kl_coef!r}: expected >= 0")


@dataclass(frozen=True)
class PPOResult:
    """What one PPO step produced (numpy arrays, float losses)."""

    sequences: np.ndarray  # (B, prompt + response) token ids
    scores: np.ndarray  # (B,) reward-model scores
    advantages: np.ndarray  # (B, response_len)
    kl: float  # mean per-token log-ratio actor/reference over the response
    actor_loss: float
    critic_loss: float


def _response_logp(logits: Tensor, ids: Tensor, prompt_len: int) -> Tensor:
    """log p(token_t | tokens < t) of the response tokens: (B, response_len)."""
    logp = ops.log_softmax(logits[:, prompt_len - 1:-1], -1)
    target = ids[:, prompt_len:]
    return ops.gather_elements(logp, 2, target.expand_dims(-1)).squeeze(-1)


def ppo_step(models: PPOModels, actor_optimizer: nn.Optimizer, critic_optimizer: nn.Optimizer, prompts: Tensor,
             settings: PPOSettings = PPOSettings(), run_phase: Optional[RunPhase] = None) -> PPOResult:
    """Run one PPO step (see module docstring) and update actor and critic.

    Args:
        models: the four roles.
        actor_optimizer, critic_optimizer: optimizers over the actor's / critic's parameters.
        prompts: (B, P) int32 token ids.
        settings: PPO hyper-parameters.
        run_phase: runs the units of a phase and returns their results in order; default
            `run_in_order`. The MPMD trainer runs them on the roles' groups and times them.

    Returns:
        The PPOResult.
    """
    run = run_phase or run_in_order
    rng = np.random.default_rng(settings.seed)
    prompt_len = prompts.shape[1]

    ids = prompts.asnumpy().astype(np.int32)
    for t in range(settings.response_len):
        current = Tensor(ids)
        (logits,) = run("generation", [Unit("generation", "actor", f"generate {t}",
                                            lambda: models.actor(current)[:, -1].asnumpy())])
        logits = logits.astype(np.float64)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        u = rng.random((ids.shape[0], 1))
        nxt = np.minimum((probs.cumsum(-1) < u).sum(-1), probs.shape[-1] - 1).astype(np.int32)
        ids = np.concatenate([ids, nxt[:, None]], 1)
    seq = Tensor(ids)

    def score(rows: slice) -> np.ndarray:
        return models.reward_model(Tensor(ids[rows])).asnumpy()

    def reference_logp(rows: slice) -> np.ndarray:
        part = Tensor(ids[rows])
        return _response_logp(models.reference(part), part, prompt_len).asnumpy()

    scores, values, old_logp, ref_logp = run("scoring", [
        Unit("scoring", "reward_model", "score", lambda: score(slice(None)), score),
        Unit("scoring", "critic", "values", lambda: models.critic(seq).asnumpy()[:, prompt_len - 1:-1]),
        Unit("scoring", "actor", "old logp", lambda: _response_logp(models.actor(seq), seq, prompt_len).asnumpy()),
        Unit("scoring", "reference", "reference logp", lambda: reference_logp(slice(None)), reference_logp),
    ])
    rewards = -settings.kl_coef * (old_logp - ref_logp)
    rewards[:, -1] += scores
    returns = np.cumsum(rewards[:, ::-1], 1)[:, ::-1].copy()  # gamma = 1
    advantages = (returns - values).astype(np.float32)

    adv, old, ret = Tensor(advantages), Tensor(old_logp.astype(np.float32)), Tensor(returns.astype(np.float32))

    def actor_loss():
        ratio = ops.exp(_response_logp(models.actor(seq), seq, prompt_len) - old)
        clipped = ops.clamp(ratio, 1 - settings.clip, 1 + settings.clip)
        return -ops.minimum(ratio * adv, clipped * adv).mean()

    def critic_loss():
        return ((models.critic(seq)[:, prompt_len - 1:-1] - ret) ** 2).mean()

    def update(loss_fn, optimizer) -> np.ndarray:
        loss, grads = ms.value_and_grad(loss_fn, None, optimizer.parameters)()
        optimizer(grads)
        return loss.asnumpy()

    a_loss, c_loss = run("training", [
        Unit("training", "actor", "actor update", lambda: update(actor_loss, actor_optimizer)),
        Unit("training", "critic", "critic update", lambda: update(critic_loss, critic_optimizer)),
    ])
    return PPOResult(ids, scores, advantages, float((old_logp - ref_logp).mean()), float(a_loss), float(c_loss))
