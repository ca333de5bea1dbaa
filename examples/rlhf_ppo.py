"""RLHF with HyperMPMD: a PPO step whose actor, critic and reward model run on their own device
groups (configs/rlhf_process_groups.yaml, 16 simulated devices) and whose frozen reference
time-shares the actor's devices. Checks the numbers against the roles run one after another
and prints the per-group timeline (and writes it as PNG / Chrome trace with --timeline DIR).

    .venv/bin/python examples/rlhf_ppo.py [--steps 3] [--timeline docs/img]
"""
import argparse
import os

import numpy as np
import mindspore as ms
from mindspore import nn

import mindspore_hyper as mh
from mindspore_hyper.rlhf import PPOModels, PPOTrainer, TinyPolicy, TinyReward, TinyValue, ppo_step

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "rlhf_process_groups.yaml")


def roles(seed: int) -> PPOModels:
    ms.set_seed(seed)
    actor, reference = TinyPolicy(), TinyPolicy()
    for p, q in zip(actor.trainable_params(), reference.trainable_params()):
        q.set_data(p.data.copy())
    return PPOModels(actor, TinyValue(), TinyReward(), reference)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timeline", default=None, help="directory for rlhf_timeline.png / .json")
    args = parser.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    mh.set_context(hyper_mpmd=True, device_num=16)

    grouped, plain = roles(0), roles(0)
    for p, q in zip(grouped.get_parameters(), plain.get_parameters()):
        q.set_data(p.data.copy())
    trainer = PPOTrainer(grouped, CONFIG)  # reference colocated with the actor by default
    actor_opt = nn.Adam(plain.actor.trainable_params(), learning_rate=1e-3)
    critic_opt = nn.Adam(plain.critic.trainable_params(), learning_rate=1e-3)
    rng = np.random.default_rng(0)
    for step in range(args.steps):
        prompts = ms.Tensor(rng.integers(0, 16, (8, 3)).astype(np.int32))
        got = trainer.step(prompts)
        want = ppo_step(plain, actor_opt, critic_opt, prompts)
        print(f"step {step}: mean score {got.scores.mean():+.4f}  kl {got.kl:+.5f}  actor loss {got.actor_loss:+.5f}  "
              f"critic loss {got.critic_loss:.5f}")
        assert (got.sequences == want.sequences).all(), "generated tokens differ"
        np.testing.assert_allclose([got.actor_loss, got.critic_loss], [want.actor_loss, want.critic_loss], rtol=1e-4)
    for p, q in zip(grouped.get_parameters(), plain.get_parameters()):
        np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=p.name)
    print(trainer.timeline)
    if args.timeline:
        os.makedirs(args.timeline, exist_ok=True)
        trainer.timeline.plot(os.path.join(args.timeline, "rlhf_timeline.png"),
                              title="PPO step: actor (0-7) + reference, critic (8-11), reward (12-15)")
        trainer.timeline.to_chrome_trace(os.path.join(args.timeline, "rlhf_timeline.json"))
    print(f"OK: {args.steps} PPO steps on device groups match the roles run one after another")


if __name__ == "__main__":
    main()
