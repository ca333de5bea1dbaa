"""The measured PPO timeline of an msrun job: every process's units and waits, on one clock.

`PhaseEvent`s gathered from all processes (`ProcessPhases.gather`) become a `Timeline` with one
lane per process (`phase_timeline`), printed as a table or drawn as a PNG Gantt chart: what each
group computed when, and where it waited.
"""
from __future__ import annotations

from typing import Optional, Sequence

from mindspore_hyper.rlhf.process_phases import PhaseEvent
from mindspore_hyper.schedule.gantt import plot_gantt
from mindspore_hyper.schedule.span import Span
from mindspore_hyper.schedule.timeline import Timeline

__all__ = ["phase_timeline", "format_events", "plot_events"]

_ROLE_COLOURS = {"actor": "#9ecae1", "reference": "#c6dbef", "critic": "#fc9272", "reward_model": "#a1d99b"}


def phase_timeline(events: Sequence[PhaseEvent], step: Optional[int] = None) -> Timeline:
    """The events of `step` (None: all) as spans on lanes = ranks (sorted), from the first unit
    run: a "run" is busy (kind "run"), a "receive" a wait; a wait begun before the first run (in
    the previous step) is cut at it. Args of a span: step, phase, role."""
    chosen = [e for e in events if step is None or e.step == step]
    runs = [e for e in chosen if e.kind == "run"]
    t0 = min((e.start for e in runs), default=min((e.start for e in chosen), default=0.0))
    spans = [Span(e.rank, e.label, max(e.start, t0), e.end, e.kind, e.kind == "run",
                  args={"step": e.step, "phase": e.phase, "role": e.role})
             for e in chosen if e.end >= t0]
    return Timeline(spans, lanes=sorted({e.rank for e in chosen}), origin=t0)


def format_events(events: Sequence[PhaseEvent], step: Optional[int] = None) -> str:
    """One line per unit a process ran (rank, step, phase, role, label, start, end in ms from the
    first unit of the selection)."""
    timeline = phase_timeline(events, step)
    lines = [f"{'rank':>4} {'step':>4} {'phase':<11} {'role':<13} {'unit':<16} {'start ms':>9} {'end ms':>9}"]
    for s in sorted((s for s in timeline.spans if s.busy), key=lambda s: (s.start, s.lane)):
        lines.append(f"{s.lane:>4} {s.args['step']:>4} {s.args['phase']:<11} {s.args['role']:<13} {s.label:<16} "
                     f"{1e3 * (s.start - timeline.start):9.1f} {1e3 * (s.end - timeline.start):9.1f}")
    return "\n".join(lines)


def plot_events(events: Sequence[PhaseEvent], path: str, step: Optional[int] = None, title: Optional[str] = None
                ) -> None:
    """PNG Gantt chart: one row per process; filled bars are units run (coloured by role), hatched
    bars waits."""
    plot_gantt(phase_timeline(events, step), path, title=title or "PPO step under msrun", waits=True,
               color=lambda s: _ROLE_COLOURS.get(s.args["role"], "#d9d9d9"), time_scale=1e3,
               xlabel="ms (measured wall clock; hatched: waiting for another group's result)")
