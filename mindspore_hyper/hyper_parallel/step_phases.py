"""The phases of a training step that a HyperParallel-API script drives itself, marked from what
the script does, so its meshes get the step's memory series (`runtime/step_memory.py`) as
models wrapped by `auto_parallelize` do.

- forward: from the previous optimizer update (the mesh's creation for the first step) to the
  backward; every DTensor made on the mesh in it is noted by the op that made it
  (`dtensor/step_window.py`), those made before its first op as the step's inputs;
- backward: begins when the gradient function's backward begins (`mindspore.grad` /
  `value_and_grad`, which `parallelize_value_and_grad` calls, or `loss.backward()` of
  autograd_compat.py); a second forward and backward before the update is a later micro-batch
  of the same step (gradient accumulation);
- update: the optimizer's call (any `mindspore.nn.Optimizer`); its states count in the step peak.

Phases are marked for every mesh of the session alike (a step that made no op on a mesh leaves
it as it was). The window notes sizes only: the live bytes and the peak of the mesh's report
are unchanged.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from mindspore import nn

from mindspore_hyper.dtensor import interception
from mindspore_hyper.dtensor.step_window import StepRecord, StepWindow

__all__ = ["track", "backward_began", "update_began", "last_step", "reset_steps", "RecordedStep"]


@dataclass
class RecordedStep:
    """A mesh's last training step: its forward's record and the optimizer that ended it.

    Attributes:
        record: the forward (its micro-batches one after another).
        optimizer: the optimizer whose call ended the step; None: the script ran a backward but
            no optimizer since.
    """

    record: StepRecord
    optimizer: Optional[Any] = None


class _Phases:
    """One mesh's state: its accounting, the step in its backward (awaiting the update), the last
    complete step."""

    def __init__(self, accounting):
        self.accounting = accounting
        self.pending: Optional[StepRecord] = None
        self.done: Optional[RecordedStep] = None
        self.open()

    def open(self) -> None:
        self.accounting.window = StepWindow(len(self.accounting.timeline))

    def backward(self) -> None:
        window = self.accounting.window
        if window is None or len(self.accounting.timeline) == window.start:
            return  # no op on this mesh since the window opened: not one of this backward's meshes
        record = window.record(self.accounting)
        self.pending = record if self.pending is None else self.pending.then(record)
        self.open()  # a later micro-batch's forward, unless the update comes first

    def update(self, optimizer) -> None:
        if self.pending is not None:
            self.done = RecordedStep(self.pending, optimizer)
            self.pending = None
        self.open()


_TRACKED: Dict[int, _Phases] = {}  # id(Execution) -> its phases
_EXECUTIONS: List[Any] = []  # the tracked Executions (kept alive with the session's)
_ORIGINAL_OPTIMIZER_CALL = nn.Optimizer.__call__  # Cell.__call__, unless MindSpore gives Optimizer its own
_OWN_CALL = "__call__" in vars(nn.Optimizer)


def _optimizer_call(self, *args, **kwargs):
    """`nn.Optimizer.__call__`, marking the update of the tracked meshes' step first."""
    update_began(self)
    return _ORIGINAL_OPTIMIZER_CALL(self, *args, **kwargs)


functools.update_wrapper(_optimizer_call, _ORIGINAL_OPTIMIZER_CALL)


def track(execution) -> None:
    """Mark the step phases of `execution`'s mesh from now on (idempotent); installs the
    backward listener and the optimizer's marking on first use."""
    if id(execution) in _TRACKED:
        return
    _TRACKED[id(execution)] = _Phases(execution.accounting)
    _EXECUTIONS.append(execution)
    if backward_began not in interception.BACKWARD_LISTENERS:
        interception.BACKWARD_LISTENERS.append(backward_began)
    nn.Optimizer.__call__ = _optimizer_call


def backward_began() -> None:
    """The gradient function's backward begins: each tracked mesh's forward ends."""
    for phases in _TRACKED.values():
        phases.backward()


def update_began(optimizer) -> None:
    """`optimizer` is called: each tracked mesh's step in its backward is complete."""
    for phases in _TRACKED.values():
        phases.update(optimizer)


def last_step(execution) -> Optional[RecordedStep]:
    """`execution`'s last complete step; else a step whose backward ran with no update yet
    (optimizer None); else None (no backward ran on the mesh)."""
    phases = _TRACKED.get(id(execution))
    if phases is None:
        return None
    if phases.done is None and phases.pending is not None:
        return RecordedStep(phases.pending, None)
    return phases.done


def reset_steps() -> None:
    """Stop marking (a new script in the same process starts afresh): the windows are closed,
    the listener and MindSpore's optimizer call restored."""
    for phases in _TRACKED.values():
        phases.accounting.window = None
    _TRACKED.clear()
    _EXECUTIONS.clear()
    if backward_began in interception.BACKWARD_LISTENERS:
        interception.BACKWARD_LISTENERS.remove(backward_began)
    if _OWN_CALL:
        nn.Optimizer.__call__ = _ORIGINAL_OPTIMIZER_CALL
    elif "__call__" in vars(nn.Optimizer):
        del nn.Optimizer.__call__
