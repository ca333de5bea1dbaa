"""Pipeline schedules as data: build, validate, simulate -> ScheduleTimeline; and the rebalancing planner.

A runtime takes `schedule.actions[rank]` and executes each Action in order (see actions.py);
`simulate_schedule` times the same lists (`simulate_shared` when the ranks share cores), and
`ScheduleTimeline.from_records` holds a measured run for comparison. `Span` and `Timeline` are
the package's one timeline (every feature builds spans).
"""
from mindspore_hyper.schedule.actions import Action, ActionKind, P2PTensor, Payload
from mindspore_hyper.schedule.build import SCHEDULE_KINDS, build_schedule
from mindspore_hyper.schedule.errors import ScheduleError
from mindspore_hyper.schedule.schedule import Schedule
from mindspore_hyper.schedule.schedule_timeline import ScheduleTimeline
from mindspore_hyper.schedule.shared_simulation import simulate_shared
from mindspore_hyper.schedule.simulation import simulate_schedule
from mindspore_hyper.schedule.span import Span
from mindspore_hyper.schedule.timeline import Timeline
from mindspore_hyper.schedule.validate import validate_schedule

__all__ = ["Action", "ActionKind", "Payload", "P2PTensor", "Schedule", "ScheduleError", "build_schedule",
           "SCHEDULE_KINDS", "validate_schedule", "simulate_schedule", "simulate_shared", "Span", "Timeline",
           "ScheduleTimeline"]
