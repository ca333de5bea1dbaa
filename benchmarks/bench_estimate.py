"""Estimator vs the simulation's measured accounting: per-device errors for examples/models.py's GPT.

For each strategy: one simulated training step (forward + backward, Adam) through the public API,
with Python's cyclic garbage collector paused (see docs/estimate.md), and the estimate of every
device's pipeline stage. Prints the largest relative error over the devices per kind (parameters,
gradients, optimizer states, activations, total), the simulated step's wall time, and the
estimator's time for the same answer (the baseline the ratio is measured against, in this run).
Activations are compared where the estimator's "simulation" model applies (no tensor parallelism,
no ZeRO-3); elsewhere the Megatron count (16-bit, Table 2) is printed beside the measurement.
Last, the spread of the simulation's activation figure when the collector is left running.

    python benchmarks/bench_estimate.py                      # the issue's GPT: 4 layers, hidden 768, seq 256
    python benchmarks/bench_estimate.py --layers 2 --hidden 64 --heads 4 --seq 16 --vocab 128   # quick
"""
import os
import sys
import time
import timeit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from gpt_args import gpt_argument_parser  # noqa: E402
from models import GPT  # noqa: E402
from mindspore_hyper.estimate import JobStrategy, TransformerConfig, estimate_job, format_bytes  # noqa: E402
from mindspore_hyper.estimate.crosscheck import crosscheck_gpt  # noqa: E402

KINDS = ("parameters", "gradients", "optimizer_states", "activations")
STRATEGIES = [
    ("single device", JobStrategy()),
    ("data 2", JobStrategy(data=2)),
    ("data 8", JobStrategy(data=8)),
    ("data 4, ZeRO-1", JobStrategy(data=4, zero_stage=1)),
    ("pipeline 2", JobStrategy(pipeline=2)),
    ("data 2 x pipeline 2, ZeRO-1", JobStrategy(data=2, pipeline=2, zero_stage=1)),
    ("data 4, ZeRO-3", JobStrategy(data=4, zero_stage=3)),
    ("data 2 x tensor 4, ZeRO-1", JobStrategy(data=2, tensor=4, zero_stage=1)),
    ("data 2 x tensor 2 x pipeline 2, ZeRO-3", JobStrategy(data=2, tensor=2, pipeline=2, zero_stage=3)),
]


def simulated_activations_apply(strategy: JobStrategy) -> bool:
    return strategy.tensor == 1 and strategy.zero_stage != 3


def worst(rows, kind):
    return max(abs(r.relative_error) for r in rows if r.kind == kind)


def total_error(rows):
    per_rank = {}
    for r in rows:
        est, meas = per_rank.get(r.rank, (0, 0))
        per_rank[r.rank] = (est + r.estimated, meas + r.measured)
    return max(abs(e - m) / m for e, m in per_rank.values())


def main():
    parser = gpt_argument_parser(__doc__.splitlines()[0])
    args = parser.parse_args()
    if args.batch % 8:
        raise SystemExit(f"--batch {args.batch}: must divide by 8 (the largest data-parallel size here)")
    print(f"GPT: {args.layers} layers, hidden {args.hidden}, heads {args.heads}, seq {args.seq}, "
          f"vocab {args.vocab}, global batch {args.batch}, float32; one step per strategy, Adam")
    head = (f"{'strategy':<40} {'dev':>3}  {'params':>7} {'grads':>7} {'optim':>7} {'activ.':>9} {'total':>7}  "
            f"{'sim step':>9} {'estimate':>9} {'ratio':>8}")
    print(head)
    for name, strategy in STRATEGIES:
        simulated = simulated_activations_apply(strategy)
        strategy = strategy.with_(activation_model="simulation" if simulated else "megatron")
        config = TransformerConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, vocab=args.vocab,
                                   seq_len=args.seq, micro_batch=args.batch // strategy.data, dtype_bytes=4)
        start = time.perf_counter()
        rows = crosscheck_gpt(GPT, config, strategy)
        sim_seconds = time.perf_counter() - start
        n = 200
        est_seconds = timeit.timeit(lambda: estimate_job(config, strategy), number=n) / n
        errors = [f"{worst(rows, k):7.1e}" for k in KINDS[:3]]
        if simulated:
            activ, total = f"{worst(rows, 'activations'):9.1e}", f"{total_error(rows):7.1e}"
        else:
            activ, total = f"{'n/a':>9}", f"{'n/a':>7}"
        print(f"{name:<40} {strategy.devices:>3}  {' '.join(errors)} {activ} {total}  {sim_seconds:8.2f}s "
              f"{est_seconds * 1e3:7.3f}ms {sim_seconds / est_seconds:7.0f}x")
        if not simulated:
            act = next(r for r in rows if r.kind == "activations")
            print(f"{'':<40}      activations, device 0: Megatron Table 2 (16-bit, saved for backward) "
                  f"{format_bytes(act.estimated)}, simulation (every fp32 forward tensor) {format_bytes(act.measured)}")
    print("\nerrors: largest |estimate - measured| / measured over the devices; ratio: simulated step time / "
          "estimator time")


if __name__ == "__main__":
    main()
