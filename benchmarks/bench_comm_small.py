"""Small-message AllReduce: 2 processes, 1000 AllReduces of 4KB (1024 float32) each.

Measured in one run (the baseline first, ratios printed against it):
  ms_individual     1000 x mint.distributed.all_reduce through MindSpore's CPU backend (msrun)
  ms_aggregated     the same 1000 requests through this library's aggregator, packets carried
                    by mint.distributed (MindSpore transport), 4MB super-packets
  shm_individual    1000 x all_reduce on this library's shared-memory transport, one by one
  shm_aggregated    the 1000 requests through the aggregator on the shared-memory transport
  shm_bucketed      the caller's own bucket on the shared-memory transport: concatenate the 1000
                    arrays, one all_reduce in place, split (the same work as gloo_bucketed)
  gloo_individual   1000 x torch.distributed.all_reduce (gloo, torch CPU)
  gloo_bucketed     torch: the 1000 tensors flattened into one bucket, one all_reduce, split back

Each variant: 2 warm-up rounds, then the median of --trials rounds; a round = submit all 1000,
wait for all results (results checked against the expected sums). Times are rank 0's.

Usage: .venv/bin/python benchmarks/bench_comm_small.py [--trials 5] [--no-torch]
"""
from __future__ import annotations

import argparse
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rounds(fn, trials):
    for _ in range(2):
        fn()
    times = []
    for _ in range(trials):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


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

    from mindspore_hyper.comm import MindSporeGroup

    g = MindSporeGroup(aggregation_bytes=4 << 20)
    rank, size = g.rank, g.size
    xs = [np.full(N_ELEM, rank + i % 7, np.float32) for i in range(N_MSG)]
    expect = [float(sum(r + i % 7 for r in range(size))) for i in range(N_MSG)]
    res = {}

    def ms_individual():
        outs = []
        for x in xs:
            t = ms.Tensor(x)
            dist.all_reduce(t)
            outs.append(t)
        for o, e in zip(outs[::97], expect[::97]):
            assert float(o.asnumpy()[0]) == e

    def ms_aggregated():
        hs = [g.all_reduce_async(x) for x in xs]
        g.flush()
        for i, h in enumerate(hs):
            assert h.wait()[0] == expect[i]

    shm = g.shm()

    def shm_individual():
        for i, x in enumerate(xs):
            y = shm.all_reduce(x)
            assert y[0] == expect[i]

    def shm_aggregated():
        hs = [shm.all_reduce_async(x) for x in xs]
        shm.flush()
        for i, h in enumerate(hs):
            assert h.wait()[0] == expect[i]

    def shm_bucketed():  # the user's own bucket, exactly like gloo_bucketed
        flat = np.concatenate(xs)
        shm.all_reduce(flat, out=flat)
        outs = np.split(flat, N_MSG)
        assert all(o[0] == e for o, e in zip(outs[::97], expect[::97]))

    for name, fn in (("ms_individual", ms_individual), ("ms_aggregated", ms_aggregated),
                     ("shm_individual", shm_individual), ("shm_aggregated", shm_aggregated),
                     ("shm_bucketed", shm_bucketed)):
        shm.barrier()
        res[name] = _rounds(fn, trials)
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
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
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

    def individual():
        outs = [x.clone() for x in xs]
        for o in outs:
            tdist.all_reduce(o)
        assert all(float(o[0]) == e for o, e in zip(outs[::97], expect[::97]))

    def bucketed():
        flat = torch.cat(xs)
        tdist.all_reduce(flat)
        outs = list(torch.split(flat, N_ELEM))
        assert all(float(o[0]) == e for o, e in zip(outs[::97], expect[::97]))

    res = {}
    for name, fn in (("gloo_individual", individual), ("gloo_bucketed", bucketed)):
        tdist.barrier()
        res[name] = _rounds(fn, trials)
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
    res = q.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--msrun-worker", default=None)
    args = ap.parse_args()
    if args.msrun_worker:
        msrun_worker(args.msrun_worker, args.trials)
        return
    res = run_msrun(args.trials)
    if not args.no_torch:
        try:
            res.update(run_gloo(args.trials))
        except ImportError:
            print("torch not installed: gloo rows skipped (pip install torch==2.13.0)")
    base = res["ms_individual"]
    print(f"2 processes, {N_MSG} AllReduces of {N_ELEM * 4} B (float32), median of {args.trials} rounds, rank 0")
    print(f"{'variant':<18}{'round [ms]':>12}{'per msg [us]':>14}{'speed-up vs ms_individual':>28}")
    for name in ("ms_individual", "ms_aggregated", "shm_individual", "shm_aggregated", "shm_bucketed",
                 "gloo_individual", "gloo_bucketed"):
        if name in res:
            t = res[name]
            print(f"{name:<18}{t * 1e3:>12.2f}{t / N_MSG * 1e6:>14.1f}{base / t:>27.1f}x")
    if "gloo_individual" in res:
        print(f"shm_aggregated vs gloo_individual: {res['gloo_individual'] / res['shm_aggregated']:.1f}x faster; "
              f"vs gloo_bucketed: {res['gloo_bucketed'] / res['shm_aggregated']:.2f}x")
        print(f"shm_bucketed   vs gloo_bucketed: {res['gloo_bucketed'] / res['shm_bucketed']:.2f}x")
        print(f"ms_aggregated  vs gloo_individual: {res['gloo_individual'] / res['ms_aggregated']:.1f}x faster; "
              f"vs gloo_bucketed: {res['gloo_bucketed'] / res['ms_aggregated']:.2f}x")
    print("aggregator stats (shm):", res["shm_aggregated_stats"])


if __name__ == "__main__":
    main()
