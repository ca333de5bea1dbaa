"""What caused a collective: one short text per recorded collective, for the per-device reports.

The code that knows why bytes move sets the cause around the call that moves them: the DTensor
dispatcher around an op's input redistribution ("redistribute for MatMul input 1 in fc1") and
its fan-out ("gradient sum for MatMul input 0 in fc1"), the runtimes for a parameter's
gradient synchronisation ("grad sync of fc1.weight"), the ZeRO-1 gather and the global gradient
norm's scalar sum ("clip grad norm"; "grad norm" when the step does not clip), MoE for its token
exchange, ring attention for its shifts. A forward collective is recorded under the cause set
when it runs; a backward one under the cause set when its forward ran (the backends capture it
then). The cost is one attribute read per collective and, where a cause is set, one string.

The cause is per thread (a pipeline or a sender thread never sees another thread's op).
"""
from __future__ import annotations

import threading
from typing import Optional

__all__ = ["current_cause", "set_cause", "UNATTRIBUTED", "op_cause", "grad_sync_cause", "zero_gather_cause",
           "CLIP_NORM_CAUSE", "GRAD_NORM_CAUSE"]

UNATTRIBUTED = "not attributed"  # the report's text for a collective recorded under no cause
CLIP_NORM_CAUSE = "clip grad norm"  # the global gradient norm's scalar sum, clipping to it
GRAD_NORM_CAUSE = "grad norm"  # the same sum without clipping (last_grad_norm, the loss-scale overflow check)

_state = threading.local()


def current_cause() -> str:
    """The cause set in this thread now ("" when none)."""
    return getattr(_state, "cause", "")


def set_cause(cause: Optional[str]) -> str:
    """Make `cause` the current one (None or "": none); returns the previous one, to be set
    back when the caused work is done (`set_cause(previous)`, in a `finally`)."""
    previous = getattr(_state, "cause", "")
    _state.cause = cause or ""
    return previous


def op_cause(what: str, op: str, index: int, cell: str = "") -> str:
    """The cause of moving input `index` of `op` (a MindSpore op name): `what` is "redistribute
    for" (its layout changes) or "gradient sum for" (it is read by an op sharded over axes it is
    replicated on, so its gradient is summed over them); `cell`: the Cell path of the op's
    parameter ("layers.0.fc1"), when one of its inputs is a model parameter."""
    return f"{what} {op} input {index}" + (f" in {cell}" if cell else "")


def grad_sync_cause(*names: str) -> str:
    """The cause of a data-parallel gradient sum of the parameters `names`."""
    return "grad sync of " + ", ".join(names)


def zero_gather_cause(*names: str) -> str:
    """The cause of the optimizer's ZeRO-1 gather of the updated parameters `names`."""
    return "optimizer ZeRO gather of " + ", ".join(names)
