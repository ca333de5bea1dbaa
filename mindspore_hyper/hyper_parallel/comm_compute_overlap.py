"""Upstream's two-thread comm/compute overlap (`core.pipeline_parallel.comm_compute_overlap` and
`.hook_coordinator`), with the numerics of the one-thread path.

Upstream runs a forward chunk and a backward chunk on two Python threads so that one side's
collective overlaps the other side's compute, and `HookCoordinator` orders the two threads'
kernel launches (a barrier plus "communication first" events). The order of launches changes
when kernels run on a device, not what they compute: the forward and the backward touch
different microbatches' tensors. On CPU nothing overlaps, so here `CommComputeOverlap.run` runs
the backward and then the forward on the calling thread, which is what upstream's own sequential
diagnostic (MindFormers' `EP_OVERLAP_SEQ=1`) runs, and the values are those of the overlapped run.
The coordinator stays disabled, so the hooks the wrappers insert pass values through unchanged.
"""
from __future__ import annotations

from enum import Enum
from typing import Callable

__all__ = ["HookRole", "HookCoordinator", "CommComputeOverlap"]


class HookRole(Enum):
    """What the caller of a rendezvous dispatches next: a collective or a computation."""

    COMM = "comm"
    COMPUTE = "compute"


def _check_role(role) -> None:
    if not isinstance(role, HookRole):
        raise TypeError(f"Argument 'role' must be HookRole, but got type {type(role)}.")


class HookCoordinator:
    """Upstream's rendezvous between the forward and backward threads of a dual-pipe step.

    Here the two passes run one after the other on one thread (module docstring), so there is no
    second thread to meet: while disabled (always, under `CommComputeOverlap.run`) `rendezvous` and
    `notify_dispatched` return at once, as upstream's do when disabled.
    """

    def __init__(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        """Refused: enabled, upstream's coordinator blocks each thread until the other arrives,
        and the passes here run on one thread, so the first rendezvous would wait forever.

        Raises:
            RuntimeError: always, naming the way that runs.
        """
        raise RuntimeError("HookCoordinator.enable(): the two-thread rendezvous is not simulated (the forward and "
                           "backward run one after the other on one thread here, which would wait forever); "
                           "drive the passes with CommComputeOverlap.run(fwd_fn, bwd_fn)")

    def disable(self) -> None:
        """Leave coordination off (it is never on here)."""
        self._enabled = False

    def is_enabled(self) -> bool:
        """Whether coordination is active: never here (module docstring)."""
        return self._enabled

    def rendezvous(self, role: HookRole) -> None:
        """Meet the paired thread: nothing to meet while disabled (returns at once).

        Raises:
            TypeError: `role` is not a HookRole.
        """
        _check_role(role)

    def notify_dispatched(self, role: HookRole) -> None:
        """Signal that a collective was dispatched: nothing waits on it while disabled.

        Raises:
            TypeError: `role` is not a HookRole.
        """
        _check_role(role)


class CommComputeOverlap:
    """Upstream's overlap orchestrator: wraps MoE dispatch/combine with synchronisation hooks and
    runs a forward and a backward chunk (here one after the other: module docstring)."""

    def __init__(self) -> None:
        self._coordinator = HookCoordinator()

    @property
    def coordinator(self) -> HookCoordinator:
        """The HookCoordinator the wrapped callables' hooks consult."""
        return self._coordinator

    def wrap_dispatch(self, dispatch_fn: Callable) -> Callable:
        """`dispatch_fn` bracketed by upstream's hooks A/B: with the coordinator disabled the
        hooks pass their tensors through, so the wrapper computes what `dispatch_fn` computes.

        Raises:
            TypeError: `dispatch_fn` is not callable.
        """
        return self._wrap(dispatch_fn, "dispatch_fn")

    def wrap_combine(self, combine_fn: Callable, is_last_layer: bool = False) -> Callable:
        """`combine_fn` bracketed by upstream's hooks C/D (`is_last_layer` tags D as upstream's
        last-layer hook); computes what `combine_fn` computes (see `wrap_dispatch`).

        Raises:
            TypeError: `combine_fn` is not callable or `is_last_layer` is not a bool.
        """
        if not isinstance(is_last_layer, bool):
            raise TypeError(f"is_last_layer must be a bool, got {is_last_layer!r}")
        return self._wrap(combine_fn, "combine_fn")

    @staticmethod
    def _wrap(fn: Callable, what: str) -> Callable:
        if not callable(fn):
            raise TypeError(f"{what} must be callable, got {type(fn).__name__}")

        def wrapped(*args, **kwargs):
            return fn(*args, **kwargs)

        return wrapped

    def run(self, fwd_fn: Callable[[], None], bwd_fn: Callable[[], None]) -> None:
        """Run the backward chunk, then the forward chunk, on this thread.

        Upstream runs them concurrently (backward on a daemon thread); they work on different
        microbatches, so the order changes no value. As upstream does, the forward runs even when
        the backward failed; the backward's error then wins, as a RuntimeError caused by it.

        Raises:
            TypeError: either argument is not callable.
            RuntimeError: the backward raised (chained).
            Exception: what the forward raised, when the backward did not.
        """
        for name, fn in (("fwd_fn", fwd_fn), ("bwd_fn", bwd_fn)):
            if not callable(fn):
                raise TypeError(f"CommComputeOverlap.run: {name} must be callable, got {type(fn).__name__}")
        backward_error = None
        try:
            bwd_fn()
        except Exception as exc:  # raised after the forward ran, as upstream's joined thread does
            backward_error = exc
        try:
            fwd_fn()
        finally:
            if backward_error is not None:
                raise RuntimeError("Exception in backward thread during dual-pipe overlap") from backward_error
