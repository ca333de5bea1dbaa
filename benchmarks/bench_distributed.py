"""Distributed mode vs one device, and the same for torch: one training step (forward, backward,
AdamW update) of the 4-layer GPT benchmark model on 4 processes (data 2 x tensor 2, Megatron-style
tensor parallel) against each framework's best single-device step, in absolute seconds and in
core-seconds. Ours: `mode="distributed"` under msrun (data-parallel gradient sums in the
aggregator, overlapped with the backward). Peer: torch DTensor `parallelize_module` (same plan)
on 4 processes over gloo (mp.spawn, CPU) with torch's DistributedDataParallel on the "data"
group (bucketed gradient all-reduces overlapped with the backward, `_pre_dp_module_transform`
for TP + DDP), no other collective in the step.

    python benchmarks/bench_distributed.py                     # hidden 768, seq 256, batch 8, 3 runs
    python benchmarks/bench_distributed.py --hidden 256 --heads 4 --seq 64 --runs 1 --json out.json   # quicker

Fair by construction:
  * the same model, batch and initial weights on both sides (gpt_args.initial_weights loaded into
    MindSpore and torch; gpt_args.token_batch);
  * single device swept over 1 and 2 compute threads (and all cores where there are more), the
    process bound to that many cores from its start (taskset); MindSpore also both ways of
    host dispatch (async, inline); each framework's fastest configuration is its baseline T1;
  * 4 processes: max(1, cores // 4) compute threads each; ours bound by the package's default
    (flag cpu_binding), torch's run both unbound and pinned the same way (process r on core
    r % cores), the faster counting (TN);
  * with `cores` the cores the 4 processes run on: scaling efficiency T1 / (cores x TN) and
    distribution overhead cores x TN - T1 core-seconds per step, per framework; goal: ours <= torch's;
  * --runs N (default 3) runs of every row, rows interleaved by framework and in reversed order
    on every other run; the 1-minute load average printed at the start and end of each run;
  * losses asserted equal (gpt_args.loss_tolerance: float32 roundoff x the model's reduction
    depth): each 4-process run's to its framework's single-device run at every step, and
    MindSpore's single-device step-0 loss to torch's (same weights, before any update).

Each row: the median of --repeat timed steps after one warm-up step (4 processes: the slowest
rank's median). Summary: per row the median over runs. `--json PATH` writes every run's figures,
the summary and the loss checks; the exit status is 1 if a loss check fails. Without torch the
torch rows are skipped with a message.
"""
import argparse
import contextlib
import copy
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
from gpt_args import compare_losses, gpt_argument_parser, initial_weights, load_average, token_batch  # noqa: E402

WORKERS = 4
MESH = (2, 2)


def cores() -> list:
    """The cores this process may run on (its affinity), in order."""
    return sorted(os.sched_getaffinity(0))


def threads_per_process(processes: int) -> int:
    return max(1, len(cores()) // processes)


def job_cores() -> int:
    """Cores the 4-process job runs on: its processes' threads, at most the cores there are."""
    return min(len(cores()), WORKERS * threads_per_process(WORKERS))


def thread_sweep() -> list:
    """Single-device thread counts: 1 and 2, and all cores where there are more."""
    return sorted({n for n in (1, 2, len(cores())) if n <= len(cores())})


def pin(rank: int) -> None:
    """Pin this process (and the threads it starts later) to core rank % cores, what the
    package's cpu_binding does for 4 processes on 2 cores: the tensor-parallel peers (ranks 2d,
    2d+1 of mesh data x tensor) get different cores and compute at the same time."""
    available = cores()
    os.sched_setaffinity(0, {available[rank % len(available)]})


def batch(args):
    """(ids, labels) int32 numpy arrays, the same for every row (gpt_args.token_batch)."""
    return token_batch(args.vocab, args.batch, args.seq)


def cfg_of(args) -> dict:
    return dict(vocab=args.vocab, hidden=args.hidden, heads=args.heads, layers=args.layers, seq=args.seq)


# ---------------------------------------------------------------- ours
def ours(args, distributed: bool) -> dict:
    import mindspore as ms
    from mindspore import Tensor, nn

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import mindspore_hyper as mh
    from gpt_args import load_mindspore_weights
    from models import GPT

    ms.set_context(mode=ms.PYNATIVE_MODE)
    if distributed:  # before MindSpore's first op, so that host_dispatch (inline by default) acts
        mh.set_context(mode="distributed")
    ms.set_seed(0)
    if distributed and args.profile:
        import dist_profile

        dist_profile.install()
    threads = threads_per_process(WORKERS) if distributed else getattr(args, "threads", None)
    if threads:
        ms.set_context(runtime_num_threads=threads)
    ids, labels = (Tensor(a) for a in batch(args))
    model = GPT(**cfg_of(args))
    load_mindspore_weights(model, initial_weights(**cfg_of(args)))
    if distributed:
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
    # the model's loss is the global batch mean on every rank
    return {"median": slowest["median"], "times": slowest["times"], "losses": ranks[0]["losses"]}


# ---------------------------------------------------------------- torch
def torch_single(args) -> dict:
    import torch

    import bench_sim_overhead_torch as peer

    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    ids, labels = (torch.from_numpy(a.astype(np.int64)) for a in batch(args))
    model = peer.GPT(**cfg_of(args))
    peer.load_weights(model, initial_weights(**cfg_of(args)))
    step = peer.single_device_step(model, ids, labels)
    return timed(step, args.repeat)


def torch_rank(rank: int, args, out: str) -> None:
    """One of torch's 4 processes: TP by parallelize_module on "tensor", then DDP on "data"
    (bucketed all-reduces launched by autograd hooks as buckets fill, overlapping the backward;
    the gradient average is DDP's). The step returns the rank's local loss without a collective
    (the driver averages the data ranks' losses after the run)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, loss_parallel, parallelize_module
    from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform
    from torch.nn.parallel import DistributedDataParallel

    import bench_sim_overhead_torch as peer

    if args.pin:
        pin(rank)
    torch.set_num_threads(threads_per_process(WORKERS))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")
    dist.init_process_group("gloo", rank=rank, world_size=WORKERS)
    mesh = init_device_mesh("cpu", MESH, mesh_dim_names=("data", "tensor"))
    model = peer.GPT(**cfg_of(args))
    peer.load_weights(model, initial_weights(**cfg_of(args)))
    for block in model.blocks:
        parallelize_module(block, mesh["tensor"], {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                                                  "fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    parallelize_module(model, mesh["tensor"], {
        "embed": RowwiseParallel(input_layouts=Replicate()),
        "head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
    _pre_dp_module_transform(model)  # DTensor parameters -> local tensors DDP can bucket
    ddp = DistributedDataParallel(model, process_group=mesh.get_group("data"))
    ids, labels = (torch.from_numpy(a.astype(np.int64)) for a in batch(args))
    data_rank, data_size = mesh["data"].get_local_rank(), MESH[0]
    ids, labels = ids.chunk(data_size)[data_rank], labels.chunk(data_size)[data_rank]
    optimizer = peer.make_optimizer(ddp)

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
                loss = ddp(ids, labels)
            with phase("backward"):  # DDP's bucketed all-reduces run and finish in here
                loss.backward()
        with phase("optimizer"):
            optimizer.step()
        local = loss.to_local() if isinstance(loss, DTensor) else loss
        return local.item()

    result = timed(step, args.repeat)
    result["data_rank"] = data_rank
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
    # global batch mean = mean over the data ranks of their local means (one rank per data index)
    per_data = {r["data_rank"]: r["losses"] for r in ranks}
    losses = [float(np.mean([per_data[d][k] for d in sorted(per_data)])) for k in range(len(ranks[0]["losses"]))]
    return {"median": slowest["median"], "times": slowest["times"], "losses": losses}


# ---------------------------------------------------------------- rows
def forwarded(args):
    return [f"--layers={args.layers}", f"--hidden={args.hidden}", f"--heads={args.heads}", f"--seq={args.seq}",
            f"--batch={args.batch}", f"--vocab={args.vocab}", f"--repeat={args.repeat}"] + \
        (["--profile"] if args.profile else []) + (["--pin"] if args.pin else [])


def in_subprocess(which: str, args, env=None, threads=None) -> dict:
    """Run one single-device measurement in a fresh interpreter (MindSpore and torch never share
    a process); with `threads`, that many compute threads, the process bound to as many cores
    from its start."""
    bind = ["taskset", "-c", ",".join(str(c) for c in cores()[:threads])] if threads else []
    proc = subprocess.run(bind + [sys.executable, __file__, "--worker", which] + forwarded(args) +
                          ([f"--threads={threads}"] if threads else []),
                          capture_output=True, text=True, env=None if env is None else dict(os.environ, **env))
    if proc.returncode:
        sys.exit(f"{which} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rows(args) -> list:
    """(label, framework, kind, measure) of every row, the frameworks interleaved."""
    from mindspore_hyper.context import HOST_BLOCKING_ENV

    def plural(n):
        return f"{n} thread{'s' if n > 1 else ''} on {n} core{'s' if n > 1 else ''}"
    ms_single, torch_single_rows = [], []
    for n in thread_sweep():
        for how, flag in (("inline", "1"), ("async", "0")):
            ms_single.append((f"mindspore 1 device, {how} dispatch, {plural(n)}", "mindspore", "single",
                              lambda n=n, flag=flag: in_subprocess("ours-single", args, {HOST_BLOCKING_ENV: flag}, n)))
        torch_single_rows.append((f"torch 1 device, {plural(n)}", "torch", "single",
                                  lambda n=n: in_subprocess("torch-single", args, threads=n)))
    pinned = copy.copy(args)
    pinned.pin = True
    dist_ms = [("mindspore_hyper 4 processes (cpu_binding)", "mindspore", "distributed",
                lambda: run_ours_distributed(args))]
    dist_torch = [("torch DTensor+DDP 4 processes, unbound", "torch", "distributed", lambda: run_torch_distributed(args)),
                  ("torch DTensor+DDP 4 processes, pinned", "torch", "distributed",
                   lambda: run_torch_distributed(pinned))]
    if args.skip_torch:
        torch_single_rows, dist_torch = [], []
    out = []
    for i in range(max(len(ms_single), len(torch_single_rows))):
        out += ms_single[i:i + 1] + torch_single_rows[i:i + 1]
    return out + dist_ms + dist_torch


def one_run(index: int, args, specs) -> dict:
    """Every row once, in the listed order on even runs and reversed on odd ones."""
    order = specs if index % 2 == 0 else list(reversed(specs))
    run = {"load_start": load_average(), "order": [label for label, *_ in order], "rows": {}}
    print(f"run {index + 1}: 1-min load average at start {run['load_start']:.2f}")
    for label, framework, kind, measure in order:
        load = load_average()
        result = measure()
        result.update(framework=framework, kind=kind, load_before=load)
        run["rows"][label] = result
        print(f"  {label:<58} {result['median']:8.3f} s/step  (steps {', '.join(f'{t:.3f}' for t in result['times'])};"
              f" load before {load:.2f})")
    run["load_end"] = load_average()
    print(f"run {index + 1}: 1-min load average at end {run['load_end']:.2f}")
    return run


# ---------------------------------------------------------------- summary
def scaling(t1: float, tn: float, n_cores: int) -> dict:
    """Scaling efficiency T1 / (cores x TN) and distribution overhead cores x TN - T1 (core-seconds per step)."""
    return {"t1_s": t1, "tn_s": tn, "cores": n_cores, "tn_over_t1": tn / t1, "efficiency": t1 / (n_cores * tn),
            "overhead_core_s": n_cores * tn - t1}


def framework_summary(row_medians: dict, runs, framework: str, n_cores: int) -> dict:
    single = {k: v for k, v in row_medians.items() if runs[0]["rows"][k]["framework"] == framework
              and runs[0]["rows"][k]["kind"] == "single"}
    dist = {k: v for k, v in row_medians.items() if runs[0]["rows"][k]["framework"] == framework
            and runs[0]["rows"][k]["kind"] == "distributed"}
    base, best = min(single, key=single.get), min(dist, key=dist.get)
    per_run = []
    for run in runs:  # the same figures from each run's own rows
        rs = run["rows"]
        t1 = min(rs[k]["median"] for k in single)
        tn = min(rs[k]["median"] for k in dist)
        per_run.append(scaling(t1, tn, n_cores))
    return dict(scaling(single[base], dist[best], n_cores), baseline=base, distributed=best, per_run=per_run)


def loss_checks(runs, args) -> list:
    """Each run: every 4-process row against its framework's fastest single-device row of that
    run (all steps), and MindSpore's single-device step-0 loss against torch's."""
    checks = []
    for run in runs:
        rs = run["rows"]
        base = {}
        for fw in ("mindspore", "torch"):
            singles = [k for k in rs if rs[k]["framework"] == fw and rs[k]["kind"] == "single"]
            if singles:
                base[fw] = min(singles, key=lambda k: rs[k]["median"])
        for label, r in rs.items():
            if r["kind"] == "distributed":
                checks.append(compare_losses(f"{label} vs {base[r['framework']]}", r["losses"],
                                             rs[base[r["framework"]]]["losses"], cfg_of(args), args.batch))
        if len(base) == 2:
            checks.append(compare_losses("MindSpore vs torch 1 device, step 0 (same weights, before any update)",
                                         rs[base["mindspore"]]["losses"][:1], rs[base["torch"]]["losses"][:1],
                                         cfg_of(args), args.batch))
    return checks


def summary(runs, args) -> dict:
    labels = list(runs[0]["rows"])
    row_medians = {k: statistics.median(r["rows"][k]["median"] for r in runs) for k in labels}
    n_cores = job_cores()
    out = {"rows": {k: {"median_s": row_medians[k], "min_s": min(r["rows"][k]["median"] for r in runs),
                        "max_s": max(r["rows"][k]["median"] for r in runs)} for k in labels},
           "frameworks": {}, "loss_checks": loss_checks(runs, args)}
    for fw in ("mindspore", "torch"):
        if any(runs[0]["rows"][k]["framework"] == fw for k in labels):
            out["frameworks"][fw] = framework_summary(row_medians, runs, fw, n_cores)
    if len(out["frameworks"]) == 2:
        ms, pt = out["frameworks"]["mindspore"], out["frameworks"]["torch"]
        out["goal"] = {"ours_overhead_core_s": ms["overhead_core_s"], "torch_overhead_core_s": pt["overhead_core_s"],
                       "met": ms["overhead_core_s"] <= pt["overhead_core_s"],
                       "met_per_run": [a["overhead_core_s"] <= b["overhead_core_s"]
                                       for a, b in zip(ms["per_run"], pt["per_run"])]}
    return out


def print_summary(s: dict, runs) -> None:
    print(f"\nsummary over {len(runs)} run(s): seconds per step, median over runs (min-max)")
    for label, r in s["rows"].items():
        print(f"  {label:<58} {r['median_s']:8.3f} s  ({r['min_s']:.3f}-{r['max_s']:.3f})")
    names = {"mindspore": "mindspore_hyper", "torch": "torch DTensor+DDP"}
    print(f"\n{'':<18} {'T1 s':>7} {'TN s':>7} {'cores':>5} {'TN/T1':>6} {'efficiency':>10} {'overhead core-s/step':>21}")
    for fw, v in s["frameworks"].items():
        print(f"{names[fw]:<18} {v['t1_s']:7.3f} {v['tn_s']:7.3f} {v['cores']:5d} {v['tn_over_t1']:5.2f}x "
              f"{v['efficiency']:10.2f} {v['overhead_core_s']:21.3f}")
        print(f"{'':<18} T1 = {v['baseline']}; TN = {v['distributed']}; per run overhead: "
              + ", ".join(f"{p['overhead_core_s']:.3f}" for p in v["per_run"]))
    if "goal" in s:
        g = s["goal"]
        print(f"goal (our distribution overhead in core-seconds per step <= torch's): {g['ours_overhead_core_s']:.3f} vs "
              f"{g['torch_overhead_core_s']:.3f} -> {'met' if g['met'] else 'NOT met'} "
              f"(per run: {', '.join('met' if m else 'not met' for m in g['met_per_run'])})")
    bad = [c for c in s["loss_checks"] if not c["ok"]]
    for c in bad:
        print(f"LOSS CHECK FAILED: {c['what']}: relative {c['relative']} > tolerance {c['tolerance']}")
    worst = max((c["max_relative"] for c in s["loss_checks"]), default=0.0)
    print(f"loss checks: {len(s['loss_checks'])}, all within tolerance: {not bad} (largest relative difference "
          f"{worst:.1e}; gpt_args.loss_tolerance at step 0 "
          f"{s['loss_checks'][0]['tolerance'][0] if s['loss_checks'] else float('nan'):.1e})")


def main():
    parser = gpt_argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=("ours", "ours-single", "torch-single"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--pin", action="store_true", help=argparse.SUPPRESS)  # torch's pinned run
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)  # a single-device worker's threads
    parser.add_argument("--runs", type=int, default=3, help="runs of every row, in alternating order (default 3)")
    parser.add_argument("--json", metavar="PATH", help="also write all figures as JSON to PATH")
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
    if args.runs < 1:
        parser.error(f"--runs: expected a positive number of runs, got {args.runs}")
    if not args.skip_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch rows skipped: PyTorch is not installed (pip install torch==2.13.0, or .[bench])")
            args.skip_torch = True

    print(f"model: GPT {cfg_of(args)}, batch {args.batch}; {WORKERS} processes, mesh data {MESH[0]} x tensor "
          f"{MESH[1]}, {threads_per_process(WORKERS)} compute thread(s) each on {job_cores()} cores; single device "
          f"swept over {thread_sweep()} threads; {args.repeat} timed steps after 1 warm-up; {args.runs} run(s)")
    specs = rows(args)
    runs = [one_run(i, args, specs) for i in range(args.runs)]
    s = summary(runs, args)
    print_summary(s, runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cfg": cfg_of(args), "batch": args.batch, "repeat": args.repeat, "cores": len(cores()),
                       "job_cores": job_cores(), "runs": runs, "summary": s}, f, indent=1)
        print(f"wrote {args.json}")
    if any(not c["ok"] for c in s["loss_checks"]):
        sys.exit("a loss check failed (see above)")


if __name__ == "__main__":
    main()
