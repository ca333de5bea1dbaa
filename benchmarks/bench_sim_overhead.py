"""Simulation overhead: one training step (forward, backward, AdamWeightDecay update) of a GPT-style
stack on 8 virtual devices (data 2 x tensor 4, Megatron-style tensor parallel, ZeRO-1 layout)
divided by the same step on a single device, beside the same ratio of the peer
`bench_sim_overhead_torch.py` (torch LocalTensor, the same model, mesh, weights and batch).

    python benchmarks/bench_sim_overhead.py                 # 4 layers, hidden 768, seq 256, batch 8, 3 runs
    python benchmarks/bench_sim_overhead.py --hidden 256 --seq 64 --runs 1 --json out.json   # quicker
    python benchmarks/bench_sim_overhead.py --hidden 256 --heads 4 --seq 64 --layers 2 --vocab 256 --profile
        # Python function calls per step of both steps under cProfile (a count: comparable under load)

Like with like:
  * one set of initial weights (gpt_args.initial_weights, numpy) loaded into the MindSpore
    single-device model, the MindSpore model the simulation wraps, and both torch models; one
    batch (gpt_args.token_batch);
  * losses asserted equal: each side's simulated loss to its single-device loss at every step,
    and MindSpore's step-0 loss to torch's (same weights, same data, before any update; later
    steps differ by design: AdamWeightDecay has no bias correction, torch's AdamW has), within
    gpt_args.loss_tolerance (float32 unit roundoff x the model's reduction depth, x the step);
  * the work each side does is counted and printed with the times: the simulation runs each op
    once per distinct shard (devices that differ only along axes an op's operands are replicated
    on share one shard: "replicated-work deduplication"; counted on one extra forward as shard
    computations vs the 8 devices' op instances), and it runs the optimizer on the global
    parameters once (ZeRO-1 is a layout here: bookkeeping of what each device would hold, not 8
    sharded updates), while the LocalTensor peer runs every op on all 8 ranks and AdamW on
    every rank's whole tensor-parallel shard. Optimizer element-updates per step are counted on
    both sides and for a real 8-device ZeRO-1 job;
  * --runs N (default 3) runs, each side in a fresh process per run, in alternating order (run
    1: MindSpore then torch, each single device first; run 2: torch then MindSpore, each
    simulated first; ...); the 1-minute load average is printed at the start and end of each run.

Both sides use synchronous kernel launches (MindSpore: `mindspore.runtime.launch_blocking()`,
which the simulation switches on when it wraps a model; torch's CPU ops are synchronous).
Each side: the median of --repeat timed steps after one warm-up step. The summary gives, per
side, the median over runs of the ratio simulated / single device. `--json PATH` writes every
run's figures, the work counts and the loss checks; the exit status is 1 if a loss check fails.
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from gpt_args import compare_losses, gpt_argument_parser, load_average  # noqa: E402

DEVICES = 8


def strategy():
    from mindspore_hyper import Layout

    s = Layout((2, 4), ("data", "tensor"))(tensor_map=(), optimizer_state="data")
    s.override("*.qkv.*", "tensor").override("*.fc1.*", "tensor")
    s.override("*.proj.weight", None, "tensor").override("*.fc2.weight", None, "tensor")
    s.override("embed.*", "tensor").override("head.weight", "tensor")
    return s


def time_steps(net, params, batch, repeat) -> dict:
    """Median of `repeat` timed steps after one warm-up: forward, backward, AdamWeightDecay."""
    import mindspore as ms
    from mindspore import nn

    optimizer = nn.AdamWeightDecay(params, learning_rate=1e-4)
    step = ms.value_and_grad(net, None, optimizer.parameters)
    times, losses = [], []
    for i in range(repeat + 1):
        start = time.perf_counter()
        loss, grads = step(*batch)
        optimizer(grads)
        losses.append(float(loss.asnumpy()))
        if i:  # the first step is warm-up
            times.append(time.perf_counter() - start)
    return {"median": statistics.median(times), "times": times, "losses": losses}


def count_shard_work(parallel, batch) -> dict:
    """One extra (untimed) forward of the simulated model with the dispatcher's `execute`
    counted: ops dispatched, shard computations the simulation runs (once per distinct output
    shard, as `execute` computes them) and op instances an 8-device job runs (mesh size per op)."""
    from mindspore_hyper.dtensor import dispatch
    from mindspore_hyper.dtensor.dtensor import significant_axes

    counts = {"ops": 0, "shard_computations": 0, "device_op_instances": 0}
    execute = dispatch.execute

    def counted(execution, call, decision, *rest, **options):
        axes = sorted(set().union(*[significant_axes(layout) for layout in decision.inputs]))
        counts["ops"] += 1
        counts["shard_computations"] += len(execution.keys(axes))
        counts["device_op_instances"] += execution.mesh.size
        return execute(execution, call, decision, *rest, **options)
    dispatch.execute = counted
    try:
        parallel(*batch).asnumpy()
    finally:
        dispatch.execute = execute
    return counts


def ours(args) -> dict:
    """The MindSpore side in this process: single-device and simulated step, in the order
    --sim-first asks, from the shared weights; work counts; a JSON-able dict."""
    import mindspore as ms
    from mindspore import Tensor

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import mindspore_hyper as mh
    from gpt_args import initial_weights, load_mindspore_weights, token_batch
    from models import GPT

    ms.runtime.launch_blocking()  # both steps synchronous (the simulation turns it on anyway)
    ms.set_seed(0)
    mh.set_context(mode="simulation", device_num=DEVICES)
    cfg = cfg_of(args)
    weights = initial_weights(**cfg)
    batch = tuple(Tensor(a) for a in token_batch(args.vocab, args.batch, args.seq))
    result = {"mindspore": ms.__version__, "cfg": cfg, "batch": args.batch,
              "order": "simulated first" if args.sim_first else "single first"}

    def single_run():
        single = GPT(**cfg)
        load_mindspore_weights(single, weights)
        result["single"] = time_steps(single, single.trainable_params(), batch, args.repeat)

    def simulated_run():
        model = GPT(**cfg)
        load_mindspore_weights(model, weights)
        parallel = mh.auto_parallelize(model, strategy())
        result["simulated"] = time_steps(parallel, model.trainable_params(), batch, args.repeat)
        report = parallel.report()
        result["forward_collectives"] = sum(v["count"] for axes in report.comm.values() for v in axes.values())
        result["fallbacks"] = dict(report.fallbacks)
        result["shard_work"] = count_shard_work(parallel, batch)
        elements = sum(int(p.size) for p in model.trainable_params())
        result["element_updates"] = {"mindspore_simulation": elements, "single_device": elements}

    for run in ((simulated_run, single_run) if args.sim_first else (single_run, simulated_run)):
        run()
    result["loss_check"] = compare_losses("mindspore_hyper simulation vs MindSpore single device",
                                          result["simulated"]["losses"], result["single"]["losses"], cfg, args.batch)
    return result


def profile_steps(args) -> None:
    """--profile: the single-device and the simulated step in this process under cProfile (after
    one warm-up step each): Python function calls per step (a count, the same on a loaded machine:
    the measure to compare code by), ops dispatched per simulated step, the time per step under
    the profiler (inflated by it) and the functions with the most own time."""
    import cProfile
    import pstats

    import mindspore as ms
    from mindspore import Tensor, nn

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import mindspore_hyper as mh
    from gpt_args import initial_weights, load_mindspore_weights, token_batch
    from models import GPT

    ms.runtime.launch_blocking()
    ms.set_seed(0)
    mh.set_context(mode="simulation", device_num=DEVICES)
    cfg = cfg_of(args)
    weights = initial_weights(**cfg)
    batch = tuple(Tensor(a) for a in token_batch(args.vocab, args.batch, args.seq))
    print(f"--profile: GPT {cfg}, batch {args.batch}; {args.repeat} profiled steps per side after 1 warm-up; "
          f"1-min load average {load_average():.2f}")
    dispatcher = os.path.join("dtensor", "dispatch.py")
    for name in ("single device", "simulated"):
        model = GPT(**cfg)
        load_mindspore_weights(model, weights)
        net = mh.auto_parallelize(model, strategy()) if name == "simulated" else model
        optimizer = nn.AdamWeightDecay(model.trainable_params(), learning_rate=1e-4)
        step = ms.value_and_grad(net, None, optimizer.parameters)

        def one():
            loss, grads = step(*batch)
            optimizer(grads)
            return float(loss.asnumpy())

        one()
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        for _ in range(args.repeat):
            one()
        profiler.disable()
        seconds = (time.perf_counter() - start) / args.repeat
        stats = pstats.Stats(profiler)
        ops = sum(entry[1] for (path, _, func), entry in stats.stats.items()
                  if path.endswith(dispatcher) and func == "dispatch") / args.repeat
        print(f"\n{name}: {stats.total_calls / args.repeat:,.0f} Python function calls per step"
              + (f", {ops:.0f} ops dispatched" if ops else "") + f"; {seconds:.3f} s per step under the profiler")
        stats.sort_stats("tottime").print_stats(args.profile_top)


def cfg_of(args) -> dict:
    return dict(vocab=args.vocab, hidden=args.hidden, heads=args.heads, layers=args.layers, seq=args.seq)


def model_argv(args) -> list:
    return [f"--layers={args.layers}", f"--hidden={args.hidden}", f"--heads={args.heads}", f"--seq={args.seq}",
            f"--batch={args.batch}", f"--vocab={args.vocab}", f"--repeat={args.repeat}"]


def side(name: str, args, sim_first: bool, out: str) -> dict:
    """One side's run in a fresh interpreter; its JSON result."""
    path = os.path.join(out, f"{name}.json")
    script = __file__ if name == "mindspore" else os.path.join(HERE, "bench_sim_overhead_torch.py")
    cmd = [sys.executable, script] + (["--worker"] if name == "mindspore" else []) + model_argv(args) + \
        ["--json", path] + (["--sim-first"] if sim_first else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if not os.path.exists(path):
        sys.exit(f"the {name} side failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    with open(path) as f:
        return json.load(f)


def one_run(index: int, args, sides) -> dict:
    """Run `index`: the sides in alternating order (and, inside each, single/simulated alternating)."""
    order = list(sides) if index % 2 == 0 else list(reversed(sides))
    sim_first = index % 2 == 1
    out = tempfile.mkdtemp(prefix="bench_sim_overhead_")
    run = {"order": order, "sim_first": sim_first, "load_start": load_average()}
    print(f"run {index + 1}: 1-min load average at start {run['load_start']:.2f}; order {' then '.join(order)}, "
          f"each {'simulated' if sim_first else 'single device'} first")
    for name in order:
        run[name] = side(name, args, sim_first, out)
        r = run[name]
        print(f"  {name:<9} single {r['single']['median']:7.3f} s  simulated {r['simulated']['median']:7.3f} s  "
              f"ratio {r['simulated']['median'] / r['single']['median']:.2f}x   "
              f"losses equal to {r['loss_check']['max_relative']:.1e} relative ({'ok' if r['loss_check']['ok'] else 'NOT OK'})")
    run["load_end"] = load_average()
    print(f"run {index + 1}: 1-min load average at end {run['load_end']:.2f}")
    return run


def summary(runs, args) -> dict:
    """Median over runs of each side's times and ratio, the work counts, the loss checks."""
    cfg = cfg_of(args)
    out = {"sides": {}, "loss_checks": []}
    for name in ("mindspore", "torch"):
        rs = [r[name] for r in runs if name in r]
        if not rs:
            continue
        ratios = [r["simulated"]["median"] / r["single"]["median"] for r in rs]
        out["sides"][name] = {"single_s": statistics.median(r["single"]["median"] for r in rs),
                              "simulated_s": statistics.median(r["simulated"]["median"] for r in rs),
                              "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                              "element_updates": rs[0]["element_updates"]}
        out["loss_checks"] += [r["loss_check"] for r in rs]
    if "torch" in out["sides"]:
        for r in runs:  # same weights and data: the step-0 losses agree across frameworks
            out["loss_checks"].append(compare_losses("MindSpore vs torch single device, step 0 (before any update)",
                                                     r["mindspore"]["single"]["losses"][:1],
                                                     r["torch"]["single"]["losses"][:1], cfg, args.batch))
    out["shard_work"] = runs[0]["mindspore"]["shard_work"]
    return out


def print_summary(s: dict, runs, args) -> None:
    n = len(runs)
    print(f"\nsummary over {n} run(s) (median; min-max of the ratio); model GPT {cfg_of(args)}, batch {args.batch}, "
          f"mesh data 2 x tensor 4")
    print(f"{'':<34} {'single s':>9} {'simulated s':>12} {'ratio':>7} {'range':>13}")
    names = {"mindspore": "mindspore_hyper simulation", "torch": "torch LocalTensor"}
    for name, v in s["sides"].items():
        print(f"{names[name]:<34} {v['single_s']:9.3f} {v['simulated_s']:12.3f} {v['ratio']:6.2f}x "
              f"{v['ratio_min']:6.2f}-{v['ratio_max']:.2f}x")
    work = s["shard_work"]
    print("work per step (what each ratio pays for):")
    print(f"  replicated-work deduplication: the simulation runs each op once per distinct shard: "
          f"{work['shard_computations']} shard computations for {work['device_op_instances']} op instances of "
          f"{DEVICES} devices ({work['ops']} ops, one forward; "
          f"{work['shard_computations'] / work['device_op_instances']:.2f} of the instances, by count, not FLOPs)"
          + (f"; torch LocalTensor runs all {DEVICES} ranks' instances (1.00)" if "torch" in s["sides"] else ""))
    ms_updates = s["sides"]["mindspore"]["element_updates"]["mindspore_simulation"]
    line = f"  optimizer element-updates: simulation {ms_updates:,} (the global parameters once: ZeRO-1 is a layout here)"
    if "torch" in s["sides"]:
        t = s["sides"]["torch"]["element_updates"]
        line += (f"; torch LocalTensor {t['torch_local_tensor']:,} ({t['torch_local_tensor'] / ms_updates:.2f}x ours: "
                 f"every rank its whole TP shard, no ZeRO); a real 8-device ZeRO-1 job {t['real_zero1_job']:,} "
                 f"({t['real_zero1_job'] / ms_updates:.2f}x ours)")
    print(line)
    for check in s["loss_checks"]:
        if not check["ok"]:
            print(f"  LOSS CHECK FAILED: {check['what']}: relative {check['relative']} > tolerance {check['tolerance']}")
    worst = max(c["max_relative"] for c in s["loss_checks"])
    print(f"loss checks: {len(s['loss_checks'])}, all within tolerance: "
          f"{all(c['ok'] for c in s['loss_checks'])} (largest relative difference {worst:.1e}; "
          f"gpt_args.loss_tolerance at step 0 here {s['loss_checks'][0]['tolerance'][0]:.1e})")


def main():
    parser = gpt_argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=None, help="runs, in alternating order (default 3)")
    parser.add_argument("--json", metavar="PATH", help="also write all figures as JSON to PATH")
    parser.add_argument("--profile", action="store_true",
                        help="instead: both MindSpore steps under cProfile in this process (calls per step, "
                             "top functions)")
    parser.add_argument("--profile-top", type=int, default=25, metavar="N", help="functions listed by --profile")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch LocalTensor peer")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # one MindSpore side, --json
    parser.add_argument("--sim-first", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profile:
        if args.runs is not None or args.json or args.worker or args.no_torch:
            parser.error("--profile runs the MindSpore side once in this process: it takes no --runs, --json or "
                         "--no-torch")
        if args.profile_top < 0:
            parser.error(f"--profile-top: expected a number of functions >= 0, got {args.profile_top}")
        if args.repeat < 1:
            parser.error(f"--repeat: expected at least 1 profiled step, got {args.repeat}")
        return profile_steps(args)
    if args.runs is None:
        args.runs = 3
    if args.runs < 1:
        parser.error(f"--runs: expected a positive number of runs, got {args.runs}")
    if args.worker:
        if not args.json:
            parser.error("--worker needs --json PATH")
        result = ours(args)
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        return
    sides = ["mindspore"]
    if args.no_torch:
        print("torch peer skipped (--no-torch)")
    elif importlib.util.find_spec("torch") is None:
        print("torch peer skipped: torch not installed (pip install torch==2.13.0)")
    else:
        sides.append("torch")
    print(f"model: GPT {cfg_of(args)}, batch {args.batch}; mesh data 2 x tensor 4 ({DEVICES} virtual devices); "
          f"{args.repeat} timed steps after 1 warm-up per step kind; {args.runs} run(s); {os.cpu_count()} cores")
    runs = [one_run(i, args, sides) for i in range(args.runs)]
    s = summary(runs, args)
    print_summary(s, runs, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cfg": cfg_of(args), "batch": args.batch, "repeat": args.repeat, "runs": runs,
                       "summary": s}, f, indent=1)
        print(f"wrote {args.json}")
    if not all(c["ok"] for c in s["loss_checks"]):
        sys.exit("a loss check failed (see above)")


if __name__ == "__main__":
    main()
