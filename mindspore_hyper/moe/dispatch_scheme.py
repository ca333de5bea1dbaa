"""How an expert-parallel call moves its rows: the interface of a dispatch scheme
(`flat_scheme.FlatScheme`, `hierarchical_scheme.HierarchicalScheme`) and what both share --
the exchange for the mode, the byte recorders, the link groups and the bytes per link level. A
scheme plans its hops as data and runs them on `exchange` (in process in simulation, the
communication library's all-to-all under msrun) by one code path; the engine
(`expert_parallel.ExpertParallel`) keeps the forward, the background thread and `last_stats`."""
from __future__ import annotations

from typing import Dict

from mindspore import Tensor

from mindspore_hyper.comm.inprocess_collectives import nbytes_of
from mindspore_hyper.moe.exchange import InProcessExchange, LibraryExchange, ProcessExchange
from mindspore_hyper.moe.expert_state import Axes, Key, State
from mindspore_hyper.moe.hierarchical import ExpertGroups, empty_levels, level_bytes

__all__ = ["DispatchScheme"]



# (expert ranks, mesh size, topology flag, dispatch) -> the link groups: building a large topology
# takes seconds, and every MoE layer of a model asks for the same groups
_TOPOLOGY_GROUPS: Dict[tuple, ExpertGroups] = {}

class DispatchScheme:
    """One way of dispatching rows to their experts and combining them back.

    A dispatch starts (`start_dispatch`: sends begin, possibly on the engine's background thread)
    and is received (`receive_dispatch`); the combine likewise. What travels between the steps is
    kept in the microbatch's `State`.

    Args:
        engine: the layer's `ExpertParallel` (its `moe`, `last_stats`, `run_exchange` and `wait_exchange`).
    """

    # whether the dry run's one-member exchange (`shape_exchange.ShapeExchange`) models this scheme
    # under a skewed routing histogram (members with unequal loads)
    models_histograms = True

    def __init__(self, engine):
        self.engine = engine

    # -- the steps ---------------------------------------------------------------------------------
    def start_dispatch(self, state: State, tokens: Dict[Key, Tensor], background: bool) -> None:
        """Start sending every device's chunk `tokens` [rows, H] to its experts (`state.plans`)."""
        raise NotImplementedError

    def receive_dispatch(self, state: State) -> Dict[Key, dict]:
        """received[dest key][source][slot] -> rows (what `start_dispatch` left in `state.pending`)."""
        received, state.pending = state.pending, None
        return received

    def start_combine(self, state: State, outputs: Dict[Key, dict], background: bool) -> None:
        """Start sending the expert outputs[dest key][source][slot] back to their tokens' devices."""
        raise NotImplementedError

    def receive_combine(self, state: State) -> Dict[Key, Tensor]:
        """Each device's chunk output [rows, H]: the gate-weighted sums of its tokens' copies."""
        raise NotImplementedError

    # -- shared -------------------------------------------------------------------------------------
    def recorder(self, ex, axes: Axes, what: str):
        """`record(nbytes)`: adds to `last_stats[what]` and reports an AllToAll over the expert axes
        (none without expert axes: each device keeps its own rows)."""
        name = "+".join(ex.mesh.alias_names[a] for a in axes.expert)
        engine = self.engine
        cause = f"MoE dispatch/combine ({'token rows' if what == 'rows' else what})"  # sends may run on a thread

        def record(nbytes: int) -> None:
            engine.last_stats[what] = engine.last_stats.get(what, 0) + int(nbytes)
            if name:
                ex.accounting.record_comm("AllToAll", name, int(nbytes), int(nbytes), cause=cause)

        return record

    def record_members(self, ex, axes: Axes, amounts: Dict[tuple, int]) -> None:
        """Rows' bytes sent that differ per expert member (ranks -> bytes, `member_loads`): added
        to `last_stats["rows"]` (the representative's, the lowest rank's) and reported as an
        AllToAll over the expert axes, each program its own."""
        name = "+".join(ex.mesh.alias_names[a] for a in axes.expert)
        first = min(min(ranks) for ranks in amounts)
        self.engine.last_stats["rows"] = self.engine.last_stats.get("rows", 0) + next(
            n for ranks, n in amounts.items() if first in ranks)
        ex.accounting.record_comm_by_ranks("AllToAll", name, amounts, cause="MoE dispatch/combine (token rows)")

    def exchange(self, ex, axes: Axes, record: bool = True):
        """The exchange for the mode (rows recorded as "rows", unless not `record`: the scheme
        records them per member): in simulation `InProcessExchange` (`LibraryExchange` with
        `sim_collectives="library"`), under msrun the `ProcessExchange` of this process's expert
        group."""
        if ex.shape_only:  # a dry run: shapes, one member, the assumed routing's symmetry
            from mindspore_hyper.context import get_context
            from mindspore_hyper.moe.shape_exchange import ShapeExchange

            if not self.models_histograms and isinstance(get_context("moe_routing"), tuple):
                raise NotImplementedError(
                    f"dry run: MoE(dispatch={self.engine.moe.dispatch!r}) under a moe_routing histogram is not "
                    "modelled (its hops need every member's unequal loads; the dry run holds one member): use "
                    "dispatch='flat' or moe_routing='balanced' in the dry run, or run the job in simulation")
            return ShapeExchange(ex, axes, self.recorder(ex, axes, "rows") if record else None)
        if not axes.local(ex):
            return self.process_exchange(ex, ex.keys(axes.token)[0], axes)
        from mindspore_hyper.context import get_context

        recorder = self.recorder(ex, axes, "rows") if record else None
        if get_context("sim_collectives") == "library":
            return LibraryExchange(ex, axes, self.engine.moe.hidden, recorder)
        return InProcessExchange(ex, axes, recorder)

    def process_exchange(self, ex, key: Key, axes: Axes) -> ProcessExchange:
        """The exchange of this process's expert group under msrun (rows recorded as "rows")."""
        group = ex.group(axes.expert, dict(zip(axes.token, key)))
        comm = ex.collectives.communicator(group)
        if not hasattr(comm, "all_to_all_v"):
            raise RuntimeError("MoE expert parallel under msrun needs the communication library's uneven all-to-all "
                               "(dist_transport='shm'); the configured transport has none")
        return ProcessExchange(comm, group.local[0], group.size, self.engine.moe.hidden,
                               self.recorder(ex, axes, "rows"))

    def link_groups(self, ex, axes: Axes) -> ExpertGroups:
        """The link groups of the expert-parallel devices: `moe.expert_groups`, else the topology's
        nodes (for a flat dispatch whose devices the nodes do not cut evenly: one group).

        Raises:
            ValueError: `expert_groups` does not divide the expert devices; the hierarchical
                dispatch without `expert_groups` on a topology whose nodes do not cut them evenly.
        """
        moe = self.engine.moe
        if moe.expert_groups is not None:
            return ExpertGroups(axes.members, moe.expert_groups)
        from mindspore_hyper.comm.topology import load_topology
        from mindspore_hyper.context import get_context

        ranks = tuple(ex.group(axes.expert, {}).ranks)
        key = (ranks, ex.mesh.size, get_context("topology"), moe.dispatch)
        if key not in _TOPOLOGY_GROUPS:  # one topology look-up per layout and flag, for every layer
            try:
                _TOPOLOGY_GROUPS[key] = ExpertGroups.from_topology(load_topology(None, ex.mesh.size), ranks)
            except ValueError:
                if moe.dispatch == "hierarchical":
                    raise
                _TOPOLOGY_GROUPS[key] = ExpertGroups(axes.members, 1)
        return _TOPOLOGY_GROUPS[key]

    def count_sends(self, state: State, what: str, sends) -> None:
        """Add the bytes of the exchange sends[src key][dst address][slot] to the link levels."""
        ex, axes, member_of = state.weights[0].execution, state.axes, state.exchange.member_of
        self.add_levels(state, what, [(axes.member(ex, src), member_of(dst), nbytes_of(t))
                                      for src, by_dst in sends.items() for dst, segs in by_dst.items()
                                      for t in segs.values() if t is not None])

    def add_levels(self, state: State, what: str, pairs) -> None:
        """Add transfers (src member, dst member, bytes) to last_stats[what + "_link_bytes"], over
        the link groups of the state's dispatch."""
        counted = self.engine.last_stats.setdefault(f"{what}_link_bytes", empty_levels())
        for level, n in level_bytes(pairs, state.groups).items():
            counted[level] += n
