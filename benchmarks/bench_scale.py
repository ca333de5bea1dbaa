"""Simulation at scale: one training step (forward, backward, AdamWeightDecay update) of a GPT on
8, 64 and 384 virtual devices divided by the same step on one device, and peak host memory
(max RSS) of each run divided by the single-device run's.

    python benchmarks/bench_scale.py                          # small GPT (hidden 128, 2 layers)
    python benchmarks/bench_scale.py --model benchmark        # hidden 768, 4 layers, seq 256
    python benchmarks/bench_scale.py --devices 384 --report report384.png   # + the 384-device report
    python benchmarks/bench_scale.py --per-shard              # one kernel per shard, for comparison

Meshes (Megatron-style tensor parallel with vocabulary-parallel embedding and head, ZeRO-1 over
"data"): 8 = data 2 x tensor 4, 64 = data 8 x tensor 8, 384 = data 8 x tensor 8 x pipeline 6
(topology supernode384; the strategy lays nothing out on "pipeline", so its 6 devices hold
replicas: the simulation runs pipeline stages in one program order). Every run is a fresh
process (peak RSS is per process), each timing the median of --repeat steps after one warm-up
step. Both sides launch kernels synchronously (mindspore.runtime.launch_blocking, which the
simulation calls by default, flag sim_synchronize; the single-device run likewise so the ratio
compares like with like; the figures in docs/benchmarks.md were measured with the equivalent
set_context(pynative_synchronize=True)).
Wall time and process CPU time (all threads) are both reported: under machine load the CPU-time
ratio is the steadier one. Goals (issue 15): benchmark GPT <= 1.5x at 384; small GPT <= 3x at every count; host memory
<= 2x single device.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {
    "small": dict(vocab=1024, hidden=128, heads=8, layers=2, seq=64),
    "benchmark": dict(vocab=1024, hidden=768, heads=12, layers=4, seq=256),
}
MESHES = {8: (2, 4, 1), 64: (8, 8, 1), 384: (8, 8, 6)}
BATCH = 8


def strategy(shape):
    from mindspore_hyper import Layout

    s = Layout(shape, ("data", "tensor", "pipeline"))(tensor_map=(), optimizer_state="data")
    s.override("*.qkv.*", "tensor").override("*.fc1.*", "tensor")
    s.override("*.proj.weight", None, "tensor").override("*.fc2.weight", None, "tensor")
    s.override("embed.*", "tensor").override("head.weight", "tensor")
    return s


def child(model_name: str, devices: int, repeat: int, report_png: str, per_shard: bool = False) -> dict:
    """One run in this process: `devices` = 1 is the single-device baseline."""
    import numpy as np
    import mindspore as ms
    from mindspore import Tensor, nn

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import mindspore_hyper as mh
    from mindspore_hyper import auto_parallelize
    from models import GPT

    ms.runtime.launch_blocking()  # synchronous launches on both sides (the simulation sets it too)
    ms.set_seed(0)
    cfg = MODELS[model_name]
    rng = np.random.default_rng(0)
    ids = Tensor(rng.integers(0, cfg["vocab"], (BATCH, cfg["seq"])).astype(np.int32))
    labels = Tensor(rng.integers(0, cfg["vocab"], (BATCH, cfg["seq"])).astype(np.int32))
    model = GPT(**cfg)
    net = model
    if devices > 1:
        mh.set_context(mode="simulation", device_num=devices, topology="supernode384" if devices == 384 else "node8")
        net = auto_parallelize(model, strategy(MESHES[devices]))
        net.execution.batch_shards = not per_shard  # --per-shard: one kernel per shard (before batching)
    optimizer = nn.AdamWeightDecay(model.trainable_params(), learning_rate=1e-4)
    step = ms.value_and_grad(net, None, optimizer.parameters)
    times, cpu, losses = [], [], []
    for i in range(repeat + 1):
        start, start_cpu = time.perf_counter(), time.process_time()
        loss, grads = step(ids, labels)
        optimizer(grads)
        losses.append(float(loss.asnumpy()))
        if i:
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    out = {"seconds": statistics.median(times), "all": times, "cpu_seconds": statistics.median(cpu), "losses": losses,
           "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if devices > 1:
        report = net.report(optimizer)
        out["comm_time_estimate_s"] = report.comm_time_estimate_s
        out["memory_groups"] = len(report.memory_groups())
        if report_png:
            out["report"] = str(report)
            report.plot(report_png)
    return out


def run_child(model_name, devices, repeat, report_png="", per_shard=False) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", model_name, str(devices), "--repeat", str(repeat)]
    if per_shard:
        cmd.append("--per-shard")
    if report_png:
        cmd += ["--report", report_png]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"run {model_name} x {devices} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="small")
    parser.add_argument("--devices", type=int, nargs="+", default=[8, 64, 384], choices=sorted(MESHES))
    parser.add_argument("--repeat", type=int, default=3, help="timed steps after one warm-up step")
    parser.add_argument("--report", default="", help="PNG path: the report of the largest run, plotted")
    parser.add_argument("--per-shard", action="store_true",
                        help="simulate with one kernel per shard (batched execution off), for comparison")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "DEVICES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.repeat, args.report, args.per_shard)))
        return

    print(f"model: GPT {MODELS[args.model]}, batch {BATCH}; machine load now: {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores (timings are noisy under load)")
    single = run_child(args.model, 1, args.repeat)
    print(f"single device: step median {single['seconds']:.3f} s (all: {', '.join(f'{t:.3f}' for t in single['all'])}; "
          f"CPU {single['cpu_seconds']:.3f} s), "
          f"max RSS {single['max_rss_bytes'] / 2**20:.0f} MiB")
    largest = max(args.devices)
    for devices in args.devices:
        sim = run_child(args.model, devices, args.repeat, args.report if devices == largest else "", args.per_shard)
        ratio = sim["seconds"] / single["seconds"]
        memory = sim["max_rss_bytes"] / single["max_rss_bytes"]
        same = max(abs(a - b) / abs(b) for a, b in zip(sim["losses"], single["losses"]))
        cpu_ratio = sim["cpu_seconds"] / single["cpu_seconds"]
        print(f"{devices:4d} devices {MESHES[devices]}: step median {sim['seconds']:.3f} s = {ratio:.2f}x single, "
              f"process CPU time {cpu_ratio:.2f}x single's "
              f"(all: {', '.join(f'{t:.3f}' for t in sim['all'])}); max RSS {memory:.2f}x single; "
              f"losses vs single: max rel diff {same:.1e}; estimated comm {sim['comm_time_estimate_s'] * 1e3:.2f} ms/step; "
              f"report rows {sim['memory_groups']}")
        if "report" in sim:
            print(sim["report"])
            print(f"report plot: {args.report}")


if __name__ == "__main__":
    main()
