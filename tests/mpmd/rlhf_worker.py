"""msrun worker: the PPO step of configs/rlhf_process_groups.yaml on 4 processes (actor and the
colocated reference on ranks 0-1, critic on 2, reward on 3), 3 steps; writes rank<N>.json with
the step results, this process's role parameters and its measured phase events, next to the
same steps run by `ppo_step` on bare Cells (the roles one after another) in the same process.
Then the same with the config's `scheduler: dynamic` kept (the frozen roles' scoring rows shared
between the groups, moved by the planner on measured times), 4 steps, and one hand-made move of
a row before step 3; the share history and decisions are written too. The tests run it through
mpmd_worker.py (`rlhf`), in its 4-process job (conftest.py)."""
from mindspore_hyper.launch import exit_if_msrun_scheduler  # noqa: E402

exit_if_msrun_scheduler()  # before MindSpore's import (~3 s): msrun's scheduler has nothing to do with shm
import json
import os
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]
import numpy as np  # noqa: E402
import mindspore as ms  # noqa: E402
from mindspore import nn  # noqa: E402

import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper.rlhf import PPOModels, PPOTrainer, TinyPolicy, TinyReward, TinyValue, ppo_step  # noqa: E402
from mindspore_hyper.mpmd import for_processes  # noqa: E402
from mindspore_hyper.schedule.rebalance import GroupSharePlan, RebalancePolicy, ShareMove  # noqa: E402
from mindspore_hyper.strategy.config import load_parallel_config  # noqa: E402

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs",
                      "rlhf_process_groups.yaml")


def roles() -> PPOModels:
    ms.set_seed(0)
    actor, reference = TinyPolicy(), TinyPolicy()
    for p, q in zip(actor.trainable_params(), reference.trainable_params()):
        q.set_data(p.data.copy())
    return PPOModels(actor, TinyValue(), TinyReward(), reference)


def hand_move(shares: tuple, groups: tuple) -> GroupSharePlan:
    """One row from the group with the most rows to the one with the fewest (first in order on ties)."""
    src = max(range(len(shares)), key=lambda i: shares[i])
    dst = min(range(len(shares)), key=lambda i: shares[i])
    after = list(shares)
    after[src] -= 1
    after[dst] += 1
    zeros = (0.0,) * len(shares)
    return GroupSharePlan("microbatches", groups, shares, tuple(after), (ShareMove(groups[src], groups[dst], 1),),
                          zeros, zeros, "hand-made")


def run(mode: str) -> dict:
    """Train fresh roles with the trainer in `mode` ("static" or "dynamic") next to ppo_step."""
    grouped, plain = roles(), roles()
    for p, q in zip(grouped.get_parameters(), plain.get_parameters()):
        q.set_data(p.data.copy())
    dynamic = mode == "dynamic"
    config = for_processes(load_parallel_config(CONFIG), 4, scheduler=None if dynamic else "static")
    trainer = PPOTrainer(grouped, config, policy=RebalancePolicy(cooldown_steps=0))
    actor_opt = nn.Adam(plain.actor.trainable_params(), learning_rate=1e-3)
    critic_opt = nn.Adam(plain.critic.trainable_params(), learning_rate=1e-3)
    rng = np.random.default_rng(0)
    steps = []
    for step in range(4 if dynamic else 3):
        if dynamic and step == 2:
            sharing = trainer.share_rebalancing
            sharing.apply(hand_move(sharing.shares, sharing.groups), step)
        prompts = ms.Tensor(rng.integers(0, 16, (8, 3)).astype(np.int32))
        got = trainer.step(prompts)
        want = ppo_step(plain, actor_opt, critic_opt, prompts)
        steps.append({"sequences_equal": bool((got.sequences == want.sequences).all()),
                      "got": [got.actor_loss, got.critic_loss, got.kl, *got.scores.tolist()],
                      "want": [want.actor_loss, want.critic_loss, want.kl, *want.scores.tolist()],
                      "advantage_error": float(np.abs(got.advantages - want.advantages).max())})
    mine = [role for role, group in trainer.role_group.items() if trainer.runners[group].member]
    want_params = {p.name: p.asnumpy() for p in plain.get_parameters()}
    result = {
        "roles": mine, "steps": steps,
        "param_error": {p.name: float(np.abs(p.asnumpy() - want_params[p.name]).max())
                        for role in mine for p in getattr(grouped, role).get_parameters()},
        "actor_moved": {p.name: float(np.abs(p.asnumpy() - q.asnumpy()).max())
                        for p, q in zip(grouped.actor.get_parameters(), grouped.reference.get_parameters())},
        "events": [[e.step, e.phase, e.role, e.label, e.kind, e.start, e.end] for e in trainer.phases.events],
        # every process's events, on every process
        "gathered": sorted([e.rank, e.step, e.label, e.kind, e.start] for e in trainer.phases.gather()),
    }
    if dynamic:
        result["share_groups"] = list(trainer.share_rebalancing.groups)
        result["share_history"] = [list(h) for h in trainer.share_rebalancing.history]
        result["decisions"] = [[r.step, list(r.plan.before), list(r.plan.after), r.plan.reason, r.note]
                               for r in trainer.rebalances]
    return result


def main(out_dir):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    mh.set_context(hyper_mpmd=True, mode="distributed", comm_timeout=60.0)
    rank = int(os.environ.get("RANK_ID", "0"))
    result = {"rank": rank, "static": run("static"), "dynamic": run("dynamic")}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
