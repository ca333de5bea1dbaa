"""Hot path of the shared-memory transport: this tree against a baseline tree, in the same run.

Issue 23 added checks to the transport (segment validation at attach, a head/tail bound per
ring step, overflow-checked sizes and validated headers per call); the goal is no measurable
cost on the hot path. Each case runs in a fresh pair of processes per tree (PYTHONPATH = the
tree; the baseline needs its own built `_core`, e.g. `git archive main` + the main checkout's
`.so`), trees alternating A B A B ..., the median of the runs per case:

  small_allreduce  2000 x all_reduce of 1024 float32 (4 KB), ring       -> us per call
  pingpong         2000 x send + recv of 16 float32 (64 B) round trips  -> us per round trip
  large_allreduce  8 x all_reduce of 16 MB float32, ring (no direct)    -> ms per call
  p2p_small        2000 P2PChannel messages of 512 float32 (2 KB), tag each, flush every 8,
                   timed at the receiver (framing parsed per message)   -> us per message

Printed per case: both trees' medians and fastest runs (the less load-sensitive figure), the
ratios this / baseline of both (goal: <= 1.05), and every run.

First, the same trees' C++ hot path on one thread, in thread CPU time (hardly moved by the
machine's load): `ccsrc/tools/comm_hot_path.cc` built with g++ -O2 against each tree's
`ccsrc/comm`, run alternately; a 4 KB ring step pair and a 64-byte Communicator send + recv,
in ns per message (the fastest of the runs per tree, ratio goal <= 1.05).

Usage: .venv/bin/python benchmarks/bench_shm_hot_path.py --baseline /tmp/main_tree [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("small_allreduce", "pingpong", "large_allreduce", "p2p_small")


def worker(rank: int, name: str) -> None:
    import numpy as np

    from mindspore_hyper.comm import ShmCommunicator

    g = ShmCommunicator(name, rank, 2, timeout=60.0)
    g.direct_min_bytes = -1
    out = {}
    small = np.ones(1024, np.float32)
    for _ in range(200):
        g.all_reduce(small, algorithm="ring")
    g.barrier()
    t0 = time.perf_counter()
    for _ in range(2000):
        g.all_reduce(small, algorithm="ring")
    out["small_allreduce"] = (time.perf_counter() - t0) / 2000 * 1e6
    msg = np.ones(16, np.float32)
    g.barrier()
    t0 = time.perf_counter()
    for _ in range(2000):
        if rank == 0:
            g.send(msg, 1)
            g.recv_into(msg, 1)
        else:
            g.recv_into(msg, 0)
            g.send(msg, 0)
    out["pingpong"] = (time.perf_counter() - t0) / 2000 * 1e6
    big = np.ones(4 << 20, np.float32)
    g.all_reduce(big, op="max", algorithm="ring", out=big)
    g.barrier()
    t0 = time.perf_counter()
    for _ in range(8):
        g.all_reduce(big, op="max", algorithm="ring", out=big)
    out["large_allreduce"] = (time.perf_counter() - t0) / 8 * 1e3
    g.barrier()
    from mindspore_hyper.comm.p2p import P2PChannel

    ch = P2PChannel(name, "b", 0, 1, me=rank, timeout=60.0)
    payload = np.ones(512, np.float32)
    if rank == 0:
        for i in range(2100):
            ch.send(i, [payload], copy=False)
            if i % 8 == 7:
                ch.flush()
        ch.flush()
    else:
        for i in range(100):
            ch.recv(i)
        t0 = time.perf_counter()
        for i in range(100, 2100):
            ch.recv(i)
        out["p2p_small"] = (time.perf_counter() - t0) / 2000 * 1e6
    g.barrier()
    ch.close()
    g.close()
    print("RESULT " + json.dumps(out), flush=True)


def run_pair(tree: str) -> dict:
    env = dict(os.environ, PYTHONPATH=tree, MSHYPER_JOB_TOKEN=secrets.token_hex(16))
    name = "bench" + uuid.uuid4().hex[:10]
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), name], env=env, cwd=tree,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"worker under {tree} failed:\n{err[-3000:]}")
    merged = {}
    for out, _ in outs:  # rank 0 times the collectives, rank 1 the p2p receive
        line = next(l for l in out.splitlines() if l.startswith("RESULT "))
        result = json.loads(line[len("RESULT "):])
        merged.update(result if "p2p_small" not in result else {"p2p_small": result["p2p_small"]})
    return merged


def cpu_hot_path(trees: dict, runs: int) -> None:
    tool = os.path.join(HERE, "..", "ccsrc", "tools", "comm_hot_path.cc")
    binaries = {}
    for label, tree in trees.items():
        binaries[label] = os.path.join(tempfile.mkdtemp(prefix="hot_path_"), "comm_hot_path")
        sources = sorted(os.path.join(tree, "ccsrc", "comm", f) for f in os.listdir(os.path.join(tree, "ccsrc", "comm"))
                         if f.endswith(".cc"))
        subprocess.run(["g++", "-std=c++17", "-O2", "-pthread", f"-I{tree}/ccsrc", tool, *sources, "-o",
                        binaries[label], "-lrt"], check=True)
    figures = {label: {} for label in trees}
    for _ in range(runs):
        for label, binary in binaries.items():
            words = subprocess.run([binary], check=True, capture_output=True, text=True).stdout.split()
            for key, value in zip(words[::2], words[1::2]):
                figures[label].setdefault(key, []).append(float(value))
    for key in figures["this"]:
        this, base = min(figures["this"][key]), min(figures["baseline"][key])
        print(f"cpu {key:12s} ns/message      this {this:8.1f}  baseline {base:8.1f}  ratio {this / base:5.2f} "
              f"(goal <= 1.05; thread CPU time, fastest of {runs})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", help="a tree with its own built mindspore_hyper/_core (required)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(int(args.worker[0]), args.worker[1])
        return
    if not args.baseline:
        parser.error("--baseline is required")
    trees = {"this": os.path.dirname(HERE), "baseline": os.path.abspath(args.baseline)}
    cpu_hot_path(trees, max(args.runs, 3))
    results = {t: {c: [] for c in CASES} for t in trees}
    for _ in range(args.runs):
        for label, tree in trees.items():
            for case, value in run_pair(tree).items():
                results[label][case].append(value)
    print(f"load average {os.getloadavg()[0]:.1f} (1 min), {args.runs} runs per tree: median, fastest")
    units = {"small_allreduce": "us/call", "pingpong": "us/round trip", "large_allreduce": "ms/call",
             "p2p_small": "us/message"}
    for case in CASES:
        this, base = (statistics.median(results[t][case]) for t in ("this", "baseline"))
        this_min, base_min = (min(results[t][case]) for t in ("this", "baseline"))
        print(f"{case:16s} {units[case]:14s} this {this:8.1f} / {this_min:8.1f}  baseline {base:8.1f} / "
              f"{base_min:8.1f}  ratio {this / base:5.2f} / {this_min / base_min:5.2f} (goal <= 1.05)")
        print(f"{'':16s} runs: this {', '.join(f'{v:.1f}' for v in results['this'][case])}; "
              f"baseline {', '.join(f'{v:.1f}' for v in results['baseline'][case])}")


if __name__ == "__main__":
    main()
