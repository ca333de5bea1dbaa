"""Simulation overhead: one training step (forward, backward, AdamWeightDecay update) of a GPT-style
stack on 8 virtual devices (data 2 x tensor 4, Megatron-style tensor parallel, ZeRO-1) divided by
the same step on a single device, both measured in this run on the same machine.

    python benchmarks/bench_sim_overhead.py                 # 4 layers, hidden 768, seq 256, batch 8
    python benchmarks/bench_sim_overhead.py --hidden 256 --seq 64   # quicker

Prints the median of --repeat timed steps after one warm-up step for each, the ratio, and where
the simulated step's time goes (ops dispatched, shards run, redistributions). When PyTorch is
installed (the test extras), the peer `bench_sim_overhead_torch.py` (torch LocalTensor, the same
model and mesh) then runs in a subprocess with the same options, and both ratios are printed side
by side with the machine's load average (`--no-torch` skips the peer).
"""
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper import Layout, auto_parallelize  # noqa: E402
from models import GPT  # noqa: E402
from gpt_args import gpt_argument_parser  # noqa: E402


def strategy():
    s = Layout((2, 4), ("data", "tensor"))(tensor_map=(), optimizer_state="data")
    s.override("*.qkv.*", "tensor").override("*.fc1.*", "tensor")
    s.override("*.proj.weight", None, "tensor").override("*.fc2.weight", None, "tensor")
    s.override("embed.*", "tensor").override("head.weight", "tensor")
    return s


def time_steps(net, params, batch, repeat):
    optimizer = nn.AdamWeightDecay(params, learning_rate=1e-4)
    step = ms.value_and_grad(net, None, optimizer.parameters)
    times = []
    for i in range(repeat + 1):
        start = time.perf_counter()
        loss, grads = step(*batch)
        optimizer(grads)
        loss.asnumpy()
        if i:  # the first step is warm-up
            times.append(time.perf_counter() - start)
    return statistics.median(times), times


def torch_peer_ratio(argv):
    """The peer benchmark's simulated / single-device ratio (run with the same options), or None
    with the reason when PyTorch is missing or the peer fails."""
    if importlib.util.find_spec("torch") is None:
        return None, "torch not installed (pip install torch==2.13.0)"
    peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_sim_overhead_torch.py")
    run = subprocess.run([sys.executable, peer, *argv], capture_output=True, text=True)
    found = re.search(r"ratio simulated / single-device: ([0-9.]+)x", run.stdout)
    if run.returncode or not found:
        return None, f"the torch peer failed (exit {run.returncode}): {run.stderr.strip()[-500:]}"
    return float(found.group(1)), run.stdout


def main():
    parser = gpt_argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--no-torch", action="store_true", help="skip the torch LocalTensor peer")
    args = parser.parse_args()
    peer_argv = [a for a in sys.argv[1:] if a != "--no-torch"]
    load_before = os.getloadavg()

    # Both sides with synchronous kernel launches: the simulation switches them on when it wraps
    # the model (flag sim_synchronize), which would otherwise leave only the single-device step on
    # MindSpore's asynchronous pipeline (docs/simulation.md, "Synchronous kernel launches").
    ms.runtime.launch_blocking()
    ms.set_seed(0)
    mh.set_context(mode="simulation", device_num=8)
    cfg = dict(vocab=args.vocab, hidden=args.hidden, heads=args.heads, layers=args.layers, seq=args.seq)
    rng = np.random.default_rng(0)
    batch = (Tensor(rng.integers(0, args.vocab, (args.batch, args.seq)).astype(np.int32)),
             Tensor(rng.integers(0, args.vocab, (args.batch, args.seq)).astype(np.int32)))

    single = GPT(**cfg)
    base, base_all = time_steps(single, single.trainable_params(), batch, args.repeat)
    model = GPT(**cfg)
    parallel = auto_parallelize(model, strategy())
    sim, sim_all = time_steps(parallel, model.trainable_params(), batch, args.repeat)
    report = parallel.report()

    print(f"model: GPT {cfg}, batch {args.batch}; mesh data 2 x tensor 4 (8 virtual devices)")
    print(f"single-device step: median {base:.3f} s  (all: {', '.join(f'{t:.3f}' for t in base_all)})")
    print(f"simulated step:     median {sim:.3f} s  (all: {', '.join(f'{t:.3f}' for t in sim_all)})")
    print(f"ratio simulated / single-device: {sim / base:.2f}x   (goal <= 1.1x)")
    fwd = sum(v["count"] for axes in report.comm.values() for v in axes.values())
    print(f"forward collectives simulated per step: {fwd}; replication fallbacks: {report.fallbacks or 'none'}")
    load_ours = os.getloadavg()
    peer, detail = (None, "skipped (--no-torch)") if args.no_torch else torch_peer_ratio(peer_argv)
    print(f"load average (1, 5, 15 min): before {load_before}, after ours {load_ours}, after the peer {os.getloadavg()}")
    print(f"side by side: mindspore_hyper simulation {sim / base:.2f}x single device; torch LocalTensor "
          + (f"{peer:.2f}x single device" if peer is not None else f"not measured: {detail}"))


if __name__ == "__main__":
    main()
