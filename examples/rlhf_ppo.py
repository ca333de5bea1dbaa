"""RLHF with HyperMPMD: a PPO step whose actor, critic and reward model run on their own device
groups (configs/rlhf_process_groups.yaml) and whose frozen reference time-shares the actor's
devices. Checks the numbers against the roles run one after another (`ppo_step` on bare Cells)
and prints the timeline (writes it as PNG, plus a Chrome trace in simulation, with --timeline DIR).

Simulation (16 simulated devices, one process):

    .venv/bin/python examples/rlhf_ppo.py [--steps 3] [--timeline docs/img]

Under msrun (the config's groups scaled to the process count, here actor + reference on ranks
0-1, critic on 2, reward on 3; each process runs its group's roles, phase results cross groups
point-to-point, the timeline is measured):

    MS_HYPER_MODE=distributed .venv/bin/mindspore-hyper msrun --worker_num=4 --local_worker_num=4 \\
        --master_port=8131 --log_dir=msrun_log --join=True examples/rlhf_ppo.py [--timeline docs/img]
"""
import argparse
import os

import numpy as np
import mindspore as ms
from mindspore import nn

import mindspore_hyper as mh
from mindspore_hyper.rlhf import PPOModels, PPOTrainer, TinyPolicy, TinyReward, TinyValue, ppo_step
from mindspore_hyper.rlhf.measured_timeline import format_events, plot_events
from mindspore_hyper.mpmd import for_processes
from mindspore_hyper.strategy.config import load_parallel_config

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
    parser.add_argument("--timeline", default=None, help="directory for the timeline PNG (and JSON in simulation)")
    args = parser.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    mh.set_context(hyper_mpmd=True)
    distributed = mh.get_context("mode") == "distributed"
    if distributed:
        from mindspore_hyper.runtime.distributed.world import world

        rank, config = world().rank, for_processes(load_parallel_config(CONFIG), world().size)
    else:
        mh.set_context(device_num=16)
        rank, config = 0, CONFIG

    grouped, plain = roles(0), roles(0)
    for p, q in zip(grouped.get_parameters(), plain.get_parameters()):
        q.set_data(p.data.copy())
    trainer = PPOTrainer(grouped, config)  # reference colocated with the actor by default
    actor_opt = nn.Adam(plain.actor.trainable_params(), learning_rate=1e-3)
    critic_opt = nn.Adam(plain.critic.trainable_params(), learning_rate=1e-3)
    rng = np.random.default_rng(0)
    for step in range(args.steps):
        prompts = ms.Tensor(rng.integers(0, 16, (8, 3)).astype(np.int32))
        got = trainer.step(prompts)
        want = ppo_step(plain, actor_opt, critic_opt, prompts)
        if rank == 0:
            print(f"step {step}: mean score {got.scores.mean():+.4f}  kl {got.kl:+.5f}  actor loss "
                  f"{got.actor_loss:+.5f}  critic loss {got.critic_loss:.5f}")
        assert (got.sequences == want.sequences).all(), "generated tokens differ"
        np.testing.assert_allclose([got.actor_loss, got.critic_loss], [want.actor_loss, want.critic_loss], rtol=1e-4)
    mine = [role for role, group in trainer.role_group.items() if getattr(trainer.runners[group], "member", True)]
    for role in mine:  # under msrun a process holds its own roles' trained parameters only
        for p, q in zip(getattr(grouped, role).get_parameters(), getattr(plain, role).get_parameters()):
            np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=p.name)
    if distributed:
        events = trainer.phases.gather()
        if rank == 0:
            print(format_events(events, step=args.steps - 1))
            if args.timeline:
                os.makedirs(args.timeline, exist_ok=True)
                plot_events(events, os.path.join(args.timeline, "rlhf_msrun_timeline.png"), step=args.steps - 1,
                            title="PPO step under msrun: actor + reference (ranks 0-1), critic (2), reward (3)")
    else:
        print(trainer.timeline)
        if args.timeline:
            os.makedirs(args.timeline, exist_ok=True)
            trainer.timeline.plot(os.path.join(args.timeline, "rlhf_timeline.png"),
                                  title="PPO step: actor (0-7) + reference, critic (8-11), reward (12-15)")
            trainer.timeline.to_chrome_trace(os.path.join(args.timeline, "rlhf_timeline.json"))
    if rank == 0:
        where = f"{config.mesh.size} msrun processes" if distributed else "device groups"
        print(f"OK: {args.steps} PPO steps on {where} match the roles run one after another")


if __name__ == "__main__":
    main()
