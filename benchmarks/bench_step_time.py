"""Step-time model vs measurements: the published validation table and this machine's ratios.

1. Korthikanti et al. 2022 Table 5 (seconds per iteration on DGX A100, the configurations of its
   Table 3) against `estimate_step_time` on the a100-80gb preset, one set of efficiency factors:
   the table of docs/estimate.md, with the mean and worst error.
2. This machine: a `cpu` profile from `calibrate_cpu` (MindSpore's matmul FLOP/s, copy and
   shared-memory bandwidth, pipe latency, PyNative op overhead), measured with the ranks' process and thread counts;
   then predicted vs measured seconds of bench_distributed's GPT step (forward, backward, AdamW),
   on one device (all cores) and on 4 processes under msrun (data 2 x tensor 2), both measured in
   this run by bench_distributed's own functions; and of the same GPT pipelined into 4 stages on
   4 processes under msrun (pipeline-only mesh, `--schedule`, `--microbatches`), measured by
   bench_pipeline's `run_measured` (the slowest rank's median `train_step`). Each row's profile
   is calibrated with the row's processes, threads and local shapes (the pipeline's: a
   micro-batch of batch / microbatches sequences). Prints predicted / measured per row (goal:
   within 20% on a quiet machine) and the load average before and after the calibration and
   each measurement.

    python benchmarks/bench_step_time.py                                # hidden 768, seq 256, batch 8
    python benchmarks/bench_step_time.py --hidden 256 --heads 4 --seq 64    # quicker
    python benchmarks/bench_step_time.py --cpu-rows pipeline            # the pipeline row alone
    python benchmarks/bench_step_time.py --table-only                   # section 1 only (no MindSpore run)
    python benchmarks/bench_step_time.py --table-only --claims docs/img # + the design's claims, with plots

3. With --claims DIR (model only, no measurement): the design's claims of shared/seed section 1
   and its conclusion, checked: the 4K -> 128K sweep (Llama-2-7B KV cache for 2 sequences; and
   training memory per device with and without context parallelism on a 64 GB device), the
   1F1B bubble the "40%" implies, and the weak-scaling efficiency 8 -> 384 NPUs of Llama-2-7B on
   the ascend-910c supernode with the best strategy found per size (the design claims 93%).
   Writes estimate_sweep_cp.png, estimate_scaling_910c.png and estimate_front_70b.png into DIR.
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpt_args import gpt_argument_parser  # noqa: E402


def validation_table() -> None:
    from mindspore_hyper.estimate.validation import format_rows, table5_rows

    print("== Korthikanti et al. 2022 Table 5 vs estimate_step_time (a100-80gb preset) ==")
    print(format_rows(table5_rows()))


CPU_ROWS = ("single", "distributed", "pipeline")


def pipeline_job(args) -> tuple:
    """The pipeline row's job as the planner describes it: `TransformerConfig` of examples/models.py's
    GPT with a micro-batch of batch / microbatches sequences (fp32), and `JobStrategy` of
    bench_distributed.WORKERS stages, the schedule and micro-batches, and the pipeline runtime's
    recomputation (each backward runs its whole stage forward again: recompute "full", scope "stage").

    Raises:
        ValueError: a batch the micro-batches do not divide, or a job the planner refuses (named).
    """
    import bench_distributed as bd

    from mindspore_hyper.estimate import JobStrategy, TransformerConfig

    if args.batch % args.microbatches:
        raise ValueError(f"--microbatches={args.microbatches}: expected a divisor of --batch={args.batch}")
    config = TransformerConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, vocab=args.vocab,
                               seq_len=args.seq, micro_batch=args.batch // args.microbatches, dtype_bytes=4)
    strategy = JobStrategy(pipeline=bd.WORKERS, microbatches=args.microbatches, schedule=args.schedule,
                           recompute="full", recompute_scope="stage")
    return config, strategy


def measure_pipeline(args) -> float:
    """The pipeline row's measured step: bench_pipeline's GPT job under msrun (its processes
    bound to cores by distributed mode's cpu_binding default, not by the benchmark), the slowest
    rank's median of --repeat steps after one warm-up step."""
    from types import SimpleNamespace

    import bench_distributed as bd
    import bench_pipeline as bp

    options = SimpleNamespace(model="gpt", workers=bd.WORKERS, steps=args.repeat + 1, warmup=1, pin=False,
                              trace=None, **{k: getattr(args, k) for k in ("microbatches", "batch", "layers", "hidden",
                                                                           "heads", "seq", "vocab")})
    return bp.run_measured(bp.measured_spec(args.schedule, options)).slowest_median(options.warmup)


def cpu_jobs(args) -> dict:
    """Per row of --cpu-rows: (label, config, strategy, calibration processes, threads, measurement -> seconds)."""
    from mindspore_hyper.context import HOST_BLOCKING_ENV

    import bench_distributed as bd

    from mindspore_hyper.estimate import JobStrategy, TransformerConfig

    cores = os.cpu_count() or 1
    workers, mesh = bd.WORKERS, bd.MESH
    config = TransformerConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, vocab=args.vocab,
                               seq_len=args.seq, micro_batch=args.batch, dtype_bytes=4)
    rows = {
        "single": lambda: ("single device", config, JobStrategy(microbatches=1), 1, cores,
                           lambda: bd.in_subprocess("ours-single", args, env={HOST_BLOCKING_ENV: "1"})["median"]),
        "distributed": lambda: (f"data {mesh[0]} x tensor {mesh[1]} (msrun)",
                                config.with_(micro_batch=args.batch // mesh[0]),
                                JobStrategy(data=mesh[0], tensor=mesh[1], microbatches=1), workers,
                                bd.threads_per_process(workers), lambda: bd.run_ours_distributed(args)["median"]),
        "pipeline": lambda: (f"pipeline {workers} ({args.schedule}, m={args.microbatches}, msrun)", *pipeline_job(args),
                             workers, bd.threads_per_process(workers), lambda: measure_pipeline(args)),
    }
    return {name: row() for name, row in rows.items() if name in args.cpu_rows}


def calibrate_row(config, strategy, processes: int, threads: int, size: int, roofline_only: bool = False, **options):
    """A row's `cpu` profile: `calibrate_cpu` with the row's processes and threads, and (unless
    roofline_only) its job's kernels at their local shapes; `options` go to calibrate_cpu."""
    from mindspore_hyper.estimate.calibrate import calibrate_cpu

    job = {} if roofline_only else {"config": config, "strategy": strategy}
    return calibrate_cpu(processes=processes, threads=threads, backend="mindspore", size=size, **job, **options)


def cpu_rows(args) -> None:
    from mindspore_hyper.estimate import estimate_step_time

    jobs = cpu_jobs(args)
    print(f"\n== this machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f} (before) ==")
    started = time.perf_counter()
    profiles = {name: calibrate_row(config, strategy, processes, threads, args.calibration_size, args.roofline_only)
                for name, (_, config, strategy, processes, threads, _) in jobs.items()}
    print(f"calibration: {time.perf_counter() - started:.1f} s, load {os.getloadavg()[0]:.2f}")
    for name, hw in profiles.items():
        lv = hw.levels[0]
        print(f"cpu profile ({jobs[name][0]}): matmul {hw.peak_flops / 1e9:.1f} GFLOP/s, copy "
              f"{hw.memory_bandwidth / 1e9:.2f} GB/s, shm {lv.bandwidth / 1e9:.2f} GB/s, latency {lv.latency * 1e6:.1f} "
              f"us, op overhead {hw.efficiency.op_overhead * 1e6:.1f} us, peer wait {hw.efficiency.peer_wait * 1e3:.2f} "
              f"ms per collective, {len(hw.kernels)} measured kernels")
    predicted = {name: estimate_step_time(jobs[name][1], jobs[name][2], hw) for name, hw in profiles.items()}
    measured = {}
    for name, job in jobs.items():
        measured[name] = job[5]()
        print(f"measured {job[0]}: {measured[name]:.4f} s, load {os.getloadavg()[0]:.2f} (after)")
    print(f"\n{'GPT step':<34} {'predicted s':>12} {'measured s':>11} {'predicted/measured':>19}")
    for name, estimate in predicted.items():
        print(f"{jobs[name][0]:<34} {estimate.seconds:>12.4f} {measured[name]:>11.4f} "
              f"{estimate.seconds / measured[name]:>19.2f}")
    if "single" in jobs and "distributed" in jobs:
        print(f"{'distributed / single':<34} {predicted['distributed'].seconds / predicted['single'].seconds:>12.2f} "
              f"{measured['distributed'] / measured['single']:>11.2f}")
    for name, estimate in predicted.items():
        print(f"predicted breakdown ({jobs[name][0]}): "
              + ", ".join(f"{k} {v:.4f} s" for k, v in estimate.breakdown.items()))
    print(f"load {os.getloadavg()[0]:.2f} (after)")


def claims(directory: str) -> None:
    from mindspore_hyper.estimate import JobStrategy, format_bytes, preset, sequence_sweep
    from mindspore_hyper.estimate.scaling import plot_scaling, weak_scaling
    from mindspore_hyper.estimate.search import fitting_candidates, plot_front
    from mindspore_hyper.schedule import build_schedule, simulate_schedule

    os.makedirs(directory, exist_ok=True)
    llama = preset("llama2-7b")
    print("\n== design claim: HBM need 4.3 GB at 4K -> 137.3 GB at 128K ==")
    kv = sequence_sweep(llama.with_(micro_batch=2), JobStrategy(inference=True))
    print("KV cache of Llama-2-7B, 2 sequences: " + ", ".join(
        f"{e.config.seq_len // 1024}K {e.peak.kv_cache / 1e9:.2f} GB" for e in kv))
    budget = 64 * 2 ** 30
    train = JobStrategy(tensor=8, sequence_parallel=True, recompute="selective")
    rows = {cp: sequence_sweep(llama, train.with_(context_parallel=cp), device_memory=budget) for cp in (1, 2, 4, 8)}
    print("training per device (tensor 8 + SP + selective, 64 GiB):")
    for i, e in enumerate(rows[1]):
        cells = [f"cp{cp} {format_bytes(rows[cp][i].peak.total)}{'' if rows[cp][i].fits else ' (no)'}" for cp in rows]
        print(f"  {e.config.seq_len // 1024:>4}K: " + ", ".join(cells))
    _plot_cp_sweep(rows, budget, os.path.join(directory, "estimate_sweep_cp.png"))

    print("\n== design claim: traditional pipelines idle 40% ==")
    for p, m in ((4, 4), (8, 8), (8, 12), (8, 32), (8, 64)):
        tl = simulate_schedule(build_schedule("1f1b", p, m), 1.0, 1.0, 1.0)
        print(f"  1F1B p={p} m={m}: simulated bubble {tl.bubble_fraction:.1%} (published (p-1)/(m+p-1) = "
              f"{(p - 1) / (m + p - 1):.1%})")

    print("\n== design claim: 93% linear speed-up on 384 NPUs (weak scaling, Llama-2-7B, ascend-910c) ==")
    points = weak_scaling(llama, [8, 16, 32, 64, 128, 256, 384], "ascend-910c", per_device_batch=4)
    for pt in points:
        if pt.best is None:
            print(f"  {pt.devices:>4} devices: nothing fits")
            continue
        print(f"  {pt.devices:>4} devices, batch {pt.global_batch}: {pt.best.seconds:.3f} s, MFU "
              f"{pt.best.estimate.mfu:.1%}, efficiency {pt.efficiency:.1%}  [{pt.best.describe()}]")
    plot_scaling(points, os.path.join(directory, "estimate_scaling_910c.png"),
                 "Llama-2-7B weak scaling on the ascend-910c supernode (4 sequences per NPU)", claim=0.93)
    front = fitting_candidates(preset("llama2-70b"), 1024, "h100-80gb", 1024)
    plot_front(front, os.path.join(directory, "estimate_front_70b.png"),
               "Llama-2-70B, 1024 x h100-80gb, global batch 1024: fitting strategies")
    print(f"plots in {directory}")


def _plot_cp_sweep(rows, budget: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gib = float(2 ** 30)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for cp, estimates in rows.items():
        lengths = [e.config.seq_len for e in estimates]
        ax.plot(lengths, [e.peak.total / gib for e in estimates], "o-", label=f"context parallel {cp}")
    ax.axhline(budget / gib, color="red", linestyle="--", label=f"device memory {budget / gib:.0f} GiB")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xticks(lengths)
    ax.set_xticklabels([f"{s // 1024}K" for s in lengths])
    ax.set_xlabel("sequence length")
    ax.set_ylabel("GiB per device")
    ax.set_title("Llama-2-7B training, tensor 8 + SP + selective recompute")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = gpt_argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--table-only", action="store_true", help="print the published validation table only")
    parser.add_argument("--calibration-size", type=int, default=1024,
                        help="n of the calibration's n x n matmul (default 1024, near the GPT's GEMM sizes)")
    parser.add_argument("--roofline-only", action="store_true",
                        help="calibrate the roofline figures only, not the job's kernels at its shapes (the old model)")
    parser.add_argument("--claims", metavar="DIR", help="also check the design's claims and write plots into DIR")
    parser.add_argument("--cpu-rows", nargs="+", choices=CPU_ROWS, default=list(CPU_ROWS),
                        help="which of this machine's rows to calibrate, predict and measure (default: all)")
    parser.add_argument("--microbatches", type=int, default=8, help="pipeline row: micro-batches per step")
    parser.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b",
                        help="pipeline row: the schedule (one model chunk per stage, full backwards)")
    # bench_distributed's measurement runs unprofiled and unpinned here (its own options)
    parser.set_defaults(profile=False, pin=False)
    args = parser.parse_args()
    print(f"load {os.getloadavg()[0]:.2f}")
    validation_table()
    if not args.table_only:
        cpu_rows(args)
    if args.claims:
        claims(args.claims)


if __name__ == "__main__":
    main()
