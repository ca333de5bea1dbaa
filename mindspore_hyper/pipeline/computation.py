"""One virtual stage's work on microbatches: forward, full backward, input- and weight-gradient.

MindSpore's PyNative autograd keeps one pending graph at a time (a second `mindspore.vjp`
before the first one's backward fails with "Can not find top cell for backward"), so a stage
cannot hold several microbatches' graphs as a pipeline needs. A forward therefore runs without
recording and keeps only the stage's input; each backward recomputes the stage's forward under
`mindspore.grad` (full activation recomputation, as Megatron-LM's `recompute_granularity=full`).
The input-gradient action differentiates with respect to the input only, the weight-gradient
action with respect to the parameters only, so the split backward does each half's own work and
yields the same gradients as the full one. Auxiliary losses the stage's layers add
(`aux_loss.add_aux_loss`, e.g. an MoE router's) join the objective scaled like the microbatch
loss, so each stage's backward carries their gradient; their values join the step's loss. The
dropout masks a forward draws are kept and replayed by its recomputations (dropout_replay.py),
so the gradients are those of the forward that produced the loss.
"""
from __future__ import annotations

from collections import Counter
from contextlib import nullcontext
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from mindspore import Parameter, Tensor

from mindspore_hyper.autodiff import grad
from mindspore_hyper.dtensor.meta import MetaTensor
from mindspore_hyper.pipeline.aux_loss import AuxLosses
from mindspore_hyper.pipeline.dropout_replay import DropoutReplay

__all__ = ["StageComputation"]


def _value(loss) -> float:
    """A loss's value; NaN for a dry run's shape-only loss (it has none)."""
    return float("nan") if isinstance(loss, MetaTensor) else float(loss.asnumpy())


class StageComputation:
    """Forward and backward pieces of one virtual stage.

    Args:
        run: the stage's forward `run(x, *targets)` (a StageCell, or a parallel model around it).
        params: the stage's trainable Parameters (gradients accumulate per Parameter).
        first: the stage receives the model input (no input gradient is produced).
        last: the stage ends in the loss (its backward is seeded with `loss_scale` times
            `gradient_scale`).
        loss_scale: the factor of a microbatch's loss in the step's loss.
        dropouts: the stage's DropoutReplay (None: the stage has no nn.Dropout).
        grad: `mindspore.grad`'s signature; the runtime's (`Runtime.grad`: a dry run's records the
            backward on shapes).
    """

    def __init__(self, run: Callable, params: Sequence[Parameter], first: bool, last: bool, loss_scale: float,
                 dropouts: Optional[DropoutReplay] = None, grad: Callable = grad):
        self.run, self.params, self.dropouts, self._grad = run, tuple(params), dropouts, grad
        self.first, self.last, self.loss_scale = first, last, loss_scale
        self._inputs: Dict[int, Tuple] = {}  # microbatch -> (x, targets)
        self._pending_dy: Dict[int, Optional[Tensor]] = {}  # microbatch -> output gradient kept for the weight pass
        self.grads: Dict[int, Tensor] = {}  # id(Parameter) -> accumulated gradient
        self.losses: List[float] = []
        self.aux_losses: List[float] = []  # per forward: the stage's auxiliary losses (unscaled)
        self.gradient_scale = 1.0  # the step's loss scale (loss scaling), times every loss in the backward
        self._fns: Dict[str, Callable] = {}

    # -- objective whose gradient is the stage's vector-Jacobian product --------------------------
    def _objective(self, x, dy, *targets):
        with AuxLosses() as aux:
            out = self.run(x, *targets)
        scale = self.loss_scale * self.gradient_scale
        objective = out * scale if self.last else (out * dy).sum()
        if aux:
            objective = objective + aux.total() * scale
        return objective

    def _grad_fn(self, what: str) -> Callable:
        if what not in self._fns:
            position = None if what == "weight" else 0
            weights = None if what == "input" else (list(self.params) or None)
            self._fns[what] = self._grad(self._objective, grad_position=position, weights=weights)
        return self._fns[what]

    # -- actions ----------------------------------------------------------------------------------
    def forward(self, microbatch: int, x, targets: Tuple = ()) -> Tensor:
        """Run the stage on `x`; keep the input for the backward. The last stage returns the loss."""
        self._inputs[microbatch] = (x, tuple(targets))
        with self._replay("record", microbatch), AuxLosses() as aux:
            out = self.run(x, *targets)
        if aux:
            self.aux_losses.append(_value(aux.total()))
        if self.last:
            if not isinstance(out, Tensor) or out.ndim != 0:
                raise ValueError(f"pipeline: the last stage returns {getattr(out, 'shape', type(out).__name__)}, "
                                 f"expected a scalar loss (pass the loss's targets / labels to train_step)")
            self.losses.append(_value(out))
        return out

    def backward(self, microbatch: int, dy: Optional[Tensor]) -> Optional[Tensor]:
        """Input and weight gradients together; returns the input gradient (None on the first stage)."""
        x, targets = self._inputs.pop(microbatch)
        dy = self._seed(dy)
        with self._replay("replay", microbatch):
            if self.first:
                if self.params:
                    self._accumulate(self._grad_fn("weight")(x, dy, *targets))
                dx = None
            elif not self.params:
                dx = self._grad_fn("input")(x, dy, *targets)
            else:
                dx, dws = self._grad_fn("both")(x, dy, *targets)
                self._accumulate(dws)
        self._release(microbatch)
        return dx

    def backward_input(self, microbatch: int, dy: Optional[Tensor]) -> Optional[Tensor]:
        """The input gradient only; the output gradient is kept for `backward_weight`."""
        x, targets = self._inputs[microbatch]
        dy = self._seed(dy)
        self._pending_dy[microbatch] = dy
        if self.first:
            return None
        with self._replay("replay", microbatch):
            return self._grad_fn("input")(x, dy, *targets)

    def backward_weight(self, microbatch: int) -> None:
        """The weight gradient only (accumulated); frees the microbatch's input."""
        x, targets = self._inputs.pop(microbatch)
        dy = self._pending_dy.pop(microbatch)
        if self.params:
            with self._replay("replay", microbatch):
                self._accumulate(self._grad_fn("weight")(x, dy, *targets))
        self._release(microbatch)

    # -- helpers ----------------------------------------------------------------------------------
    def _replay(self, mode: str, microbatch: int):
        """Record the forward's dropout masks, or replay them in a recomputation (no-op without dropout)."""
        if self.dropouts is None or not self.dropouts.count:
            return nullcontext()
        if mode == "record":
            return self.dropouts.recording(microbatch)
        return self.dropouts.replaying(microbatch)

    def _release(self, microbatch: int) -> None:
        if self.dropouts is not None:
            self.dropouts.release(microbatch)

    def _seed(self, dy):
        if self.last:
            return Tensor(np.float32(0.0))  # unused by the loss objective
        if dy is None:
            raise RuntimeError("pipeline: a backward of a non-last stage ran without its output gradient")
        return dy

    def _accumulate(self, dws) -> None:
        if isinstance(dws, Tensor):
            dws = (dws,)
        for param, g in zip(self.params, dws):
            key = id(param)
            self.grads[key] = g if key not in self.grads else self.grads[key] + g

    def live_input_bytes(self) -> int:
        """Bytes of the stage inputs (and dropout masks) kept for backwards (the recomputation's activations)."""
        return sum(size * count for size, count in self.live_input_sizes().items())

    def live_input_sizes(self) -> Counter:
        """Block size (bytes) -> count of the kept stage inputs and dropout masks (`live_input_bytes`)."""
        sizes = self.dropouts.live_sizes() if self.dropouts is not None else Counter()
        sizes.update(int(x.nbytes) for x, _ in self._inputs.values() if isinstance(x, Tensor))
        return sizes

    def reset(self, gradient_scale: float = 1.0) -> None:
        """Start a step: no kept inputs, no gradients, no losses; the backward objectives
        multiplied by `gradient_scale` (a loss scale: the gradients come out scaled by it)."""
        self.gradient_scale = float(gradient_scale)
        self._inputs.clear()
        self._pending_dy.clear()
        if self.dropouts is not None:
            self.dropouts.reset()
        self.grads = {}
        self.losses = []
        self.aux_losses = []
