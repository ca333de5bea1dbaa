"""Two-level (hierarchical) expert dispatch: first to the destination group, then inside it.

The expert-parallel devices of one expert group (the members of the expert mesh axes, in member
order) are partitioned into `G` contiguous *link groups* of equal size (`ExpertGroups`): by
default the topology's nodes (`comm.topology.Topology.node_of`), or `MoE(expert_groups=G)`.
A hierarchical dispatch sends a token's row

1. once to each destination group holding one of its experts (to the *peer*: the member of that
   group with the sender's index inside its own group; no hop when the group is the sender's own),
   however many of that group's experts the token chose, with the token's gates for that group's
   experts -- the inter-group hop, de-duplicated;
2. from the peer to each expert's member inside the group, one row per (token, expert) copy --
   the intra-group hop.

Combine reverses the hops: each member returns its copies to the peer (one row per copy); the
peer weights them by the gates that came with the rows and sums them per token, and sends one
row per (token, group) back to the source, which adds them. Results and gradients (the gates'
too, through the first hop) equal the flat dispatch. `group_rows` is the plan of step 1 (data,
no tensors); `ExpertGroups.level` names the link level a transfer uses, for the measured bytes per level.
The exchanges themselves run in `hierarchical_scheme.HierarchicalScheme` (in process in
simulation; under msrun as uneven AllToAlls of the expert group's communicator).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

__all__ = ["ExpertGroups", "GroupRows", "group_rows", "level_bytes", "empty_levels", "LEVELS"]

LEVELS = ("local", "intra_group", "inter_group")


@dataclass(frozen=True)
class ExpertGroups:
    """`members` expert-parallel devices in `num_groups` contiguous groups of equal size."""

    members: int
    num_groups: int

    def __post_init__(self):
        if not isinstance(self.num_groups, int) or self.num_groups < 1 or self.members % self.num_groups:
            raise ValueError(f"expert_groups={self.num_groups!r} must be a positive integer dividing the "
                             f"{self.members} devices of the expert axes")

    @property
    def size(self) -> int:
        """Members per group."""
        return self.members // self.num_groups

    def group_of(self, member: int) -> int:
        return member // self.size

    def members_of(self, group: int) -> range:
        return range(group * self.size, (group + 1) * self.size)

    def peer(self, member: int, group: int) -> int:
        """The member of `group` that receives `member`'s rows for that group (same index inside it)."""
        return group * self.size + member % self.size

    def level(self, src: int, dst: int) -> str:
        """The link level a transfer from member `src` to member `dst` uses."""
        if src == dst:
            return "local"
        return "intra_group" if self.group_of(src) == self.group_of(dst) else "inter_group"

    @classmethod
    def from_topology(cls, topology, ranks: Sequence[int]) -> "ExpertGroups":
        """The topology's nodes over the expert group's global `ranks` (member order).

        Raises:
            ValueError: the nodes do not cut the members into contiguous groups of equal size.
        """
        if max(ranks) >= topology.num_devices:
            raise ValueError(f"expert_groups=None: topology {topology.name!r} has {topology.num_devices} devices, "
                             f"fewer than the mesh's (rank {max(ranks)}); pass MoE(expert_groups=G)")
        nodes = [topology.node_of(int(r)) for r in ranks]
        starts = [i for i in range(len(nodes)) if i == 0 or nodes[i] != nodes[i - 1]]
        sizes = np.diff(starts + [len(nodes)])
        if len(set(nodes)) != len(starts) or len(set(sizes.tolist())) != 1:
            raise ValueError(f"expert_groups=None: topology {topology.name!r} puts the expert-parallel devices "
                             f"{list(ranks)} on nodes {nodes}, not contiguous groups of equal size; pass "
                             f"MoE(expert_groups=G)")
        return cls(len(nodes), len(starts))


@dataclass(frozen=True)
class GroupRows:
    """What one source sends to one destination group in the inter-group hop.

    Attributes:
        group: the destination group.
        tokens: the source's token indices sent (ascending, each once).
        positions: expert id -> the rows of `tokens` that expert receives (its plan's tokens, in order).
    """

    group: int
    tokens: np.ndarray
    positions: Dict[int, np.ndarray]


def group_rows(expert_tokens: Sequence[np.ndarray], groups: ExpertGroups, per_member: int) -> List[GroupRows]:
    """The inter-group sends of one source: per group with at least one copy, its tokens once.

    Args:
        expert_tokens: per (physical) expert, the ascending token indices routed to it
            (`DispatchPlan.tokens`); expert e is on member e // per_member.
        groups: the link groups.
        per_member: experts per member.
    """
    out = []
    for g in range(groups.num_groups):
        experts = range(groups.members_of(g).start * per_member, groups.members_of(g).stop * per_member)
        lists = [np.asarray(expert_tokens[e]) for e in experts]
        if not any(len(t) for t in lists):
            continue
        tokens = np.unique(np.concatenate(lists))
        out.append(GroupRows(g, tokens, {e: np.searchsorted(tokens, t) for e, t in zip(experts, lists) if len(t)}))
    return out


def empty_levels() -> Dict[str, int]:
    """{level: 0} for every link level."""
    return dict.fromkeys(LEVELS, 0)


def level_bytes(pairs: Sequence[Tuple[int, int, int]], groups: ExpertGroups) -> Dict[str, int]:
    """Bytes per link level of transfers (src member, dst member, bytes)."""
    out = empty_levels()
    for src, dst, n in pairs:
        out[groups.level(src, dst)] += int(n)
    return out
