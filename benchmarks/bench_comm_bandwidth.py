"""Large-message AllReduce bandwidth on the shared-memory transport against memcpy.

2 processes on this host all-reduce 64MB of float32 (max, in place) through `ShmCommunicator`:
  ring                chunk-pipelined ring through the shared-memory channels (two copies per byte:
                      into the ring, out of it -- reduced straight out of the ring)
  ring_direct         ring whose steps read the predecessor's buffer directly (cross-memory attach,
                      process_vm_readv: one copy); what "auto" uses from 1MB on when available
  recursive_doubling  log2(p) rounds exchanging the whole buffer
Variants are interleaved round by round. Reported per variant:
  algbw = 64MB / time            busbw = algbw * 2(p-1)/p   (the bytes each rank sends and receives)
Baseline in the same run: memcpy bandwidth of one 64MB copy (numpy.copyto into a pre-touched
buffer, one process), and the same copy while a second process copies too (both cores busy, like
the two ranks). Median of --trials; results checked against the expected sum.

Usage: .venv/bin/python benchmarks/bench_comm_bandwidth.py [--mb 64] [--trials 5]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
import uuid

import numpy as np


def _memcpy(nbytes: int, trials: int) -> float:
    src = np.ones(nbytes // 4, np.float32)
    dst = np.zeros_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(trials):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times)


def _memcpy_proc(nbytes, trials, q):
    q.put(_memcpy(nbytes, trials))


def _shm_worker(rank, size, name, nbytes, trials, channel_bytes, algorithms, q):
    from mindspore_hyper.comm import ShmCommunicator

    g = ShmCommunicator(name, rank, size, timeout=60, channel_bytes=channel_bytes)
    x = np.full(nbytes // 4, rank + 1, np.float32)
    x[::7] = -rank  # max over ranks: 0 there, `size` elsewhere; stable when reduced in place again
    times = {a: [] for a in algorithms}
    used = {}
    for algo in algorithms:  # warm-up
        g.direct_min_bytes = -1 if algo == "ring" else 1 << 20
        g.all_reduce(x, op="max", algorithm=algo, out=x)  # in place: no allocation in the timed loop
    for _ in range(trials):  # variants interleaved, so load changes hit them alike
        for algo in algorithms:
            g.direct_min_bytes = -1 if algo == "ring" else 1 << 20
            g.barrier()
            t0 = time.perf_counter()
            g.all_reduce(x, op="max", algorithm=algo, out=x)
            times[algo].append(time.perf_counter() - t0)
            used[algo] = g.last_algorithm
    assert x[0] == 0 and x[1] == size and x[-1] == (0 if (len(x) - 1) % 7 == 0 else size)
    if rank == 0:
        q.put({a: (statistics.median(times[a]), used[a]) for a in algorithms})
    g.close()


def run_shm(nbytes, trials, channel_bytes, algorithms, size=2):
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    name = "bw" + uuid.uuid4().hex[:8]
    ps = [ctx.Process(target=_shm_worker, args=(r, size, name, nbytes, trials, channel_bytes, algorithms, q))
          for r in range(size)]
    for p in ps:
        p.start()
    res = q.get(timeout=600)
    for p in ps:
        p.join()
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    nbytes = args.mb << 20
    p = 2
    memcpy_bw = _memcpy(nbytes, args.trials)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ps = [ctx.Process(target=_memcpy_proc, args=(nbytes, args.trials, q)) for _ in range(2)]
    for pr in ps:
        pr.start()
    both = [q.get(timeout=300) for _ in ps]
    for pr in ps:
        pr.join()
    memcpy2_bw = min(both)
    print(f"{args.mb}MB float32 AllReduce(max, in place), {p} processes, median of {args.trials}")
    print(f"memcpy 1 process:               {memcpy_bw / 1e9:6.2f} GB/s  (baseline)")
    print(f"memcpy 2 processes at once:     {memcpy2_bw / 1e9:6.2f} GB/s per process")
    for channel in (256 << 10, 4 << 20):
        res = run_shm(nbytes, args.trials, channel, ("ring", "ring_direct", "recursive_doubling"))
        for algo, (t, used) in res.items():
            algbw = nbytes / t
            busbw = algbw * 2 * (p - 1) / p
            print(f"shm {used:<18} channel {channel >> 10:5d}KB: {t * 1e3:8.1f} ms  algbw {algbw / 1e9:5.2f} GB/s  "
                  f"busbw {busbw / 1e9:5.2f} GB/s  = {busbw / memcpy_bw:.2f}x memcpy")
    res = run_shm(nbytes, 2, 256 << 10, ("auto",))
    print(f"auto choice for {args.mb}MB: {res['auto'][1]}")


if __name__ == "__main__":
    main()
