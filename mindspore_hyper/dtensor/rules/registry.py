"""Registry of sharding rules: op name -> rule(call) -> Decision (or None to fall back)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["Decision", "RULES", "UNEVEN", "register", "accepts_uneven"]


@dataclass
class Decision:
    """What a rule decided for one call.

    inputs: the layout each tensor input must have (aligned with `OpCall.tensors`).
    outputs: the layout of each tensor output (one layout for all, a list, or None = replicated).
    local_args: optional (local_inputs, coords) -> local_inputs, e.g. a reshape's local shape.
    local_fn: optional (call, local_inputs, coords) -> output, replacing the op per shard.
    batch_fn: optional (call, local_inputs, batch) -> output: what `local_fn` computes, for all
        shards at once on stacked operands (`dtensor.batched.Batch`); without it a `local_fn`
        op runs per shard.
    """

    inputs: List[TensorLayout]
    outputs: Union[None, TensorLayout, Sequence[TensorLayout]]
    local_args: Optional[Callable[[List[Any], Dict[int, int]], List[Any]]] = None
    local_fn: Optional[Callable[[Any, List[Any], Dict[int, int]], Any]] = None
    batch_fn: Optional[Callable[[Any, List[Any], Any], Any]] = None


RULES: Dict[str, Callable] = {}


def register(*names: str):
    """Register a rule for one or more MindSpore op names (as `func.name` reports them)."""
    def wrap(rule):
        for name in names:
            if name in RULES:
                raise ValueError(f"a sharding rule for {name!r} is already registered")
            RULES[name] = rule
        return rule
    return wrap


# Rules whose decisions stay right on uneven shards (torch.chunk pieces, `shard.chunking`):
# rule -> a check (call, decision) -> None, or the reason it cannot run this call on them. An op
# whose rule is not here and keeps an uneven dimension split is refused by the dispatcher.
UNEVEN: Dict[Callable, Callable[[Any, Decision], Optional[str]]] = {}


def accepts_uneven(check: Optional[Callable[[Any, Decision], Optional[str]]] = None):
    """Mark a rule as right on uneven shards: each device runs the op on its own piece and the
    pieces line up across operands (elementwise, per-dimension, matmul rows). `check` refuses
    particular calls by returning the reason."""
    def wrap(rule):
        UNEVEN[rule] = check or (lambda call, decision: None)
        return rule
    return wrap
