"""Dynamic rebalancing with real concurrent groups under msrun: the RLHF PPO step, static vs dynamic.

Method:
1. `configs/rlhf_process_groups.yaml` on the msrun processes (`for_processes`: 4 processes give
   actor + colocated reference on ranks 0-1, critic on 2, reward on 3), roles `TinyPolicy` /
   `TinyValue` / `TinyReward` of width `--hidden` over `--vocab` tokens, `--batch` prompts of 3
   tokens (the groups' `batch_size` set to it), 4 generated tokens.
2. **static**: every role's work on its own group (the reference queues behind the actor's own
   pass). **dynamic**: `scheduler: dynamic`: the frozen roles' scoring (reward score, reference
   log-probs) split by rows between the three groups, starting 2:1:1 by group size; after each
   step the measured scoring seconds of every process are all-gathered and the planner
   (`GroupRebalancer`, unit microbatches, default policy) moves rows for the next step.
3. Per step, from the measured events of every process (gathered, one wall clock): the scoring
   phase's span (first start to last end over the processes), its utilisation (seconds the
   processes computed / (processes x span)), and the step's span. Mean and p90 over the steps
   after `--warmup`. Both policies train the same roles from the same seed; the losses must
   agree (printed).

The processes share this machine's cores with each other (and with other jobs): concurrency is
real but the speed of a process depends on the load, so figures vary between runs.
Usage (rank 0 prints):
    MS_HYPER_MODE=distributed .venv/bin/mindspore-hyper msrun --worker_num=4 --local_worker_num=4 --master_port=8133 \\
        --log_dir=msrun_log --join=True benchmarks/bench_rebalance_msrun.py [--steps 12]
"""
from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import Dict, List, Tuple

import numpy as np
import mindspore as ms

import mindspore_hyper as mh
from mindspore_hyper.rlhf import PPOModels, PPOTrainer, TinyPolicy, TinyReward, TinyValue
from mindspore_hyper.rlhf.process_phases import PhaseEvent
from mindspore_hyper.runtime.distributed.world import world
from mindspore_hyper.mpmd import for_processes
from mindspore_hyper.strategy.config import load_parallel_config

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "rlhf_process_groups.yaml")


def roles(vocab: int, hidden: int) -> PPOModels:
    ms.set_seed(0)
    actor, reference = TinyPolicy(vocab, hidden), TinyPolicy(vocab, hidden)
    for p, q in zip(actor.trainable_params(), reference.trainable_params()):
        q.set_data(p.data.copy())
    return PPOModels(actor, TinyValue(vocab, hidden), TinyReward(vocab, hidden), reference)


def step_figures(events: List[PhaseEvent], processes: int) -> Dict[int, Tuple[float, float, float]]:
    """step -> (scoring span s, scoring utilisation, step span s)."""
    out = {}
    for step in sorted({e.step for e in events}):
        mine = [e for e in events if e.step == step]
        scoring = [e for e in mine if e.phase == "scoring" and e.kind == "run"]
        span = max(e.end for e in scoring) - min(e.start for e in scoring)
        busy = sum(e.end - e.start for e in scoring)
        runs = [e for e in mine if e.kind == "run"]
        out[step] = (span, busy / (processes * span), max(e.end for e in runs) - min(e.start for e in runs))
    return out


def run(policy: str, args) -> Tuple[Dict[int, Tuple[float, float, float]], List[float], List[tuple]]:
    config = for_processes(load_parallel_config(CONFIG), world().size, scheduler=policy)
    groups = [replace(g, batch_size=args.batch if g.batch_size else None) for g in config.groups]
    config = replace(config, groups=groups)
    trainer = PPOTrainer(roles(args.vocab, args.hidden), config)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(args.steps):
        result = trainer.step(ms.Tensor(rng.integers(0, args.vocab, (args.batch, 3)).astype(np.int32)))
        losses += [result.actor_loss, result.critic_loss]
    history = trainer.share_rebalancing.history if trainer.share_rebalancing is not None else []
    return step_figures(trainer.phases.gather(), world().size), losses, history


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the statistics")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=512)
    args = parser.parse_args()
    if args.steps <= args.warmup:
        raise SystemExit(f"--steps={args.steps}: must exceed --warmup={args.warmup}")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    mh.set_context(hyper_mpmd=True)
    if mh.get_context("mode") != "distributed":
        raise SystemExit("launch under msrun with MS_HYPER_MODE=distributed (see the docstring)")
    rows, losses = [], []
    for policy in ("static", "dynamic"):
        figures, step_losses, history = run(policy, args)
        kept = [figures[s] for s in sorted(figures) if s >= args.warmup]
        span, util, step = (np.array([k[i] for k in kept]) for i in range(3))
        rows.append((policy, span.mean(), np.percentile(span, 90), util.mean(), step.mean(), history))
        losses.append(step_losses)
    if world().rank != 0:
        return
    print(f"{world().size} processes, batch {args.batch}, hidden {args.hidden}, vocab {args.vocab}, {args.steps} steps "
          f"({args.warmup} warm-up not counted); measured on a shared machine")
    print(f"{'policy':<8} {'scoring span ms':>16} {'p90 ms':>8} {'scoring util':>13} {'step ms':>9}  row shares")
    for policy, span, p90, util, step, history in rows:
        shares = " -> ".join(",".join(map(str, h)) for i, h in enumerate(history) if i == 0 or h != history[i - 1])
        print(f"{policy:<8} {1e3 * span:16.1f} {1e3 * p90:8.1f} {util:13.1%} {1e3 * step:9.1f}  {shares or '-'}")
    static, dynamic = rows
    print(f"dynamic vs static: scoring span {dynamic[1] / static[1] - 1:+.1%}, scoring utilisation "
          f"{static[3]:.1%} -> {dynamic[3]:.1%}, step {dynamic[4] / static[4] - 1:+.1%}; "
          f"largest loss difference {np.abs(np.subtract(*losses)).max():.2e}")


if __name__ == "__main__":
    main()
