"""A placement of one MoE layer's experts on its expert-parallel devices: physical expert slots,
each holding a copy of a logical expert (from `eplb.rebalance_experts`).

Slot p lives on expert-group member p // (slots per member). A replica's weights are taken from
its logical expert's weights (differentiably, so the replicas' gradients add up in the logical
expert's gradient); an expert's token copies are dealt round-robin (in token order) to its
replicas. The layer's numbers do not change, only which device computes what.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import numpy as np
from mindspore import Tensor, ops

from mindspore_hyper.moe.token_dispatch import DispatchPlan

__all__ = ["ExpertPlacement", "apply_placement", "member_loads"]


@dataclass(frozen=True)
class ExpertPlacement:
    """Physical slots of one layer (see module docstring).

    Attributes:
        phy2log: [P] logical expert held by each slot.
        num_logical: E.
    """

    phy2log: np.ndarray
    num_logical: int

    def __post_init__(self):
        p = np.asarray(self.phy2log)
        if p.ndim != 1 or p.size == 0 or p.min() < 0 or p.max() >= self.num_logical:
            raise ValueError(f"ExpertPlacement: phy2log must be a 1-D list of expert ids in 0..{self.num_logical - 1}")
        missing = sorted(set(range(self.num_logical)) - set(p.tolist()))
        if missing:
            raise ValueError(f"ExpertPlacement: experts {missing} have no slot")

    @classmethod
    def from_eplb(cls, phy2log: np.ndarray, layer: int = 0) -> "ExpertPlacement":
        """Layer `layer` of `rebalance_experts`'s phy2log [layers, P] (the logical experts are 0..max)."""
        row = np.asarray(phy2log)[layer].astype(np.int64)
        return cls(row, int(row.max()) + 1)

    @property
    def num_physical(self) -> int:
        return int(len(self.phy2log))

    def replicas(self, expert: int) -> np.ndarray:
        return np.nonzero(np.asarray(self.phy2log) == expert)[0]

    def physical_plan(self, plan: DispatchPlan) -> DispatchPlan:
        """`plan` over the logical experts -> the same copies over the physical slots."""
        if plan.num_experts != self.num_logical:
            raise ValueError(f"ExpertPlacement: a plan over {plan.num_experts} experts for a placement of "
                             f"{self.num_logical}")
        tokens = [np.zeros(0, np.int64)] * self.num_physical
        slots = [np.zeros(0, np.int64)] * self.num_physical
        for e in range(self.num_logical):
            reps = self.replicas(e)
            for i, p in enumerate(reps):
                tokens[p], slots[p] = plan.tokens[e][i::len(reps)], plan.slots[e][i::len(reps)]
        counts = np.array([len(t) for t in tokens], dtype=np.int64)
        return DispatchPlan(plan.num_tokens, self.num_physical, tokens, slots, counts)

    def member_weights(self, member: int, per_member: int, experts_weights: Sequence[Tensor]) -> List[Tensor]:
        """Member `member`'s slot weights ([per, ...] each) taken from every logical expert's
        weights ([E, ...] each, e.g. all-gathered over the expert axes); differentiable, so the
        replicas' gradients add up in their expert's."""
        index = Tensor(np.asarray(self.phy2log[member * per_member:(member + 1) * per_member], np.int32))
        return [ops.gather(w, index, 0) for w in experts_weights]


def apply_placement(moe, placement) -> None:
    """Use `placement` (or None: expert e on member e // per) from the next call of `moe` on;
    between steps only (no dispatch may be waiting for its combine).

    Raises:
        RuntimeError: a microbatch is dispatched and not combined.
        ValueError: the placement is for another number of experts.
    """
    engine = moe.parallel()
    if engine.states.pending():
        raise RuntimeError(f"apply_placement: microbatches {engine.states.pending()} are between dispatch and combine")
    if placement is not None and placement.num_logical != moe.num_experts:
        raise ValueError(f"apply_placement: placement for {placement.num_logical} experts, the layer has "
                         f"{moe.num_experts}")
    engine.placement = placement


def member_loads(counts: np.ndarray, placement: ExpertPlacement, members: int) -> np.ndarray:
    """Token copies each of `members` devices computes when expert e receives counts[e] copies,
    split evenly among its replicas (round-robin, as `physical_plan` deals them)."""
    counts = np.asarray(counts, dtype=np.int64)
    per = placement.num_physical // members
    loads = np.zeros(members, dtype=np.int64)
    for e in range(placement.num_logical):
        reps = placement.replicas(e)
        for i, p in enumerate(reps):
            loads[p // per] += len(range(i, counts[e], len(reps)))
    return loads
