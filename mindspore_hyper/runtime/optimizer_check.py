"""The one check that an optimizer is built on a model's `optimizer_parameters()`.

Every model the user trains (ParallelModel and its runtimes' subclasses, PipelineModel,
MPMDModel) hands its optimizer the gradients through `optimizer_gradients`, which refuses a
Parameter the model cannot give a gradient for; ParallelModel and MPMDModel also run
`check_optimizer` first, before the step computes anything (ZeRO-1 slices and foreign Parameters
named with both shapes).
"""
from __future__ import annotations

from typing import Callable, Collection, Mapping, Optional, Sequence

__all__ = ["check_optimizer", "optimizer_gradients"]


def check_optimizer(optimizer, full: Sequence, targets: Sequence, optimizer_state, where: str = "train_step") -> None:
    """Refuse an optimizer that does not update what the model needs: built on the model's full
    parameters where ZeRO-1 (`optimizer_state=`) gives each process only a slice of them (its
    states would stay full size), or (train_step) holding Parameters that are not the model's;
    `report` takes an optimizer of a larger model (a pipeline's, over every stage) but not one
    that updates none of the model's Parameters.

    Args:
        optimizer: the optimizer to check.
        full: the model's trainable Parameters.
        targets: what the optimizer must update instead, one per entry of `full` (the same
            Parameter, or this process's ZeRO-1 slice of it): `optimizer_parameters()`.
        optimizer_state: the strategy's `optimizer_state` axis (named in the message).
        where: the caller ("train_step" or "report"), the message's first word.

    Raises:
        ValueError: naming the parameter, both shapes and the fix (build the optimizer on
            `optimizer_parameters()`).
    """
    wanted = {id(p) for p in targets}
    sliced = {id(p): t for p, t in zip(full, targets) if t is not p}
    own = {id(p) for p in full}
    whole, foreign = [], []
    for p in optimizer.parameters:
        if id(p) in wanted:
            continue
        if id(p) in sliced:
            whole.append((p, sliced[id(p)]))
        elif id(p) not in own:
            foreign.append(p)
    if whole:
        p, t = whole[0]
        raise ValueError(
            f"{where}: the optimizer was built on the model's full parameters, but "
            f"optimizer_state={optimizer_state!r} (ZeRO-1) has this process update only its "
            f"slice of {len(whole)} of them ({p.name!r}: shape {tuple(p.shape)} here, its slice "
            f"{tuple(t.shape)}); its states would stay full size. Build the optimizer on the parallel "
            f"model's optimizer_parameters(), e.g. nn.Adam(parallel_model.optimizer_parameters(), "
            f"learning_rate=...)")
    if foreign and (where != "report" or len(foreign) == len(optimizer.parameters)):
        raise ValueError(
            f"{where}: the optimizer updates {len(foreign)} Parameter(s) that are not this model's "
            f"(first: {foreign[0].name!r}, shape {tuple(foreign[0].shape)}); build it on the parallel "
            f"model's optimizer_parameters(), e.g. nn.Adam(parallel_model.optimizer_parameters(), "
            f"learning_rate=...)")


def optimizer_gradients(optimizer, gradients: Mapping[int, object], allowed: Optional[Collection[int]] = None,
                        missing: Optional[Callable] = None, where: str = "train_step") -> tuple:
    """The gradients to hand `optimizer`, in the order of its Parameters.

    Args:
        optimizer: the optimizer of the step.
        gradients: id of a Parameter the optimizer may update -> its gradient.
        allowed: ids of the Parameters the optimizer may update (`optimizer_parameters()`);
            None: those of `gradients`.
        missing: Parameter -> its gradient, for an allowed Parameter without one in `gradients`
            (e.g. zeros for another process's stage); None: such a Parameter is refused.
        where: the caller, the message's first word.

    Raises:
        ValueError: the optimizer updates a Parameter outside `optimizer_parameters()` (named,
            with the fix).
    """
    out = []
    for p in optimizer.parameters:
        g = gradients.get(id(p))
        if (allowed is not None and id(p) not in allowed) or (g is None and missing is None):
            raise ValueError(f"{where}: the optimizer updates {p.name!r}, which is not in this process's "
                             f"optimizer_parameters(); build it as nn.Adam(model.optimizer_parameters(), ...)")
        out.append(g if g is not None else missing(p))
    return tuple(out)
