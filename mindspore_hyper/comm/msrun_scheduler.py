"""msrun's scheduler process, let go before it imports MindSpore.

msrun runs the script once more as its scheduler (MS_ROLE=MS_SCHED). With the shared-memory
transport the scheduler has nothing to serve, and `World.from_env` lets it exit, but only after
the script's imports: about 3 s of CPU for MindSpore alone, on cores the workers share. A script
that calls `exit_if_msrun_scheduler()` first lets it go at once.
"""
from __future__ import annotations

import os
import sys

from mindspore_hyper.context import get_context

__all__ = ["exit_if_msrun_scheduler", "scheduler_left"]

# Set in every process of a script that let the scheduler go: the runtime then refuses a
# transport that needs the scheduler (runtime/distributed/world.py).
_LEFT_ENV = "MSHYPER_MSRUN_SCHEDULER_LEFT"


def exit_if_msrun_scheduler() -> None:
    """Exit this process if it is msrun's scheduler and the job uses the shared-memory transport.

    Call it at the top of a script, before importing MindSpore. The transport is the
    `dist_transport` flag at that moment (from `set_context` or MS_HYPER_DIST_TRANSPORT); a worker
    that later asks for another transport is refused (the scheduler is gone). With the "mindspore" or
    "hybrid" transport, or outside msrun, it does nothing.
    """
    transport = get_context("dist_transport")
    role = os.environ.get("MS_ROLE")
    if transport != "shm" or role is None:
        return
    if role == "MS_SCHED":
        sys.exit(0)
    os.environ[_LEFT_ENV] = "1"


def scheduler_left() -> bool:
    """Whether this script let msrun's scheduler go (`exit_if_msrun_scheduler` with shm)."""
    return os.environ.get(_LEFT_ENV) == "1"
