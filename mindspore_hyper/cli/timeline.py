"""`mindspore-hyper timeline`: a pipeline schedule's simulated timeline (mindspore_hyper/schedule)."""
from __future__ import annotations

import argparse
import json

from mindspore_hyper.cli.arg_types import positive_int
from mindspore_hyper.cli.common import add_command

__all__ = ["add_parser", "run"]

EXAMPLES = """\
examples:
  mindspore-hyper timeline 1f1b --stages 4 --microbatches 8 --png 1f1b.png
  mindspore-hyper timeline interleaved_1f1b --stages 4 --microbatches 8 --chunks 2 --trace trace.json
  mindspore-hyper timeline zb_h1 --stages 4 --microbatches 8 --forward 1 --backward-input 1 \\
      --backward-weight 0.5 --p2p 0.05 --json
  (the trace loads in chrome://tracing or https://ui.perfetto.dev)"""


def _cost(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of time units >= 0") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of time units >= 0")
    return value


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `timeline` subcommand."""
    from mindspore_hyper.schedule import SCHEDULE_KINDS

    p = add_command(subparsers, "timeline", "a pipeline schedule's timeline: bubble, in-flight, PNG / Chrome trace",
                    "Build a pipeline schedule (every rank's ordered forward / backward / send / receive actions), "
                    "validate it and time it with per-action costs: makespan, bubble fraction, idle time and peak "
                    "in-flight microbatches per rank; optionally a PNG Gantt chart and a Chrome trace.", EXAMPLES)
    p.add_argument("kind", choices=SCHEDULE_KINDS, help="schedule kind")
    p.add_argument("--stages", type=positive_int, required=True, help="pipeline ranks p")
    p.add_argument("--microbatches", type=positive_int, required=True, help="microbatches m per batch")
    p.add_argument("--chunks", type=positive_int, default=1, help="model chunks per rank v (interleaved: >= 2; "
                                                                 "V-shaped: 2)")
    costs = p.add_argument_group("costs (time units per microbatch and virtual stage)")
    costs.add_argument("--forward", type=_cost, default=1.0, help="forward (default 1)")
    costs.add_argument("--backward-input", dest="backward_input", type=_cost, default=1.0,
                       help="input-gradient backward (default 1)")
    costs.add_argument("--backward-weight", dest="backward_weight", type=_cost, default=1.0,
                       help="weight-gradient backward (default 1); a full backward costs both")
    costs.add_argument("--p2p", type=_cost, default=0.0, help="latency of one send -> receive (default 0)")
    out = p.add_argument_group("output")
    out.add_argument("--png", metavar="PATH", help="write a Gantt chart (PNG)")
    out.add_argument("--trace", metavar="PATH", help="write a Chrome trace (JSON)")
    out.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run, parser=p)
    return p


def run(args: argparse.Namespace) -> int:
    from mindspore_hyper.schedule import build_schedule, simulate_schedule

    schedule = build_schedule(args.kind, args.stages, args.microbatches, args.chunks)
    timeline = simulate_schedule(schedule, forward=args.forward, backward_input=args.backward_input,
                        backward_weight=args.backward_weight, p2p=args.p2p)
    ranks = range(schedule.num_ranks)
    result = {
        "kind": args.kind, "stages": args.stages, "microbatches": args.microbatches, "chunks": args.chunks,
        "makespan": timeline.makespan, "bubble_fraction": timeline.bubble_fraction,
        "bubble_time": [timeline.bubble_time(r) for r in ranks],
        "peak_inflight": [timeline.peak_inflight(r) for r in ranks],
    }
    if args.png:
        timeline.plot(args.png)
        result["png"] = args.png
    if args.trace:
        timeline.to_chrome_trace(args.trace)
        result["trace"] = args.trace
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.kind}: {args.stages} ranks, {args.microbatches} microbatches, {args.chunks} chunk(s) per rank")
    print(f"makespan {timeline.makespan:g}, bubble fraction {timeline.bubble_fraction:.1%}")
    print("rank  idle  peak in-flight")
    for r in ranks:
        print(f"{r:4d}  {result['bubble_time'][r]:4g}  {result['peak_inflight'][r]:14d}")
    for key in ("png", "trace"):
        if key in result:
            print(f"{key}: {result[key]}")
    return 0
