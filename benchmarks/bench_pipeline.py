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

Measured section (comes with the pipeline runtime): a 4-process msrun run records every action's
start/end, `Timeline.from_records` holds it, and `simulate(schedule, measured=timeline.mean_costs())`
is set beside it (goal: bubble within 15%). It is a function added to SECTIONS.

Usage: .venv/bin/python benchmarks/bench_pipeline.py [--pictures DIR]
  --pictures DIR  also write a PNG Gantt chart of each kind at p=4, m=8 (v=2 where it applies)
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import List, Optional

from mindspore_hyper.schedule import SCHEDULE_KINDS, Timeline, build_schedule, simulate
from mindspore_hyper.schedule.formulas import BUBBLE_FORMULAS, bubble_fraction, published_idle

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


def unit_timeline(kind: str, p: int, m: int) -> Timeline:
    v = CHUNKS.get(kind, 1)
    return simulate(build_schedule(kind, p, m, v), forward=1 / v, backward_input=1 / v, backward_weight=1 / v)


def span_bubble_fraction(t: Timeline) -> float:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pictures", metavar="DIR", help="write a Gantt PNG per schedule kind at p=4, m=8")
    args = parser.parse_args()
    for title, run, show in SECTIONS:
        print(f"## {title}\n")
        show(run())
    if args.pictures:
        write_pictures(args.pictures)


if __name__ == "__main__":
    main()
