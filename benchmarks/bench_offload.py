"""Offloaded training step time: prefetch vs on-demand vs all-resident, in one run.

A stack of Dense layers whose parameters are at least 4x the device-tier budget is trained with
HyperOffload (parameters and Adam states in the store, updated on the host during the backward;
host pool small so most blocks live on the disk tier). The page cache is kept out of the way (`drop_page_cache=True`): the disk
files are opened with O_DIRECT (or, where the file system refuses it, posix_fadvise(DONTNEED) after
every disk write (after sync_file_range) and read). Three configurations
run in the same process on the same data, timed in interleaved rounds (median of the rounds):
  resident  : plain ms.value_and_grad + one nn.Adam, everything in memory (baseline)
  on-demand : HyperOffload with prefetch_depth=0 (every block fetched when needed)
  prefetch  : HyperOffload with the prefetch scheduler (depth from --depth)
Two measures of the transfer time hidden:
  step time : (t_on_demand - t_prefetch) / (t_on_demand - t_resident)
  overlap   : 1 - exposed / transfer, transfer = wall time during which a tier-to-tier block
              copy (disk I/O, CRC32C, memcpy) was in progress on any thread, exposed =
              training-thread waits for blocks + the update work left when the backward ends
              (the seed's overlap ratio)
--worker-nice sets the background threads' priority; --also-nice N adds a fourth configuration,
prefetch with worker nice N, for an A/B in the same rounds.

usage: python benchmarks/bench_offload.py [--layers 32] [--dim 1024] [--batch 64] [--steps 2] [--rounds 3]
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mindspore_hyper.offload import OffloadPolicy, OffloadStore, hyper_offload  # noqa: E402

MB = 1 << 20


class Stack(nn.Cell):
    def __init__(self, layers, dim):
        super().__init__()
        self.layers = nn.CellList([nn.Dense(dim, dim) for _ in range(layers)])
        self.head = nn.Dense(dim, 1)

    def construct(self, x):
        for layer in self.layers:
            x = ops.tanh(layer(x))
        return self.head(x)


def make_model(layers, dim, seed_values):
    model = Stack(layers, dim)
    for p, v in zip(model.trainable_params(), seed_values):
        p.set_data(Tensor(v.copy()))
    return model


def time_steps(step, steps):
    """Mean wall time of `steps` calls of `step`, in seconds."""
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--block-mb", type=int, default=4)
    ap.add_argument("--device-blocks", type=int, default=8)
    ap.add_argument("--host-blocks", type=int, default=16)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--steps", type=int, default=2, help="steps per configuration in each round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--dir", default="")
    ap.add_argument("--sync-writes", action="store_true", help="store writes on the training thread")
    ap.add_argument("--worker-nice", type=int, default=None,
                    help="nice value of the offload's background threads (default: the offload_worker_nice flag)")
    ap.add_argument("--also-nice", type=int, default=None,
                    help="also time prefetch with this worker nice value (an A/B in the same rounds)")
    args = ap.parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    bs = args.block_mb * MB
    budget = args.device_blocks * bs
    rng = np.random.default_rng(0)
    proto = Stack(args.layers, args.dim)
    values = [p.asnumpy() for p in proto.trainable_params()]
    param_bytes = sum(v.nbytes for v in values[:-2])  # offloaded: the Dense stack
    x = Tensor(rng.standard_normal((args.batch, args.dim)).astype(np.float32))
    y = Tensor(rng.standard_normal((args.batch, 1)).astype(np.float32))
    make_opt = lambda ps: nn.Adam(ps, learning_rate=1e-4)  # noqa: E731
    print(f"model: {args.layers} x Dense({args.dim},{args.dim}), offloaded params {param_bytes / MB:.0f}MB = "
          f"{param_bytes / budget:.1f}x the device budget ({args.device_blocks} blocks of {args.block_mb}MB = "
          f"{budget / MB:.0f}MB); host pool {args.host_blocks * args.block_mb}MB; Adam; batch {args.batch}")

    # All three configurations are built first, then timed in interleaved rounds (resident,
    # on-demand, prefetch, resident, ...), so a change in the machine's load during the run hits
    # all three alike; each figure is the median over the rounds of the mean step time.
    model = make_model(args.layers, args.dim, values)
    opt = make_opt(model.trainable_params())
    grad_fn = ms.value_and_grad(lambda a, b, m=model: ops.reduce_mean((m(a) - b) ** 2), None,
                                model.trainable_params())

    def resident_step():
        loss, grads = grad_fn(x, y)
        opt(grads)
        return float(loss.asnumpy())

    steps = {"resident": resident_step}
    offloaded = {}
    configs = [("on-demand", 0, args.worker_nice), ("prefetch", args.depth, args.worker_nice)]
    if args.also_nice is not None:
        configs.append((f"prefetch nice={args.also_nice}", args.depth, args.also_nice))
    for label, depth, nice in configs:
        directory = args.dir or tempfile.mkdtemp(prefix="mshyper_bench_")
        store = OffloadStore(block_size=bs, device_memory=budget, host_memory=args.host_blocks * bs,
                             offload_dir=directory, prefetch_depth=depth, drop_page_cache=True,
                             worker_nice=nice)
        m = make_model(args.layers, args.dim, values)
        off = hyper_offload(m, OffloadPolicy(cells=["layers.*"]), optimizer=make_opt, store=store,
                            async_writes=not args.sync_writes)
        step_fn = off.train_step(lambda a, b, m=m: ops.reduce_mean((m(a) - b) ** 2))
        steps[label] = lambda f=step_fn: float(f(x, y).asnumpy())
        offloaded[label] = (off, store)
    for label, step in steps.items():
        for _ in range(args.warmup):
            step()
    before = {}
    for label, (off, store) in offloaded.items():
        store.scheduler.drain()
        store.scheduler.reset_stats()
        st = off.stats()
        before[label] = (st["bytes_moved"], st["transfer_busy_ns"], st["update_wait_ns"])
    times = {label: [] for label in steps}
    for _ in range(args.rounds):
        for label, step in steps.items():
            times[label].append(time_steps(step, args.steps))
    t_res = float(np.median(times["resident"]))
    results = {}
    n_steps = args.rounds * args.steps
    for label, (off, store) in offloaded.items():
        st = off.stats()
        moved0, busy_ns0, wait_ns0 = before[label]
        moved = {k: (st["bytes_moved"][k] - moved0[k]) / n_steps for k in st["bytes_moved"] if st["bytes_moved"][k]}
        # Overlap as the seed counts it: of the wall time during which blocks were moving between
        # tiers (on any thread), the share the training thread did not wait for (blocks it had
        # to wait for, and the update work still running when the backward ended, count as exposed).
        transfer = (st["transfer_busy_ns"] - busy_ns0) / 1e9 / n_steps
        exposed = (st["prefetch"]["stall_ns"] + st["update_wait_ns"] - wait_ns0) / 1e9 / n_steps
        st["overlap"] = (transfer, exposed)
        results[label] = (float(np.median(times[label])), st, moved)
        off.remove()
        off.close()
        store.close()
    print("step times per round: " + " | ".join(
        f"{label} " + " ".join(f"{t:.3f}" for t in ts) for label, ts in times.items()))

    t_od, st_od, moved_od = results["on-demand"]
    t_pf, st_pf, moved_pf = results["prefetch"]
    print(f"step time  resident {t_res:.3f}s | on-demand {t_od:.3f}s | prefetch(depth={args.depth}) {t_pf:.3f}s "
          f"(worker nice {offloaded['prefetch'][1].worker_nice})")
    hidden = (t_od - t_pf) / (t_od - t_res) if t_od > t_res else float("nan")
    print(f"ratios     prefetch/resident {t_pf / t_res:.2f}x | on-demand/resident {t_od / t_res:.2f}x | "
          f"transfer time hidden by prefetch {100 * hidden:.0f}%")
    stall = {label: st["prefetch"]["stall_ns"] for label, (_, st, _) in results.items()}
    if stall["on-demand"] > 0:
        print(f"waits for blocks removed by prefetch {100 * (1 - stall['prefetch'] / stall['on-demand']):.0f}% "
              f"(training-thread stall, on-demand -> prefetch)")
    for label, (t, st, moved) in results.items():
        transfer, exposed = st["overlap"]
        print(f"{label:>9}: transfer {transfer:.3f}s/step (wall time with a tier copy in progress), exposed {exposed:.3f}s/step "
              f"(waits for blocks + for updates after the backward): {100 * max(0.0, 1 - exposed / transfer):.0f}% "
              f"of the transfer time overlapped")
    for label, (t, st, moved) in results.items():
        if label not in ("on-demand", "prefetch"):
            print(f"{label}: step {t:.3f}s = {t / t_res:.2f}x resident (prefetch {t_pf / t:.2f}x of it)")
        pf = st["prefetch"]
        per_step = ", ".join(f"{k} {v / MB:.0f}MB" for k, v in sorted(moved.items()))
        print(f"{label:>9}: hits {pf['hits']} late {pf['late']} misses {pf['misses']} stall "
              f"{pf['stall_ns'] / 1e9 / n_steps:.3f}s/step; device peak {st['device']['peak_bytes'] / MB:.0f}MB "
              f"<= {budget / MB:.0f}MB; moved per step: {per_step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
