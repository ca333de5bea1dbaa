"""Dispatch plans: which token copies go to which expert, as data, and their per-microbatch store.

A `DispatchPlan` is computed from the router's top-k choice of T tokens (numpy, no gradient):
for every expert, the tokens it receives (ascending) and which of the token's k choices each
copy is. With a capacity, an expert keeps at most `capacity` copies; first choices have
priority over second choices, and earlier tokens over later ones (GShard's order); the other
copies are dropped (they add nothing to their token's output). Without one (dropless) every
copy is kept.

Everything a dispatch leaves for its combine lives in `DispatchStates`, keyed by microbatch
(and chunk): dispatching a second microbatch before the first is combined cannot overwrite it,
which is what interleaved pipeline schedules need.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Hashable, List, Optional

import numpy as np

__all__ = ["DispatchPlan", "plan_dispatch", "expert_capacity", "DispatchStates"]


def expert_capacity(num_tokens: int, num_experts: int, top_k: int, capacity_factor: Optional[float]) -> Optional[int]:
    """ceil(capacity_factor * T * k / E) copies per expert, or None (dropless) when no factor.

    Raises:
        ValueError: a capacity factor that is not positive.
    """
    if capacity_factor is None:
        return None
    if capacity_factor <= 0:
        raise ValueError(f"capacity_factor={capacity_factor} must be > 0 (or None for dropless routing)")
    return max(1, math.ceil(capacity_factor * num_tokens * top_k / num_experts))


@dataclass(frozen=True)
class DispatchPlan:
    """Where each token copy goes (see module docstring).

    Attributes:
        num_tokens: T.
        num_experts: E.
        tokens: per expert, the int64 token indices it receives, ascending.
        slots: per expert, which of the token's k choices each copy is (same length).
        choice_counts: [E] copies each expert was chosen for, before capacity dropping.
    """

    num_tokens: int
    num_experts: int
    tokens: List[np.ndarray]
    slots: List[np.ndarray]
    choice_counts: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        """[E] kept copies per expert."""
        return np.array([len(t) for t in self.tokens], dtype=np.int64)

    @property
    def dropped(self) -> int:
        return int(self.choice_counts.sum() - self.counts.sum())

    def mask(self) -> np.ndarray:
        """[T, E] bool: token t sends a (kept) copy to expert e. Together with the token order
        within an expert, this mask alone says which rows an expert receives."""
        out = np.zeros((self.num_tokens, self.num_experts), dtype=bool)
        for e, toks in enumerate(self.tokens):
            out[toks, e] = True
        return out

    def chunk(self, start: int, stop: int) -> "DispatchPlan":
        """The copies of tokens start..stop-1, renumbered from 0 (choice counts: the kept ones)."""
        tokens, slots = [], []
        for toks, sl in zip(self.tokens, self.slots):
            sel = (toks >= start) & (toks < stop)
            tokens.append(toks[sel] - start)
            slots.append(sl[sel])
        counts = np.array([len(t) for t in tokens], dtype=np.int64)
        return DispatchPlan(stop - start, self.num_experts, tokens, slots, counts)

    def validate(self) -> None:
        """Raises ValueError unless every copy is a distinct (token, expert) pair in range."""
        if len(self.tokens) != self.num_experts or len(self.slots) != self.num_experts:
            raise ValueError(f"DispatchPlan: {len(self.tokens)} token lists for {self.num_experts} experts")
        for e, (toks, slots) in enumerate(zip(self.tokens, self.slots)):
            if len(toks) != len(slots) or (len(toks) and (toks.min() < 0 or toks.max() >= self.num_tokens)):
                raise ValueError(f"DispatchPlan: expert {e} has token indices out of range 0..{self.num_tokens - 1}")
            if np.any(np.diff(toks) <= 0):
                raise ValueError(f"DispatchPlan: expert {e}'s tokens are not strictly ascending")


def plan_dispatch(experts: np.ndarray, num_experts: int, capacity: Optional[int] = None) -> DispatchPlan:
    """The plan of top-k choices `experts` [T, k] (int expert ids) over `num_experts` experts.

    Raises:
        ValueError: ids out of range, a token choosing one expert twice, or capacity < 1.
    """
    experts = np.asarray(experts)
    if experts.ndim != 2:
        raise ValueError(f"plan_dispatch: experts must be [tokens, k], got shape {experts.shape}")
    if experts.size and (experts.min() < 0 or experts.max() >= num_experts):
        raise ValueError(f"plan_dispatch: expert ids must be in 0..{num_experts - 1}")
    if capacity is not None and capacity < 1:
        raise ValueError(f"plan_dispatch: capacity={capacity} must be >= 1")
    num_tokens, top_k = experts.shape
    sorted_rows = np.sort(experts, axis=1)
    if top_k > 1 and np.any(sorted_rows[:, 1:] == sorted_rows[:, :-1]):
        raise ValueError("plan_dispatch: a token chooses the same expert twice")
    choice_counts = np.bincount(experts.ravel(), minlength=num_experts).astype(np.int64)
    kept = np.ones_like(experts, dtype=bool)
    if capacity is not None:
        used = np.zeros(num_experts, dtype=np.int64)
        for slot in range(top_k):  # first choices first, then earlier tokens first
            for t in range(num_tokens):
                e = experts[t, slot]
                kept[t, slot] = used[e] < capacity
                used[e] += kept[t, slot]
    token_ids = np.repeat(np.arange(num_tokens, dtype=np.int64), top_k)
    slot_ids = np.tile(np.arange(top_k, dtype=np.int64), num_tokens)
    flat_e, flat_kept = experts.ravel(), kept.ravel()
    tokens, slots = [], []
    for e in range(num_experts):
        sel = np.nonzero((flat_e == e) & flat_kept)[0]  # ascending token order
        tokens.append(token_ids[sel])
        slots.append(slot_ids[sel])
    return DispatchPlan(num_tokens, num_experts, tokens, slots, choice_counts)


@dataclass
class DispatchStates:
    """What dispatches leave for their combines, keyed by microbatch (or (microbatch, chunk))."""

    _states: Dict[Hashable, Any] = field(default_factory=dict)

    def put(self, key: Hashable, state: Any) -> None:
        """Raises:
            RuntimeError: `key` was dispatched and not combined yet."""
        if key in self._states:
            raise RuntimeError(f"microbatch {key!r} dispatched again before its combine")
        self._states[key] = state

    def pop(self, key: Hashable) -> Any:
        """Raises:
            RuntimeError: no dispatch of `key` is waiting."""
        if key not in self._states:
            raise RuntimeError(f"combine of microbatch {key!r} without a dispatch (waiting: {sorted(map(repr, self._states))})")
        return self._states.pop(key)

    def peek(self, key: Hashable) -> Any:
        """The state of `key`, kept.

        Raises:
            RuntimeError: no dispatch of `key` is waiting."""
        if key not in self._states:
            raise RuntimeError(f"microbatch {key!r} has no dispatch waiting (waiting: {sorted(map(repr, self._states))})")
        return self._states[key]

    def pending(self) -> List[Hashable]:
        return list(self._states)
