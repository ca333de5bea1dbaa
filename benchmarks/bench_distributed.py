"""Distributed mode vs one device: one training step (forward, backward, AdamW update) of the
4-layer GPT benchmark model on 4 processes under msrun (data 2 x tensor 2, Megatron-style tensor
parallel, data-parallel gradients summed in the aggregator) divided by the same step on one
device; and the peer: the same model with torch DTensor on 4 processes over gloo (mp.spawn,
CPU, parallelize_module with the same plan, gradients all-reduced over "data") divided by
torch's single-device step. All four measured in this run, one after the other.

    python benchmarks/bench_distributed.py                               # hidden 768, seq 256, batch 8
    python benchmarks/bench_distributed.py --hidden 256 --heads 4 --seq 64   # quicker

Each process gets max(1, cores // processes) compute threads in both libraries (MindSpore's
runtime_num_threads, torch.set_num_threads). Our processes are bound to cores by the package's
default (flag cpu_binding, docs/distributed.md; `MS_HYPER_CPU_BINDING=none` for the A/B); torch's
4 processes run both unbound and pinned the same way (process r on core r % cores), and the
faster is the peer. Each library's single-device baseline is its fastest configuration measured
here (MindSpore: async or inline host dispatch, all cores or one; torch: all cores or one).
Prints the median of --repeat timed steps after one warm-up step (distributed: the slowest
rank's median), both ratios, and whether the distributed losses equal the single-device ones.
Without torch the torch rows are skipped with a message. Goal: ours <= 1.2x and <= torch's ratio.
"""
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from gpt_args import gpt_argument_parser  # noqa: E402

WORKERS = 4
MESH = (2, 2)


def threads_per_process(processes: int) -> int:
    return max(1, (os.cpu_count() or 1) // processes)


def pin(rank: int) -> None:
    """Pin this process (and the threads it starts later) to core rank % cores, what the
    package's cpu_binding does for 4 processes on 2 cores: the tensor-parallel peers (ranks 2d,
    2d+1 of mesh data x tensor) get different cores and compute at the same time."""
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})


def batch(args):
    rng = np.random.default_rng(0)
    return (rng.integers(0, args.vocab, (args.batch, args.seq)).astype(np.int32),
            rng.integers(0, args.vocab, (args.batch, args.seq)).astype(np.int32))


def cfg_of(args) -> dict:
    return dict(vocab=args.vocab, hidden=args.hidden, heads=args.heads, layers=args.layers, seq=args.seq)


# ---------------------------------------------------------------- ours
def ours(args, distributed: bool) -> dict:
    import mindspore as ms
    from mindspore import Tensor, nn

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import mindspore_hyper as mh
    from models import GPT

    ms.set_context(mode=ms.PYNATIVE_MODE)
    if distributed:  # before MindSpore's first op, so that host_dispatch (inline by default) acts
        mh.set_context(mode="distributed")
    ms.set_seed(0)
    if distributed and args.profile:
        import dist_profile

        dist_profile.install()
    ids, labels = (Tensor(a) for a in batch(args))
    model = GPT(**cfg_of(args))
    if distributed:
        ms.set_context(runtime_num_threads=threads_per_process(WORKERS))
        s = mh.Layout(MESH, ("data", "tensor"))(tensor_map=())
        s.override("*.qkv.*", "tensor").override("*.fc1.*", "tensor")
        s.override("*.proj.weight", None, "tensor").override("*.fc2.weight", None, "tensor")
        s.override("embed.*", "tensor").override("head.weight", "tensor")
        net = mh.auto_parallelize(model, s)
        optimizer = nn.AdamWeightDecay(net.optimizer_parameters(), learning_rate=1e-4)

        def step():
            return float(net.train_step(optimizer, ids, labels).asnumpy())
        if args.profile:
            return profiled(step, args.repeat)
    else:
        optimizer = nn.AdamWeightDecay(model.trainable_params(), learning_rate=1e-4)
        grad = ms.value_and_grad(model, None, optimizer.parameters)

        def step():
            loss, grads = grad(ids, labels)
            optimizer(grads)
            return float(loss.asnumpy())
    return timed(step, args.repeat)


def timed(step, repeat) -> dict:
    times, losses = [], []
    for i in range(repeat + 1):
        start = time.perf_counter()
        losses.append(step())
        if i:
            times.append(time.perf_counter() - start)
    return {"median": statistics.median(times), "times": times, "losses": losses}


def profiled(step, repeat) -> dict:
    """`timed` with the profiler's timers on for the timed steps, and its table (dist_profile)."""
    import dist_profile

    count = [0]

    def step_in_profile():
        if count[0]:
            dist_profile.PROFILE.step_begin()
        count[0] += 1
        try:
            return step()
        finally:
            if dist_profile.PROFILE.active:
                dist_profile.PROFILE.step_end()
    result = timed(step_in_profile, repeat)
    result["profile"] = dist_profile.table(result["median"])
    return result


def run_ours_distributed(args) -> dict:
    out = tempfile.mkdtemp(prefix="bench_distributed_")
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    # msrun parses options after the script itself: the worker's arguments travel in the environment
    env["BENCH_DISTRIBUTED_WORKER"] = json.dumps(["--worker", "ours", "--out", out] + forwarded(args))
    cmd = [os.path.join(os.path.dirname(sys.executable), "msrun"), f"--worker_num={WORKERS}",
           f"--local_worker_num={WORKERS}", "--master_port=8391", f"--log_dir={out}/logs", "--join=True", __file__]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"msrun failed ({proc.returncode}); logs in {out}/logs")
    ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(WORKERS)]
    slowest = max(ranks, key=lambda r: r["median"])
    if args.profile:
        import dist_profile

        print("mindspore_hyper profile:\n" + dist_profile.format_table(ranks[0]["profile"]))
    return {"median": slowest["median"], "times": slowest["times"], "losses": ranks[0]["losses"]}


# ---------------------------------------------------------------- torch
def torch_single(args) -> dict:
    import torch

    import bench_sim_overhead_torch as peer

    torch.manual_seed(0)
    ids, labels = (torch.from_numpy(a.astype(np.int64)) for a in batch(args))
    model = peer.GPT(**cfg_of(args))
    step = peer.single_device_step(model, ids, labels)
    return timed(step, args.repeat)


def torch_rank(rank: int, args, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, loss_parallel, parallelize_module

    import bench_sim_overhead_torch as peer

    if args.pin:
        pin(rank)
    torch.set_num_threads(threads_per_process(WORKERS))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")
    dist.init_process_group("gloo", rank=rank, world_size=WORKERS)
    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=("data", "tensor"))
    torch.manual_seed(0)
    model = peer.GPT(**cfg_of(args))
    for block in model.blocks:
        parallelize_module(block, mesh["tensor"], {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                                                  "fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    parallelize_module(model, mesh["tensor"], {
        "embed": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
    ids, labels = (torch.from_numpy(a.astype(np.int64)) for a in batch(args))
    data_rank, data_size = mesh["data"].get_local_rank(), MESH[0]
    ids, labels = ids.chunk(data_size)[data_rank], labels.chunk(data_size)[data_rank]
    params = list(model.parameters())
    optimizer = peer.make_optimizer(model)
    dp_group = mesh.get_group("data")

    phases = {}

    @contextlib.contextmanager
    def phase(name):
        """Wall seconds of a phase, and a torch.profiler range named phase:<name>."""
        start = time.perf_counter()
        with torch.profiler.record_function("phase:" + name):
            yield
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - start

    def step():
        optimizer.zero_grad(set_to_none=True)
        with loss_parallel():
            with phase("forward"):
                loss = model(ids, labels)
            with phase("backward"):
                loss.backward()
        with phase("grad sync"):
            for p in params:
                grad = p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad
                dist.all_reduce(grad, op=dist.ReduceOp.AVG, group=dp_group)
        with phase("optimizer"):
            optimizer.step()
        with phase("rest"):
            local = loss.full_tensor() if isinstance(loss, DTensor) else loss
            value = local.detach().clone()
            dist.all_reduce(value, op=dist.ReduceOp.AVG, group=dp_group)
        return value.item()

    result = timed(step, args.repeat)
    if args.profile:
        import dist_profile

        walls = {k: v / (args.repeat + 1) for k, v in phases.items()}  # mean over all steps, warm-up included
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step()
        result["profile"] = {"wall": walls, "collectives": dist_profile.torch_collective_seconds(prof)}
    with open(os.path.join(out, f"torch{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def run_torch_distributed(args) -> dict:
    import torch.multiprocessing as mp

    out = tempfile.mkdtemp(prefix="bench_distributed_torch_")
    mp.spawn(torch_rank, args=(args, out), nprocs=WORKERS, join=True)
    ranks = [json.load(open(os.path.join(out, f"torch{r}.json"))) for r in range(WORKERS)]
    slowest = max(ranks, key=lambda r: r["median"])
    if args.profile:
        prof = ranks[0]["profile"]
        print("torch profile (rank 0, s/step: wall, of which in collectives):")
        for name, wall in prof["wall"].items():
            print(f"  {name:<10} {wall:8.3f}  {prof['collectives'].get(name, 0.0):8.3f}")
    return {"median": slowest["median"], "times": slowest["times"], "losses": ranks[0]["losses"]}


# ---------------------------------------------------------------- driver
def forwarded(args):
    return [f"--layers={args.layers}", f"--hidden={args.hidden}", f"--heads={args.heads}", f"--seq={args.seq}",
            f"--batch={args.batch}", f"--vocab={args.vocab}", f"--repeat={args.repeat}"] + \
        (["--profile"] if args.profile else []) + (["--pin"] if args.pin else [])


def in_subprocess(which: str, args, env=None, one_core: bool = False) -> dict:
    """Run one measurement in a fresh interpreter (MindSpore and torch never share a process),
    on every core or, with `one_core`, pinned to the first one from its start."""
    pin_first = ["taskset", "-c", str(min(os.sched_getaffinity(0)))] if one_core else []
    proc = subprocess.run(pin_first + [sys.executable, __file__, "--worker", which] + forwarded(args),
                          capture_output=True, text=True, env=None if env is None else dict(os.environ, **env))
    if proc.returncode:
        sys.exit(f"{which} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fastest(name: str, runs: dict) -> dict:
    """The run of `runs` (configuration -> result) with the smallest median, after printing all."""
    print(f"{name}: " + ", ".join(f"{how} {r['median']:.3f} s" for how, r in runs.items()))
    return min(runs.values(), key=lambda r: r["median"])


def ours_single_baseline(args) -> dict:
    """MindSpore's fastest single-device configuration: its default async op pipeline or inline
    dispatch (what the CPU modes' host_dispatch flag asks for), on all cores or on one."""
    from mindspore_hyper.context import HOST_BLOCKING_ENV

    return fastest("mindspore single device", {
        "async dispatch": in_subprocess("ours-single", args, env={HOST_BLOCKING_ENV: "0"}),
        "inline dispatch": in_subprocess("ours-single", args, env={HOST_BLOCKING_ENV: "1"}),
        "inline dispatch, one core": in_subprocess("ours-single", args, env={HOST_BLOCKING_ENV: "1"}, one_core=True)})


def torch_single_baseline(args) -> dict:
    """torch's fastest single-device configuration: all cores, or one."""
    return fastest("torch single device", {"all cores": in_subprocess("torch-single", args),
                                           "one core": in_subprocess("torch-single", args, one_core=True)})


def torch_distributed_best(args) -> dict:
    """torch's 4 processes unbound and pinned (process r on core r % cores): the faster."""
    import copy

    pinned = copy.copy(args)
    pinned.pin = True
    return fastest("torch 4 processes", {"unbound": run_torch_distributed(args),
                                         "pinned": run_torch_distributed(pinned)})


def report(name, single, parallel):
    ratio = parallel["median"] / single["median"]
    same = max(abs(a - b) / abs(b) for a, b in zip(parallel["losses"], single["losses"]))
    print(f"{name}: single {single['median']:.3f} s, distributed {parallel['median']:.3f} s  "
          f"ratio {ratio:.2f}x   (losses equal single-device to {same:.1e} relative)")
    return ratio


def main():
    parser = gpt_argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=("ours", "ours-single", "torch-single"), help=argparse_hidden())
    parser.add_argument("--out", help=argparse_hidden())
    parser.add_argument("--pin", action="store_true", help=argparse_hidden())  # torch's pinned run
    parser.add_argument("--skip-torch", action="store_true", help="measure ours only (A/B of our changes)")
    parser.add_argument("--profile", action="store_true",
                        help="also print where rank 0's step time goes (dist_profile.py; blocking launches)")
    argv = json.loads(os.environ["BENCH_DISTRIBUTED_WORKER"]) if "BENCH_DISTRIBUTED_WORKER" in os.environ else None
    args = parser.parse_args(argv)
    if args.worker == "ours":
        rank = int(os.environ.get("RANK_ID", "0"))
        result = ours(args, distributed=True)
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        return
    if args.worker in ("ours-single", "torch-single"):
        print(json.dumps(ours(args, distributed=False) if args.worker == "ours-single" else torch_single(args)))
        return

    print(f"model: GPT {cfg_of(args)}, batch {args.batch}; {WORKERS} processes, mesh data {MESH[0]} x tensor "
          f"{MESH[1]}; {threads_per_process(WORKERS)} compute thread(s) per process, {os.cpu_count()} cores")
    ours_ratio = report("mindspore_hyper", ours_single_baseline(args), run_ours_distributed(args))
    if args.skip_torch:
        return
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch rows skipped: PyTorch is not installed (pip install torch==2.13.0, or .[bench])")
        return
    torch_ratio = report("torch DTensor (gloo)", torch_single_baseline(args), torch_distributed_best(args))
    verdict = "met" if ours_ratio <= min(1.2, torch_ratio) else "NOT met"
    print(f"goal (ours <= 1.2x and <= torch): {ours_ratio:.2f}x vs {torch_ratio:.2f}x -> {verdict}")


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
