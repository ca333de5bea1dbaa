"""Small-message AllReduce: 2 processes, 1000 AllReduces of 4KB (1024 float32) each.

Measured in one run (rank 0's times; ratios printed against baselines of the same run):
  ms_individual        1000 x mint.distributed.all_reduce through MindSpore's CPU backend (msrun)
  ms_one_allreduce     ONE mint.distributed.all_reduce of the same 4MB, already in one array
                       (Tensor, all_reduce, asnumpy): the baseline of the MindSpore-transport goal
  ms_bucketed          the caller's own bucket: concatenate the 1000 arrays, that one all_reduce, split
  ms_aggregated        the 1000 requests through this library's aggregator, one all_reduce_async
                       each, packets carried by mint.distributed (MindSpore transport)
  ms_aggregated_many   the same through one all_reduce_async_many call (the batched submit)
  shm_individual       1000 x all_reduce on this library's shared-memory transport
  shm_bucketed         the caller's own bucket on the shared-memory transport: concatenate, one
                       all_reduce in place, split: the baseline of the shared-memory goal
  shm_aggregated       the 1000 requests through the aggregator on the shared-memory transport
  shm_aggregated_many  the same through one all_reduce_async_many call
  gloo_individual      1000 x torch.distributed.all_reduce (gloo, torch CPU; needs torch)
  gloo_bucketed        torch: the 1000 tensors flattened into one bucket, one all_reduce, split back

A round = submit all 1000, wait for every result (checked against the expected sums). Variants
are interleaved round by round (2 warm-up rounds each, then the median of --trials rounds, and
the fastest round as a less load-sensitive second figure), so load changes on the shared machine
hit them alike. Aggregated variants use 4MB super-packets.

Goals (issue 11): shm_aggregated(_many) <= 1.2 x shm_bucketed; ms_aggregated(_many) <= 1.2 x
ms_one_allreduce.

Usage: .venv/bin/python benchmarks/bench_comm_small.py [--trials 7] [--no-torch]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

N_MSG = 1000
N_ELEM = 1024  # 4KB of float32
GOAL = 1.2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _interleaved(variants: dict, trials: int, barrier) -> dict:
    """Per variant the median seconds and (key "<name>_best") the fastest round: 2 warm-up rounds
    each, then `trials` rounds, variants interleaved."""
    for fn in variants.values():
        for _ in range(2):
            barrier()
            fn()
    times = {name: [] for name in variants}
    for _ in range(trials):
        for name, fn in variants.items():
            barrier()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    res = {name: statistics.median(ts) for name, ts in times.items()}
    res.update({name + "_best": min(ts) for name, ts in times.items()})
    return res


# ----- msrun worker: MindSpore and shared-memory variants ------------------------------------
def msrun_worker(out_dir: str, trials: int) -> None:
    import numpy as np
    import mindspore as ms
    from mindspore.communication import init

    ms.set_device("CPU")
    init()
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return
    from mindspore.mint import distributed as dist

    from mindspore_hyper.comm import MindSporeCommunicator

    g = MindSporeCommunicator(aggregation_bytes=4 << 20)
    rank, size = g.rank, g.size
    xs = [np.full(N_ELEM, rank + i % 7, np.float32) for i in range(N_MSG)]
    expect = [float(sum(r + i % 7 for r in range(size))) for i in range(N_MSG)]
    flat_in = np.concatenate(xs)

    def check(outs):
        assert all(o[0] == e for o, e in zip(outs[::97], expect[::97]))

    def ms_individual():
        outs = []
        for x in xs:
            t = ms.Tensor(x)
            dist.all_reduce(t)
            outs.append(t)
        outs[::97] = [o.asnumpy() for o in outs[::97]]  # the sampled results (waits for them)
        check(outs)

    def ms_one_allreduce():
        t = ms.Tensor(flat_in)
        dist.all_reduce(t)
        out = t.asnumpy()
        assert out[0] == expect[0] and out[-1] == expect[-1]

    def ms_bucketed():
        t = ms.Tensor(np.concatenate(xs))
        dist.all_reduce(t)
        check(np.split(t.asnumpy(), N_MSG))

    def ms_aggregated():
        hs = [g.all_reduce_async(x) for x in xs]
        g.flush()
        check([h.wait() for h in hs])

    def ms_aggregated_many():
        h = g.all_reduce_async_many(xs)
        g.flush()
        check(h.wait())

    shm = g.shm()

    def shm_individual():
        check([shm.all_reduce(x) for x in xs])

    def shm_bucketed():  # the user's own bucket, exactly like gloo_bucketed
        flat = np.concatenate(xs)
        shm.all_reduce(flat, out=flat)
        check(np.split(flat, N_MSG))

    def shm_aggregated():
        hs = [shm.all_reduce_async(x) for x in xs]
        shm.flush()
        check([h.wait() for h in hs])

    def shm_aggregated_many():
        h = shm.all_reduce_async_many(xs)
        shm.flush()
        check(h.wait())

    res = _interleaved({f.__name__: f for f in (
        ms_individual, ms_one_allreduce, ms_bucketed, ms_aggregated, ms_aggregated_many,
        shm_individual, shm_bucketed, shm_aggregated, shm_aggregated_many)}, trials, shm.barrier)
    res["shm_aggregated_stats"] = shm.aggregator_stats()
    res["ms_aggregated_stats"] = g.aggregator_stats()
    g.close()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(res, f)


def run_msrun(trials: int) -> dict:
    here = os.path.abspath(__file__)
    bindir = os.path.dirname(sys.executable)
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
        cmd = [os.path.join(bindir, "msrun"), "--worker_num=2", "--local_worker_num=2",
               f"--master_port={_free_port()}", f"--log_dir={d}/logs", "--join=True", here,
               "--msrun-worker", d, "--trials", str(trials)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            log = open(f"{d}/logs/worker_0.log").read()[-3000:] if os.path.exists(f"{d}/logs/worker_0.log") else ""
            raise SystemExit("msrun failed:\n" + proc.stderr[-2000:] + log)
        with open(os.path.join(d, "rank0.json")) as f:
            return json.load(f)


# ----- torch gloo --------------------------------------------------------------------------
def _gloo_worker(rank, size, port, trials, q):
    import torch
    import torch.distributed as tdist

    torch.set_num_threads(1)
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    xs = [torch.full((N_ELEM,), float(rank + i % 7)) for i in range(N_MSG)]
    expect = [float(sum(r + i % 7 for r in range(size))) for i in range(N_MSG)]

    def gloo_individual():
        outs = [x.clone() for x in xs]
        for o in outs:
            tdist.all_reduce(o)
        assert all(float(o[0]) == e for o, e in zip(outs[::97], expect[::97]))

    def gloo_bucketed():
        flat = torch.cat(xs)
        tdist.all_reduce(flat)
        outs = list(torch.split(flat, N_ELEM))
        assert all(float(o[0]) == e for o, e in zip(outs[::97], expect[::97]))

    res = _interleaved({"gloo_individual": gloo_individual, "gloo_bucketed": gloo_bucketed}, trials, tdist.barrier)
    tdist.destroy_process_group()
    if rank == 0:
        q.put(res)


def run_gloo(trials: int) -> dict:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_gloo_worker, args=(r, 2, port, trials, q)) for r in range(2)]
    for p in procs:
        p.start()
    res = q.get(timeout=1800)
    for p in procs:
        p.join(timeout=60)
    return res


def _ratio_line(res: dict, name: str, base: str) -> str:
    ratio = res[name] / res[base]
    best = res[name + "_best"] / res[base + "_best"]
    return (f"  {name:<20} / {base:<17} = {ratio:5.2f}x  ({'met' if ratio <= GOAL else 'MISSED'}: goal <= {GOAL}x; "
            f"fastest rounds: {best:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--msrun-worker", default=None)
    args = ap.parse_args()
    if args.msrun_worker:
        msrun_worker(args.msrun_worker, args.trials)
        return
    res = run_msrun(args.trials)
    if args.no_torch:
        print("--no-torch: gloo rows skipped")
    elif importlib.util.find_spec("torch") is None:
        print("torch is not installed: gloo rows skipped (pip install torch==2.13.0 to measure them)")
    else:
        res.update(run_gloo(args.trials))
    base = res["ms_individual"]
    print(f"2 processes, {N_MSG} AllReduces of {N_ELEM * 4} B (float32), median of {args.trials} interleaved rounds, "
          "rank 0")
    print(f"{'variant':<21}{'round [ms]':>11}{'fastest [ms]':>13}{'per msg [us]':>14}{'vs ms_individual':>18}")
    for name in ("ms_individual", "ms_one_allreduce", "ms_bucketed", "ms_aggregated", "ms_aggregated_many",
                 "shm_individual", "shm_bucketed", "shm_aggregated", "shm_aggregated_many",
                 "gloo_individual", "gloo_bucketed"):
        if name in res:
            t = res[name]
            print(f"{name:<21}{t * 1e3:>11.2f}{res[name + '_best'] * 1e3:>13.2f}{t / N_MSG * 1e6:>14.2f}"
                  f"{base / t:>17.1f}x")
    print("goals:")
    for name in ("shm_aggregated", "shm_aggregated_many"):
        print(_ratio_line(res, name, "shm_bucketed"))
    for name in ("ms_aggregated", "ms_aggregated_many"):
        print(_ratio_line(res, name, "ms_one_allreduce"))
    print(f"  ms_aggregated_many   / ms_bucketed       = {res['ms_aggregated_many'] / res['ms_bucketed']:5.2f}x")
    if "gloo_bucketed" in res:
        print(f"  shm_aggregated_many  / gloo_bucketed     = {res['shm_aggregated_many'] / res['gloo_bucketed']:5.2f}x")
    print("aggregator stats (shm):", res["shm_aggregated_stats"])
    print("aggregator stats (ms): ", res["ms_aggregated_stats"])


if __name__ == "__main__":
    main()
