"""Gradients and local computation for HyperParallel-API scripts."""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Set, Union

from mindspore import Tensor

from mindspore_hyper.autodiff import value_and_grad
from mindspore_hyper.dtensor import dtensor as dtensor_module
from mindspore_hyper.dtensor.dtensor import DTensor

__all__ = ["parallelize_value_and_grad", "SkipDTensorDispatch"]


def _global(value):
    return value.full_tensor() if isinstance(value, DTensor) and not value.layout.is_rank_local else value


def parallelize_value_and_grad(fn: Callable, weights, sens: Optional[Sequence[float]] = None) -> Callable:
    """`(outputs, gradients of weights)` of `fn`, whose outputs may be DTensors (their global
    values are differentiated; a rank-local output is refused: it has no single value).

    Args:
        fn: a Cell or function.
        weights: the Parameters to differentiate (e.g. `net.trainable_params()`).
        sens: with several outputs, the weight of each in the differentiated sum; None: only
            the first output is differentiated (the others are returned alongside).

    Raises:
        ValueError: `sens` with a single output, or of the wrong length; a rank-local output.
    """
    count = []  # the number of fn's outputs, from the last call

    def outputs_with_aux(*args):
        out = fn(*args)
        values = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        for v in values:
            if isinstance(v, DTensor) and v.layout.is_rank_local:
                raise ValueError("parallelize_value_and_grad: fn returned a rank-local tensor (values differ per "
                                 "device); reduce it to a DTensor with DTensor.from_local(value, mesh, "
                                 "[Partial('avg')]) or return a DTensor")
        values = tuple(_global(v) for v in values)
        count[:] = [len(values)]
        if sens is not None:
            if len(values) == 1 or len(sens) != len(values):
                raise ValueError(f"parallelize_value_and_grad: sens has {len(sens)} entries for {len(values)} "
                                 "outputs (give one per output, and none for a single output)")
            return (sum(v * s for v, s in zip(values, sens)),) + values
        # MindSpore's has_aux needs two outputs at least: a single one gets a placeholder aux
        return values if len(values) > 1 else (values[0], Tensor(0))

    grad_fn = value_and_grad(outputs_with_aux, None, weights, has_aux=True)

    def run(*args):
        outputs, grads = grad_fn(*args)
        outputs = tuple(outputs)
        if sens is not None:
            outputs = outputs[1:]
        elif count[0] == 1:
            outputs = outputs[:1]
        return (outputs[0] if len(outputs) == 1 else outputs), grads

    return run


class SkipDTensorDispatch:
    """Inside the block, ops on DTensors run on their local parts (`to_local()`: under msrun the
    rank's shard, in simulation a rank-local value), except the ops named in `no_skip`.

    Args:
        no_skip: ops (by MindSpore op name, e.g. "ZerosLike", or objects with a `name`) still
            dispatched on DTensors.
    """

    def __init__(self, no_skip: Optional[Set[Union[str, object]]] = None):
        self._names = frozenset(x if isinstance(x, str) else getattr(x, "name", getattr(x, "__name__", repr(x)))
                                for x in (no_skip or ()))

    def __enter__(self) -> "SkipDTensorDispatch":
        dtensor_module.SKIP_DISPATCH.append(self._names)
        return self

    def __exit__(self, *exc) -> None:
        dtensor_module.SKIP_DISPATCH.pop()
