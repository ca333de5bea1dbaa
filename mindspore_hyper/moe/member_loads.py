"""Each expert member's loads under a routing assumption, for its own figures in the report.

Under the balanced assumption or a given histogram (`set_context(moe_routing=...)`, and always in
a dry run) every device routes its tokens alike, so one device's dispatch plan gives every
member's: a device sends `rows_to[d]` rows to member d's experts, whoever it is; member m's
experts receive `members x rows_to[m]` rows (one share from every member, itself included) and
send `(members - 1) x rows_to[m]` of them back to the others in the combine. A device's figures
then depend only on its member, so the devices of one member are one program of the report
(`dtensor.accounting.Accounting.for_rank`), computed alike in the dry run and the simulation.
Under learned routing (simulation) every device's loads differ and the figures stay the first
device's; under msrun each process counts its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from mindspore_hyper.context import get_context
from mindspore_hyper.moe.expert_state import Axes
from mindspore_hyper.moe.token_dispatch import DispatchPlan

__all__ = ["MemberLoads"]

_RANKS: Dict[tuple, Tuple[Tuple[int, ...], ...]] = {}  # (mesh shape, expert axes) -> ranks per member


@dataclass(frozen=True)
class MemberLoads:
    """Rows (token copies) per expert member of one call, every device routing alike.

    Attributes:
        rows_to: rows one device sends to each member's experts (member order).
        ranks: per member, the mesh ranks of its devices (every token and tensor coordinate).
        slot_rows: per member, the rows one device sends to each of its local expert slots
            (they sum to `rows_to`).
    """

    rows_to: Tuple[int, ...]
    ranks: Tuple[Tuple[int, ...], ...]
    slot_rows: Tuple[Tuple[int, ...], ...]

    @classmethod
    def of_call(cls, ex, axes: Axes, plan: DispatchPlan) -> Optional["MemberLoads"]:
        """The loads of a call whose devices route alike (`plan`: any device's physical plan), or
        None where they need not (learned routing, msrun: one member per process, one member)."""
        if axes.members == 1 or (not ex.shape_only and (not axes.local(ex) or get_context("moe_routing") == "learned")):
            return None
        per = axes.per_member
        slot_rows = tuple(tuple(len(plan.tokens[m * per + s]) for s in range(per)) for m in range(axes.members))
        return cls(tuple(sum(rows) for rows in slot_rows), _member_ranks(ex, axes), slot_rows)

    @property
    def copies(self) -> int:
        """Rows one device dispatches (to every member, itself included)."""
        return sum(self.rows_to)

    def sent(self, member: int) -> int:
        """Rows member `member`'s devices dispatch to the other members."""
        return self.copies - self.rows_to[member]

    def received(self, member: int) -> int:
        """Rows member `member`'s experts receive (from every member, itself included)."""
        return len(self.rows_to) * self.rows_to[member]

    def received_per_slot(self, member: int) -> Tuple[int, ...]:
        """Rows each of member `member`'s expert slots receives (from every member, itself included)."""
        return tuple(len(self.rows_to) * n for n in self.slot_rows[member])

    def returned(self, member: int) -> int:
        """Rows member `member` sends back to the other members in the combine."""
        return (len(self.rows_to) - 1) * self.rows_to[member]

    def by_ranks(self, amount: Callable[[int], Any]) -> Dict[Tuple[int, ...], Any]:
        """ranks of member m -> amount(m) (bytes, or an expert member's op calls), for
        `Accounting.*_by_ranks`."""
        return {ranks: amount(m) for m, ranks in enumerate(self.ranks)}


def _member_ranks(ex, axes: Axes) -> Tuple[Tuple[int, ...], ...]:
    """Per member index, the ranks of the mesh's devices at that index of their expert group."""
    mesh = ex.mesh
    key = (tuple(mesh.device_matrix), mesh.rank_list, axes.expert)
    if key not in _RANKS:
        by_member = [[] for _ in range(axes.members)]
        for rank in mesh.rank_list:
            coords = mesh.coords(rank)
            by_member[ex.member_index(axes.expert, {a: coords[a] for a in axes.expert})].append(rank)
        _RANKS[key] = tuple(tuple(r) for r in by_member)
    return _RANKS[key]
