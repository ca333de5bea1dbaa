"""Context parallelism in simulation: peak activation bytes per device and the modelled step time
against one device, for ring and Ulysses attention.

    python benchmarks/bench_context_parallel.py                 # seq 256, cp 4
    python benchmarks/bench_context_parallel.py --seq 512 --cp 4 --layers 2
    python benchmarks/bench_context_parallel.py --msrun --seq 512 --hidden 128 --layers 2   # 2 processes

The example GPT (examples/models.py; batch 1, hidden 32, 4 heads, causal) takes one training
forward and backward (value_and_grad of the loss) in simulation:

- single: one device at sequence length S (a 1-device mesh: the same accounting);
- cp: cp devices at S (same work split: goal peak activations per device <= 1/cp + 10%);
- cp at cp*S: cp devices at cp times the sequence (what context parallelism is for).

Peak activation bytes are the simulation's per-device accounting (`Accounting.peak_bytes`: every
DTensor made in a training forward is held until the step ends; what ring attention keeps for
its backward beside DTensors is added by formula: the rows' log-sum-exp and, in zigzag order, its
q/k/v chunks; a block's scores live only while the ring computes it). The modelled step time is the report's
communication estimate (`comm_time_estimate_s`, the library's cost model on the `topology`
flag) plus the forward+backward FLOPs of one device at the `--tflops` rate (6 * params * tokens
+ attention 12 * layers * t * t * hidden, causal blocks skipped by ring counted off); a
simulation's wall time measures this process, not a device, and is printed only as such.

`--msrun` measures the ring under msrun instead: 2 processes (cp 2, the shared-memory
transport), the same GPT at `--seq`, `--steps` training steps (forward and backward, after one
warm-up) with the asynchronous shifts (`ProcessCollectives.ring_shift_async`: posted before the
blocks they overlap, waited for after them; forward: the next K/V; backward, in ring attention's
own backward pass: the next K/V with the gradient accumulators of the current ones) and as many
with blocking shifts (each waited for as soon as it is posted), alternating. Per asynchronous
shift the comm library's timings (`ring_timings`, tagged with their pass): transfer = post to the
last byte received (the sender thread), wait = how long the compute thread blocked in `wait()`;
the hidden fraction is 1 - sum(wait) / sum(transfer), per rank and pass. The last shift of the
backward (the accumulators coming home) has no compute to hide behind.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "examples"))


def run(seq: int, devices: int, method, layers: int, hidden: int, heads: int, tflops: float) -> dict:
    import mindspore as ms
    from mindspore import Tensor

    import mindspore_hyper as mh
    from mindspore_hyper.shard import Layout
    from models import GPT

    ms.set_seed(0)
    model = GPT(vocab=64, hidden=hidden, heads=heads, layers=layers, seq=seq)
    mesh = Layout((devices,), ("cp",))
    strategy = mesh(tensor_map=()) if method is None else mesh(tensor_map=(), context_parallel="cp",
                                                               context_method=method)
    mh.set_context(mode="simulation", device_num=devices)
    parallel = mh.auto_parallelize(model, strategy)
    rng = np.random.default_rng(0)
    ids = Tensor(rng.integers(0, 64, (1, seq)).astype(np.int32))
    labels = Tensor(rng.integers(0, 64, (1, seq)).astype(np.int32))
    ms.value_and_grad(parallel, None, model.trainable_params())(ids, labels)
    report = parallel.report()
    params = sum(int(np.prod(p.shape)) for p in model.trainable_params())
    attention = 12 * layers * seq * seq * hidden * (0.5 if method == "ring" else 1.0)  # fwd+bwd, causal skip
    flops = (6 * params * seq + attention) / devices
    return {"peak": parallel.accounting.peak_bytes, "comm_s": report.comm_time_estimate_s,
            "compute_s": flops / (tflops * 1e12), "wall_s": parallel.last_step_seconds}


def msrun_worker(out_dir: str, seq: int, layers: int, hidden: int, heads: int, steps: int) -> None:
    """One cp member (see module docstring): writes rank<r>.json with its timings."""
    import mindspore as ms
    from mindspore import Tensor

    import mindspore_hyper as mh
    from mindspore_hyper.comm.ring_shift_async import hidden_fraction
    from mindspore_hyper.shard import Layout
    from models import GPT

    ms.set_context(mode=ms.PYNATIVE_MODE)
    mh.set_context(mode="distributed", comm_timeout=120.0)
    ms.set_seed(0)
    model = GPT(vocab=64, hidden=hidden, heads=heads, layers=layers, seq=seq)
    parallel = mh.auto_parallelize(model, Layout((2,), ("cp",))(tensor_map=(), context_parallel="cp",
                                                               context_method="ring"))
    collectives = parallel.execution.collectives
    posted = collectives.ring_shift_async

    def blocking(tensors, group, phase="forward"):
        handle = posted(tensors, group, phase=phase)
        handle.wait()  # before the caller computes: nothing overlaps
        return handle

    rng = np.random.default_rng(0)
    ids = Tensor(rng.integers(0, 64, (1, seq)).astype(np.int32))
    labels = Tensor(rng.integers(0, 64, (1, seq)).astype(np.int32))
    step = ms.value_and_grad(parallel, None, model.trainable_params())
    times = {"async": [], "blocking": []}
    timings = []  # of the timed asynchronous steps
    for i in range(2 * steps + 2):
        mode = "async" if i % 2 == 0 else "blocking"
        collectives.ring_shift_async = posted if mode == "async" else blocking
        before = len(collectives.ring_timings)
        begin = time.perf_counter()
        loss, _ = step(ids, labels)
        float(loss.asnumpy())
        if i < 2:  # warm-up of each mode
            continue
        times[mode].append(time.perf_counter() - begin)
        if mode == "async":
            timings += list(collectives.ring_timings)[before:]
    out = {"rank": parallel.local_ranks[0], "step_async_s": float(np.median(times["async"])),
           "step_blocking_s": float(np.median(times["blocking"]))}
    for phase in ("forward", "backward"):
        mine = [t for t in timings if t.phase == phase]
        out[phase] = {"hidden": hidden_fraction(mine), "shifts": len(mine),
                      "transfer_ms": 1e3 * float(np.mean([t.transfer_s for t in mine])),
                      "wait_ms": 1e3 * float(np.mean([t.wait_s for t in mine])),
                      "kib": float(np.mean([t.nbytes for t in mine])) / 2**10}
    with open(os.path.join(out_dir, f"rank{out['rank']}.json"), "w") as f:
        json.dump(out, f)


def run_msrun(args) -> None:
    """Launch `msrun_worker` on 2 processes and print each rank's figures."""
    bindir = os.path.dirname(sys.executable)
    with tempfile.TemporaryDirectory() as d:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
        cmd = [os.path.join(bindir, "msrun"), "--worker_num=2", "--local_worker_num=2", f"--master_port={port}",
               f"--log_dir={d}/logs", "--join=True", os.path.abspath(__file__), "--msrun-worker", d,
               "--seq", str(args.seq), "--layers", str(args.layers), "--hidden", str(args.hidden),
               "--heads", str(args.heads), "--steps", str(args.steps)]
        print(f"load before {os.getloadavg()}")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        print(f"load after {os.getloadavg()}")
        if proc.returncode != 0:
            log = os.path.join(d, "logs", "worker_0.log")
            tail = open(log).read()[-3000:] if os.path.exists(log) else ""
            raise SystemExit("msrun failed:\n" + proc.stderr[-2000:] + tail)
        for rank in range(2):
            with open(os.path.join(d, f"rank{rank}.json")) as f:
                r = json.load(f)
            for phase in ("forward", "backward"):
                p = r[phase]
                print(f"rank {rank} {phase:8s}: {p['shifts']} async shifts of {p['kib']:.1f} KiB (mean): transfer "
                      f"{p['transfer_ms']:.3f} ms, compute waited {p['wait_ms']:.3f} ms (means); hidden fraction "
                      f"{p['hidden']:.3f}")
            print(f"rank {rank}: median step with async shifts {r['step_async_s'] * 1e3:.1f} ms, with blocking "
                  f"shifts {r['step_blocking_s'] * 1e3:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--cp", type=int, default=4)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--tflops", type=float, default=100.0, help="modelled device rate for the compute term")
    parser.add_argument("--msrun", action="store_true", help="measure the msrun ring's hidden transfer fraction")
    parser.add_argument("--steps", type=int, default=5, help="--msrun: timed training steps per mode")
    parser.add_argument("--msrun-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.msrun_worker:
        return msrun_worker(args.msrun_worker, args.seq, args.layers, args.hidden, args.heads, args.steps)
    if args.msrun:
        return run_msrun(args)
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    print(f"load {os.getloadavg()}")
    shape = dict(layers=args.layers, hidden=args.hidden, heads=args.heads, tflops=args.tflops)
    single = run(args.seq, 1, None, **shape)
    print(f"single device, seq {args.seq}: peak activations {single['peak'] / 2**20:.2f} MiB, modelled step "
          f"{(single['comm_s'] + single['compute_s']) * 1e3:.3f} ms (simulation wall {single['wall_s']:.2f} s)")
    for method in ("ring", "ulysses"):
        for seq in (args.seq, args.cp * args.seq):
            res = run(seq, args.cp, method, **shape)
            step = res["comm_s"] + res["compute_s"]
            base = single["comm_s"] + single["compute_s"]
            print(f"{method:8s} cp={args.cp} seq {seq:6d}: peak/device {res['peak'] / 2**20:8.2f} MiB = "
                  f"{res['peak'] / single['peak']:.3f} x single at seq {args.seq} (goal at the same seq <= "
                  f"{1 / args.cp + 0.1:.3f}); modelled step {step * 1e3:.3f} ms = {step / base:.3f} x single "
                  f"(comm {res['comm_s'] * 1e3:.3f} ms); simulation wall {res['wall_s']:.2f} s")


if __name__ == "__main__":
    main()
