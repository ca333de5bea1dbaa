"""Dynamic rebalancing between MPMD groups: static vs dynamic device shares on an 8-module mix.

Method:
1. Eight heterogeneous MindSpore modules (one per "modality": text, vision, audio, video,
   tabular, graph, point cloud, time series) are run for real on this CPU: forward + backward
   of one microbatch, median of `--repeats` runs after a warm-up. That is each group's cost per
   microbatch (seconds).
2. A cluster of `--devices` devices runs the 8 groups concurrently, one synchronous step at a
   time. Each step group g has work = cost_g x `--microbatches` x (1 + u), u uniform in
   [-noise, +noise] (default +-30%), drawn per group and step from a fixed seed. A group on n
   devices takes work / n (perfect scaling inside a group, the planner's assumption); the step
   takes the slowest group's time (plus `--move-cost` seconds per device moved in that step).
3. static: the declared split, equal devices per group, never changes. dynamic: the
   `GroupRebalancer` (EMA alpha 0.3 of each group's work, overloaded > 1.2 x mean, underloaded
   < 0.8 x mean, min gain 5%, cool-down 2 steps) sees each step's measured group times and its
   device moves apply before the next step -- the same planner and rules the MPMD runtime uses.
   A third row, "static oracle", splits the devices once in proportion to the true mean costs
   (what a perfect offline estimate would give): the headroom dynamic can at best reach.
4. Cluster utilisation = sum of work / (devices x step time), averaged over the steps after
   `--warmup`; p99 step latency over the same steps.
5. `--drift N`: every N steps each module's cost is multiplied by a new factor drawn from
   [0.5, 1.5] (the modality mix changes during training); the static oracle keeps the split
   it computed from the mean costs of the whole run.

The measured module costs are noisy on a loaded machine (they enter only as the costs' ratios).
Usage: .venv/bin/python benchmarks/bench_rebalance.py [--devices 64] [--steps 300] [--noise 0.3]
"""
from __future__ import annotations

import argparse
import time
from typing import Dict, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import nn, ops

from mindspore_hyper.schedule.rebalance import GroupRebalancer, RebalancePolicy, plan_group_shares


class Text(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1000, 128)
        self.mlp = nn.SequentialCell(nn.Dense(128, 512), nn.GELU(), nn.Dense(512, 128))

    def construct(self):
        ids = ops.arange(0, 16 * 32).reshape(16, 32) % 1000
        return self.mlp(self.embed(ids.astype(ms.int32)))


def _input(shape, seed):
    return ms.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


class Module(nn.Cell):
    """A body applied to a fixed input batch (so every module takes no argument)."""

    def __init__(self, body: nn.Cell, shape: Tuple[int, ...], seed: int):
        super().__init__()
        self.body = body
        self.x = _input(shape, seed)

    def construct(self):
        return self.body(self.x)


def modules() -> Dict[str, nn.Cell]:
    return {
        "text": Text(),
        "vision": Module(nn.SequentialCell(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 16, 3)), (4, 3, 32, 32), 1),
        "audio": Module(nn.SequentialCell(nn.Conv1d(8, 32, 5), nn.ReLU(), nn.Conv1d(32, 32, 5)), (4, 8, 400), 2),
        "video": Module(nn.SequentialCell(nn.Conv3d(3, 8, 3), nn.ReLU()), (2, 3, 8, 32, 32), 3),
        "tabular": Module(nn.SequentialCell(nn.Dense(32, 256), nn.ReLU(), nn.Dense(256, 8)), (1024, 32), 4),
        "graph": Module(nn.SequentialCell(nn.Dense(64, 256), nn.ReLU(), nn.Dense(256, 256)), (1024, 64), 5),
        "point_cloud": Module(nn.SequentialCell(nn.Dense(3, 64), nn.ReLU(), nn.Dense(64, 128)), (16 * 512, 3), 6),
        "time_series": Module(nn.SequentialCell(nn.Dense(24, 256), nn.Tanh(), nn.Dense(256, 24)), (2048, 24), 7),
    }


def measure_costs(repeats: int) -> Dict[str, float]:
    """Median seconds of one forward + backward of each module (after one warm-up run)."""
    costs = {}
    for name, cell in modules().items():
        grad = ms.value_and_grad(lambda c=cell: c().sum(), None, cell.trainable_params())
        grad()
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            _, g = grad()
            g[0].asnumpy()
            runs.append(time.perf_counter() - start)
        costs[name] = float(np.median(runs))
    return costs


def run(costs: np.ndarray, shares: Sequence[int], noise: np.ndarray, microbatches: int, dynamic: bool,
        move_cost: float, names: Sequence[str]) -> Tuple[np.ndarray, np.ndarray, int]:
    """Step times and utilisations of one policy; `costs` and `noise` are (steps, groups).
    Returns (step times, utilisations, devices moved)."""
    shares = list(shares)
    devices = sum(shares)
    rebalancer = GroupRebalancer(list(names), shares, "devices", RebalancePolicy()) if dynamic else None
    times, utils, moved_total, moved_now = [], [], 0, 0
    for step_costs, step_noise in zip(costs, noise):
        work = step_costs * microbatches * (1 + step_noise)
        group_times = work / np.asarray(shares)
        step = group_times.max() + move_cost * moved_now
        times.append(step)
        utils.append(work.sum() / (devices * step))
        moved_now = 0
        if rebalancer is not None:
            plan = rebalancer.observe(list(group_times))
            if not plan.is_empty:
                rebalancer.commit(plan)
                moved_now = sum(m.amount for m in plan.moves)
                moved_total += moved_now
                shares = list(plan.after)
    return np.asarray(times), np.asarray(utils), moved_total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20, help="steps left out of the statistics")
    parser.add_argument("--noise", type=float, default=0.3, help="per-step work noise, uniform +-")
    parser.add_argument("--microbatches", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per module cost")
    parser.add_argument("--move-cost", type=float, default=0.0, help="seconds added to a step per device moved")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drift", type=int, default=0, help="re-draw each module's cost factor every N steps")
    args = parser.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE)

    measured = measure_costs(args.repeats)
    names = list(measured)
    costs = [measured[n] for n in names]
    groups = len(names)
    if args.devices < groups:
        raise SystemExit(f"--devices={args.devices}: need at least one device per group ({groups})")
    equal = [args.devices // groups + (1 if i < args.devices % groups else 0) for i in range(groups)]
    rng = np.random.default_rng(args.seed)
    noise = rng.uniform(-args.noise, args.noise, (args.steps, groups))
    step_costs = np.tile(np.asarray(costs), (args.steps, 1))
    if args.drift:
        for start in range(0, args.steps, args.drift):
            step_costs[start:start + args.drift] *= rng.uniform(0.5, 1.5, groups)
    oracle = list(plan_group_shares(list(step_costs.mean(0)), names, equal, "devices",
                                    RebalancePolicy(min_gain=0.0)).after)

    print(f"module cost per microbatch (forward + backward, median of {args.repeats}, this CPU):")
    for n, c in zip(names, costs):
        print(f"  {n:<12} {c * 1e3:8.2f} ms")
    print(f"{args.devices} devices, {groups} groups, {args.microbatches} microbatches per group per step, "
          f"noise +-{args.noise:.0%}, {args.steps} steps ({args.warmup} warm-up steps not counted), "
          f"move cost {args.move_cost} s/device" + (f", costs drift every {args.drift} steps" if args.drift else ""))
    rows = []
    for label, shares, dynamic in (("static (equal)", equal, False), ("static oracle", oracle, False),
                                   ("dynamic", equal, True)):
        times, utils, moves = run(step_costs, shares, noise, args.microbatches, dynamic, args.move_cost, names)
        times, utils = times[args.warmup:], utils[args.warmup:]
        rows.append((label, utils.mean(), np.percentile(times, 99), times.mean(), moves))
    print(f"{'policy':<16} {'utilisation':>11} {'p99 step s':>11} {'mean step s':>11} {'devices moved':>13}")
    for label, util, p99, mean, moves in rows:
        print(f"{label:<16} {util:11.1%} {p99:11.4f} {mean:11.4f} {moves:13d}")
    static, _, dyn = rows
    print(f"dynamic vs static: utilisation {static[1]:.1%} -> {dyn[1]:.1%}, p99 step latency "
          f"{(dyn[2] / static[2] - 1):+.1%} (design: 65% -> 82%, -37%)")


if __name__ == "__main__":
    main()
