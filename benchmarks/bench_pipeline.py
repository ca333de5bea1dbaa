"""Pipeline schedules: simulated bubble fraction against the published formula.

Simulated section: every schedule kind at p in {2, 4, 8} ranks and m in {p, 2p, 4p}
microbatches (v = 2 chunks per rank for interleaved_1f1b and zb_v) is built, validated and
simulated with unit costs -- F = B = W = 1 for one microbatch through a rank's whole share of
the model, so one chunk action costs 1/v -- and zero p2p latency. Printed per row: the simulated
bubble fraction, the published formula's, their difference, the bubble over the synchronous step
(equal to the first for every kind but zb_v) and the peak of live activations (in microbatches of
a rank's share). Bubble fraction = idle / (idle + work) per rank, measured
over the synchronous step ("step"), or, for zb_v, within each rank's own span ("span", the
zero-bubble papers' measure).

Measured section: a 4-process msrun job trains a model with the pipeline runtime (one process
per pipeline rank, shared-memory p2p): `--model chain` (default) a chain of nn.Dense/ReLU
layers (SGD), `--model gpt` examples/models.py's GPT (`--layers --hidden --heads --seq --vocab`,
pipelined through its construct's CellList of blocks; AdamWeightDecay, as bench_distributed);
each process's optimizer updates its stages' Parameters (`stage_parameters`).
Every action's real start and end are recorded and all-gathered
(`PipelineModel.measured_timeline`), and the schedule is simulated with the measured mean cost
of each (action kind, stage) of the same step (`simulated_timeline`). Printed per kind: measured
and simulated bubble fraction and makespan (medians over the steps after the first), their ratio
(goal: bubble within 15%), the step's wall time (the slowest rank's median of `train_step`), and
a profile of the last step per rank (busy, idle in receives, other idle).
benchmarks/bench_step_time.py predicts the GPT job's step with the planner (`run_measured`).

Usage: .venv/bin/python benchmarks/bench_pipeline.py [--pictures DIR] [--measured] [--model chain|gpt]
        [--width W] [--depth D] [--batch N] [--steps S] [--kinds K ...] [--trace DIR]
  --pictures DIR  also write a PNG Gantt chart of each kind at p=4, m=8 (v=2 where it applies)
  --measured      run the measured section (msrun, --workers processes, default 4; ~20 s per kind)
  --trace DIR     write the last step's measured timeline beside its simulation (one chrome trace per kind)
  --warmup N      first steps left out of the medians (default 1); --no-pin: do not pin each process to a core
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from mindspore_hyper.schedule import SCHEDULE_KINDS, ScheduleTimeline, build_schedule, simulate_schedule
from mindspore_hyper.schedule.formulas import BUBBLE_FORMULAS, bubble_fraction, published_idle

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpt_args import add_gpt_model_arguments  # noqa: E402

CHUNKS = {"interleaved_1f1b": 2, "zb_v": 2, "dualpipe_v": 2}


@dataclass(frozen=True)
class Row:
    kind: str
    p: int
    m: int
    v: int
    simulated: Optional[float]  # None when the family refuses (p, m)
    formula: Optional[float]  # None where the published formula does not apply
    step: Optional[float]  # bubble over the synchronous step, whatever the formula's measure
    peak: Optional[float]
    note: str = ""


def unit_timeline(kind: str, p: int, m: int) -> ScheduleTimeline:
    v = CHUNKS.get(kind, 1)
    return simulate_schedule(build_schedule(kind, p, m, v), forward=1 / v, backward_input=1 / v, backward_weight=1 / v)


def span_bubble_fraction(t: ScheduleTimeline) -> float:
    idle = sum(t.span_bubble_time(r) for r in range(t.num_ranks))
    return idle / (idle + sum(t.busy_time(r) for r in range(t.num_ranks)))


def simulated_section() -> List[Row]:
    rows = []
    for kind in SCHEDULE_KINDS:
        formula = BUBBLE_FORMULAS[kind]
        for p in (2, 4, 8):
            for m in (p, 2 * p, 4 * p):
                v = CHUNKS.get(kind, 1)
                try:
                    t = unit_timeline(kind, p, m)
                except ValueError as refused:
                    reason = str(refused).split(": ", 1)[1]  # drop the "num_microbatches=..." prefix
                    rows.append(Row(kind, p, m, v, None, None, None, None, f"refused: {reason}"))
                    continue
                if formula.measure == "span":
                    simulated = span_bubble_fraction(t)
                    expected = 0.0 if m >= 2 * p else None
                else:
                    simulated = t.bubble_fraction
                    expected = bubble_fraction(published_idle(kind, p, v), m)
                peak = max(t.peak_inflight(r) for r in range(p)) / v
                rows.append(Row(kind, p, m, v, simulated, expected, t.bubble_fraction, peak))
    return rows


def print_rows(rows: List[Row]) -> None:
    print("| kind | p | m | v | formula | measure | simulated bubble | formula bubble | difference | step bubble "
          "| peak live |")
    print("|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        f = BUBBLE_FORMULAS[r.kind]
        if r.simulated is None:
            print(f"| {r.kind} | {r.p} | {r.m} | {r.v} | {f.text} | {f.measure} | {r.note} | | | | |")
            continue
        formula = "n/a (m < 2p)" if r.formula is None else f"{r.formula:.4f}"
        diff = "" if r.formula is None else f"{r.simulated - r.formula:+.2e}"
        print(f"| {r.kind} | {r.p} | {r.m} | {r.v} | {f.text} | {f.measure} | {r.simulated:.4f} | {formula} | "
              f"{diff} | {r.step:.4f} | {r.peak:g} |")
    compared = [abs(r.simulated - r.formula) for r in rows if r.formula is not None]
    refused = sum(r.simulated is None for r in rows)
    print(f"\n{len(compared)} of {len(rows)} rows compared ({refused} refused); largest |difference| = "
          f"{max(compared):.2e}")


def write_pictures(directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    for kind in SCHEDULE_KINDS:
        path = os.path.join(directory, f"schedule_{kind}.png")
        unit_timeline(kind, 4, 8).plot(path)
        print(f"wrote {path}")


SECTIONS = [("Simulated bubble vs published formula (unit costs, zero p2p)", simulated_section, print_rows)]

# ---------------------------------------------------------------- measured (msrun, 4 processes)
MEASURED_KINDS = ("gpipe", "1f1b", "zb_h1")
WORKER_ENV = "BENCH_PIPELINE_WORKER"  # msrun parses options after the script: the worker's arguments travel here


def _chain_job(spec: dict):
    """The Dense/ReLU chain under nn.MSELoss, its batch (input, target) and an SGD builder."""
    from mindspore import Tensor, nn

    width, depth = spec["width"], spec["depth"]
    layers = [nn.Dense(width, width) if i % 2 == 0 else nn.ReLU() for i in range(2 * depth - 1)]
    model = nn.WithLossCell(nn.SequentialCell(layers), nn.MSELoss())
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((spec["batch"], width)).astype(np.float32))
    y = Tensor(rng.standard_normal((spec["batch"], width)).astype(np.float32))
    return model, (x, y), lambda params: nn.SGD(params, 1e-3)


def _gpt_job(spec: dict):
    """examples/models.py's GPT, bench_distributed's batch (ids, labels) and its AdamWeightDecay."""
    from types import SimpleNamespace

    from mindspore import Tensor, nn

    import bench_distributed as bd

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
    from models import GPT

    args = SimpleNamespace(**{k: spec[k] for k in ("layers", "hidden", "heads", "seq", "vocab", "batch")})
    model = GPT(**bd.cfg_of(args))
    ids, labels = (Tensor(a) for a in bd.batch(args))
    return model, (ids, labels), lambda params: nn.AdamWeightDecay(params, learning_rate=1e-4)


JOBS = {"chain": _chain_job, "gpt": _gpt_job}


def measured_worker(spec: dict) -> None:
    """One msrun process: train the model pipelined; write its step times (every rank) and this
    step's timelines (rank 0)."""
    import time

    import mindspore as ms

    import mindspore_hyper as mh
    from mindspore_hyper import Layout
    from mindspore_hyper.pipeline.measured_costs import simulate_measured

    ms.set_context(mode=ms.PYNATIVE_MODE, runtime_num_threads=1)  # 4 processes share the cores
    mh.set_context(mode="distributed", comm_timeout=300.0)
    ms.set_seed(0)
    model, inputs, make_optimizer = JOBS[spec["model"]](spec)
    parallel = mh.auto_parallelize(model, Layout((spec["workers"],), ("pipeline",))(tensor_map=()),
                                   pipeline={"schedule": spec["kind"], "microbatches": spec["microbatches"]})
    if spec.get("pin"):  # one core per process, round robin (os.cpu_count() may be below the process count)
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[parallel.world.rank % len(os.sched_getaffinity(0))]})
    optimizer = make_optimizer(stage_parameters(parallel, inputs))
    rows, timelines, seconds = [], [], []
    for _ in range(spec["steps"]):
        start = time.perf_counter()
        parallel.train_step(optimizer, *inputs)
        seconds.append(time.perf_counter() - start)
        measured = parallel.measured_timeline()
        simulated = parallel.simulated_timeline(measured)
        timelines.append(measured)
        rows.append({"measured_bubble": measured.bubble_fraction, "simulated_bubble": simulated.bubble_fraction,
                     "measured_makespan": measured.makespan, "simulated_makespan": simulated.makespan,
                     "profile": _profile(measured), "stage_costs": _stage_costs(measured)})
    with open(os.path.join(spec["out"], f"steps{parallel.world.rank}.json"), "w") as f:
        json.dump(seconds, f)
    counted = timelines[spec["warmup"]:]  # the first steps build the gradient graphs
    per_action = simulate_measured(parallel.schedule, counted)
    rows[-1]["per_action"] = {"measured_bubble": float(np.median([t.bubble_fraction for t in counted])),
                              "simulated_bubble": per_action.bubble_fraction,
                              "measured_makespan": float(np.median([t.makespan for t in counted])),
                              "simulated_makespan": per_action.makespan,
                              "spread": _spread(counted)}
    if parallel.world.rank == 0:
        if spec.get("trace"):
            os.makedirs(spec["trace"], exist_ok=True)
            from mindspore_hyper.pipeline.side_by_side import write_side_by_side_trace

            write_side_by_side_trace(os.path.join(spec["trace"], f"pipeline_{spec['kind']}.json"), [measured, simulated])
        with open(os.path.join(spec["out"], "result.json"), "w") as f:
            json.dump(rows, f)


def stage_parameters(parallel, inputs) -> list:
    """The Parameters of this process's stages: what its optimizer updates, as in Megatron-LM
    and as the step-time model counts. A model pipelined through its construct (the GPT) is cut
    into stages at its first call, and until then `optimizer_parameters()` lists every Parameter
    (the other stages' with zero gradients each step): one forward of the batch cuts it first."""
    if parallel.layers.chain is not None:
        parallel(*inputs)
    return [p for s in parallel.held_stages() for p in parallel.stage_cells[s].trainable_params()]


def _stage_costs(t: ScheduleTimeline) -> dict:
    """Mean seconds per (action kind, stage) of one measured step, as "kind stage" -> seconds."""
    return {f"{kind.value} {stage}": cost for (kind, stage), cost in t.mean_costs().items()}


def _spread(timelines: List[ScheduleTimeline]) -> float:
    """Largest max/min ratio of one compute action's durations over the steps (how much a cost swings)."""
    from collections import defaultdict

    durations = defaultdict(list)
    for t in timelines:
        for e in t.spans:
            if e.action.is_compute:
                durations[(e.action.kind, e.action.stage, e.action.microbatch)].append(e.duration)
    return max(max(v) / max(min(v), 1e-9) for v in durations.values())


def _profile(t: ScheduleTimeline) -> list:
    """Per rank, seconds of the makespan: compute, waiting in receives, in sends (tensor to numpy,
    queued), before the rank's first action (head), after its last (tail), between actions."""
    out = []
    for rank in range(t.num_ranks):
        events = t.of(rank)
        busy = t.busy_time(rank)
        waiting = sum(e.duration for e in events if e.action.kind.value == "recv")
        sending = sum(e.duration for e in events if e.action.kind.value == "send")
        head = min(e.start for e in events) - t.start
        tail = t.start + t.makespan - max(e.end for e in events)
        out.append({"busy": busy, "recv_wait": waiting, "send": sending, "head": head, "tail": tail,
                    "gaps": t.makespan - busy - waiting - sending - head - tail})
    return out


def measured_spec(kind: str, args) -> dict:
    """The worker's job description from the command line (or bench_step_time's GPT options)."""
    spec = {"model": args.model, "kind": kind, "workers": args.workers, "microbatches": args.microbatches,
            "batch": args.batch, "steps": args.steps, "trace": args.trace, "warmup": args.warmup, "pin": args.pin}
    if args.model == "gpt":
        spec.update({k: getattr(args, k) for k in ("layers", "hidden", "heads", "seq", "vocab")})
    else:
        spec.update(width=args.width, depth=args.depth)
    return spec


@dataclass(frozen=True)
class MeasuredRun:
    """What the workers of one measured job wrote.

    Attributes:
        rows: per step, rank 0's measured and simulated timeline figures (`measured_worker`).
        step_seconds: per rank, the wall seconds of each `train_step`.
    """

    rows: list
    step_seconds: List[List[float]]

    def slowest_median(self, warmup: int) -> float:
        """The slowest rank's median step seconds, the first `warmup` steps left out."""
        return max(float(np.median(times[warmup:])) for times in self.step_seconds)


def run_measured(spec: dict) -> MeasuredRun:
    """Run the job of `spec` (`measured_spec`) on spec["workers"] processes under msrun."""
    out = tempfile.mkdtemp(prefix="bench_pipeline_")
    spec = dict(spec, out=out)
    env = dict(os.environ, **{WORKER_ENV: json.dumps(spec)})
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    from socket import socket

    with socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [os.path.join(bindir, "msrun"), f"--worker_num={spec['workers']}", f"--local_worker_num={spec['workers']}",
           f"--master_port={port}", f"--log_dir={out}/logs", "--join=True", os.path.abspath(__file__)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        sys.exit(f"msrun failed ({proc.returncode}); logs in {out}/logs")
    with open(os.path.join(out, "result.json")) as f:
        rows = json.load(f)
    steps = []
    for rank in range(spec["workers"]):
        with open(os.path.join(out, f"steps{rank}.json")) as f:
            steps.append(json.load(f))
    return MeasuredRun(rows, steps)


def measured_section(args) -> None:
    print(f"## Measured ({args.workers} processes, msrun, shared-memory p2p) vs simulated with the measured costs\n")
    if args.model == "gpt":
        model = (f"examples/models.py's GPT (layers {args.layers}, hidden {args.hidden}, heads {args.heads}, seq "
                 f"{args.seq}, vocab {args.vocab}), AdamWeightDecay")
    else:
        model = f"{args.depth} nn.Dense({args.width}, {args.width}) with ReLUs between, SGD"
    print(f"model: {model}; batch {args.batch}, {args.microbatches} microbatches, {args.steps} steps (the first "
          f"{args.warmup} not counted), {'one core per process, ' if args.pin else ''}"
          f"{os.cpu_count()} cores shared with whatever else runs (see docs/benchmarks.md)\n")
    print("| kind | measured bubble | simulated bubble | ratio | measured makespan (ms) | simulated makespan (ms) | "
          "step (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    profiles, per_action, costs = {}, {}, {}
    for kind in args.kinds:
        run = run_measured(measured_spec(kind, args))
        per_action[kind] = run.rows[-1]["per_action"]
        rows = run.rows[args.warmup:]
        mb = float(np.median([r["measured_bubble"] for r in rows]))
        sb = float(np.median([r["simulated_bubble"] for r in rows]))
        mm = float(np.median([r["measured_makespan"] for r in rows])) * 1e3
        sm = float(np.median([r["simulated_makespan"] for r in rows])) * 1e3
        print(f"| {kind} | {mb:.3f} | {sb:.3f} | {mb / sb:.2f} | {mm:.1f} | {sm:.1f} | "
              f"{run.slowest_median(args.warmup):.3f} |")
        profiles[kind] = rows[-1]["profile"]
        costs[kind] = rows[-1]["stage_costs"]
    print(f"\nper-action costs: each compute action (kind, stage, microbatch) priced by its median over steps "
          f"{args.warmup + 1}-{args.steps}, against the median measured bubble of those steps\n")
    print("| kind | measured bubble | simulated bubble | ratio | measured makespan (ms) | simulated makespan (ms) | "
          "largest swing of one action |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, r in per_action.items():
        print(f"| {kind} | {r['measured_bubble']:.3f} | {r['simulated_bubble']:.3f} | "
              f"{r['measured_bubble'] / r['simulated_bubble']:.2f} | {r['measured_makespan'] * 1e3:.1f} | "
              f"{r['simulated_makespan'] * 1e3:.1f} | {r['spread']:.1f}x |")
    print("\nprofile of the last measured step (ms per rank: compute / waiting in receives / sends / head / "
          "tail / between actions):\n")
    for kind, ranks in profiles.items():
        cells = ", ".join(f"r{i} " + "/".join(f"{p[k] * 1e3:.0f}" for k in ("busy", "recv_wait", "send", "head", "tail",
                                                                           "gaps"))
                          for i, p in enumerate(ranks))
        print(f"- {kind}: {cells}")
    print("\nmean seconds per action of the last measured step (ms, per kind and stage):\n")
    for kind, by_action in costs.items():
        print(f"- {kind}: " + ", ".join(f"{name} {seconds * 1e3:.0f}" for name, seconds in by_action.items()))


def main() -> None:
    if os.environ.get(WORKER_ENV):
        measured_worker(json.loads(os.environ[WORKER_ENV]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pictures", metavar="DIR", help="write a Gantt PNG per schedule kind at p=4, m=8")
    parser.add_argument("--measured", action="store_true", help="run the 4-process measured section (msrun)")
    parser.add_argument("--workers", type=int, default=4, help="processes = pipeline ranks of the measured run")
    parser.add_argument("--kinds", nargs="+", default=list(MEASURED_KINDS), choices=list(SCHEDULE_KINDS))
    parser.add_argument("--model", choices=tuple(JOBS), default="chain",
                        help="the measured job: the Dense/ReLU chain, or examples/models.py's GPT")
    parser.add_argument("--width", type=int, default=256, help="chain: width of the Dense layers")
    parser.add_argument("--depth", type=int, default=8, help="chain: Dense layers (2 per stage at the default)")
    add_gpt_model_arguments(parser.add_argument_group("gpt model"))
    parser.add_argument("--batch", type=int, help="global batch (default: 64 for the chain, 8 for the GPT)")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--trace", metavar="DIR", help="write measured/simulated chrome traces of the last step")
    parser.add_argument("--warmup", type=int, default=1, help="first steps not counted (they build the grad graphs)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="pin each process to one core, round robin (os.sched_setaffinity; --no-pin: not)")
    args = parser.parse_args()
    if args.batch is None:
        args.batch = 8 if args.model == "gpt" else 64
    for title, run, show in SECTIONS:
        print(f"## {title}\n")
        show(run())
    if args.pictures:
        write_pictures(args.pictures)
    if args.measured:
        measured_section(args)


if __name__ == "__main__":
    main()
