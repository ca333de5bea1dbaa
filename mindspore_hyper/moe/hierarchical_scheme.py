"""The hierarchical (two-level) dispatch, `MoE(dispatch="hierarchical")`: each row goes once to
every destination group holding one of its experts (to the peer, with the row's gates for that
group's experts), then inside the group to its experts' devices; combine reverses the hops, the
peer weighting and summing a group's copies so one row per (token, group) returns to the source
(`hierarchical` holds the groups and `group_rows`, the first hop's plan). Each hop is planned as
data (row counts per member and expert slot, the first hop's 1-bit routing masks, from which the
peer plans the second) and run by one code path on the mode's exchange: in simulation the
segments change hands in process; under msrun both hops are uneven AllToAlls of the expert
group's communicator (`exchange.ProcessExchange`), run in line."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import numpy as np
from mindspore import Tensor, ops

from mindspore_hyper.moe.dispatch_scheme import DispatchScheme
from mindspore_hyper.moe.expert_state import Key, State
from mindspore_hyper.moe.hierarchical import group_rows
from mindspore_hyper.moe.routing_bits import pack_routing, packed_routing_bytes, unpack_routing

__all__ = ["HierarchicalScheme"]


def _copy_gates(plan, gates: Tensor, expert: int) -> Tensor:
    """The gates of expert `expert`'s copies, in the plan's token order (differentiable)."""
    flat = plan.tokens[expert] * gates.shape[1] + plan.slots[expert]
    return ops.gather(gates.reshape(-1), Tensor(flat.astype(np.int32)), 0)


def _sum_rows(rows: List[Tensor], positions: List[np.ndarray], num: int) -> Tensor:
    """`rows` added into `num` rows at `positions` (differentiable)."""
    return ops.unsorted_segment_sum(ops.concat(rows, 0) if len(rows) > 1 else rows[0],
                                    Tensor(np.concatenate(positions).astype(np.int32)), num)


@dataclass
class TwoHops:
    """What the dispatch's hops leave for the combine, per token key: the row counts of both hops
    (send and receive, [members, slots]) and, as the peer, the sources' rows per group-local
    expert and the gates that came with them."""

    counts1: Dict[Key, np.ndarray]
    recv1: Dict[Key, np.ndarray]
    counts2: Dict[Key, np.ndarray]
    recv2: Dict[Key, np.ndarray]
    positions: Dict[Key, Dict[int, Dict[int, np.ndarray]]]  # source member -> group-local expert -> rows
    gates: Dict[Key, Dict[int, Tensor]]  # source member -> its rows' gates [rows, experts in the group]


class HierarchicalScheme(DispatchScheme):
    """Two hops each way: between the link groups once per (token, group), then inside the group
    (see module docstring). Needs more than one member in the expert group."""

    models_histograms = False  # its hops assume the balanced routing's symmetric members in a dry run

    def start_dispatch(self, state: State, tokens: Dict[Key, Tensor], background: bool) -> None:
        """Hop 1: each source's tokens once to the peer of every group holding one of their
        experts, with their gates for that group's experts and, as metadata, the row counts and
        the routing masks. Hop 2: each peer sends the rows to its group's experts' members."""
        ex, axes = state.weights[0].execution, state.axes
        if axes.local(ex):
            from mindspore_hyper.context import get_context

            if get_context("sim_collectives") == "library":
                raise NotImplementedError("MoE dispatch='hierarchical' hands rows over in process; "
                                          "sim_collectives='library' moves only the flat dispatch")
        exchange = state.exchange = self.exchange(ex, axes)
        state.groups = self.link_groups(ex, axes)
        meta = self.recorder(ex, axes, "metadata")
        hidden, in_group = self.engine.moe.hidden, state.groups.size * axes.per_member
        counts1, sends1, masks = self._first_hop(state, tokens)
        recv1 = exchange.exchange_counts(counts1, meta)
        got_masks = exchange.exchange_bytes(masks, meta)
        for key, recv in recv1.items():
            got = [int(got_masks[key].get(exchange.address(key, m), np.zeros(0)).size) for m in range(axes.members)]
            expect = [packed_routing_bytes(int(recv[m, 0]), in_group) for m in range(axes.members)]
            if got != expect:
                raise RuntimeError(f"hierarchical dispatch: received {got} mask bytes per member, expected {expect}")
        wide = self._run_hop(state, "dispatch", sends1, counts1, recv1, width=hidden + in_group)
        counts2, sends2, positions, gates = self._second_hop(state, recv1, wide, got_masks)
        recv2 = exchange.exchange_counts(counts2, meta)
        rows2 = self._run_hop(state, "dispatch", sends2, counts2, recv2)
        state.hops = TwoHops(counts1, recv1, counts2, recv2, positions, gates)
        state.chain = exchange.last_output
        state.pending = self._received(state, rows2)

    def _first_hop(self, state: State, tokens: Dict[Key, Tensor]):
        """The first hop's plan: per source key (as `state.group_sends`) its `GroupRows`, the row
        counts to each peer [members, 1], the rows with their gates for the group's experts
        (columns H..; differentiable: the router's gradient comes back through this exchange) and
        the packed token x expert masks of the group's experts."""
        ex, axes, exchange, groups = state.weights[0].execution, state.axes, state.exchange, state.groups
        per, dtype = axes.per_member, state.weights[0].dtype
        in_group = groups.size * per
        state.group_sends = {}
        counts, sends, masks = {}, {}, {}
        for key, plan in state.plans.items():
            me, gates = axes.member(ex, key), state.gates[key]
            state.group_sends[key] = group_rows(plan.tokens, groups, per)
            counts[key] = np.zeros((axes.members, 1), dtype=np.int64)
            sends[key], masks[key] = {}, {}
            for send in state.group_sends[key]:
                peer = exchange.address(key, groups.peer(me, send.group))
                counts[key][groups.peer(me, send.group), 0] = len(send.tokens)
                mask = np.zeros((len(send.tokens), in_group), dtype=bool)
                first_expert = groups.members_of(send.group).start * per
                cells, values = [], []
                for e, pos in send.positions.items():
                    mask[pos, e - first_expert] = True
                    cells.append(pos * in_group + (e - first_expert))
                    values.append(_copy_gates(plan, gates, e))
                gate_matrix = _sum_rows(values, cells, len(send.tokens) * in_group)
                sends[key][peer] = {0: ops.concat([ops.gather(tokens[key], Tensor(send.tokens.astype(np.int32)), 0),
                                                   gate_matrix.astype(dtype).reshape(len(send.tokens), in_group)], 1)}
                masks[key][peer] = pack_routing(mask)
        return counts, sends, masks

    def _second_hop(self, state: State, recv1: Dict[Key, np.ndarray], wide: Dict[Key, dict],
                    got_masks: Dict[Key, dict]):
        """The second hop's plan, as each peer makes it from what the first brought (the sources'
        masks): row counts to each member's slots [members, members x slots] (source-major), the
        rows, and for the combine each source's rows per group-local expert and their gates."""
        ex, axes, exchange, groups = state.weights[0].execution, state.axes, state.exchange, state.groups
        per, members, hidden = axes.per_member, axes.members, self.engine.moe.hidden
        in_group = groups.size * per
        rows1, gates = {}, {}
        for key in state.plans:
            rows1[key], gates[key] = {}, {}
            for src in range(members):
                if int(recv1[key][src, 0]):
                    row = wide[key][exchange.address(key, src)][0]
                    rows1[key][src] = row[:, :hidden]
                    gates[key][src] = row[:, hidden:]
        counts, sends, positions = {}, {}, {}
        for key in state.plans:
            first_expert = groups.members_of(groups.group_of(axes.member(ex, key))).start * per
            counts[key] = np.zeros((members, members * per), dtype=np.int64)
            sends[key], positions[key] = {}, {}
            for src in range(members):
                n = int(recv1[key][src, 0])
                if not n:
                    continue
                mask = unpack_routing(got_masks[key][exchange.address(key, src)], n, in_group)
                for j in range(in_group):
                    pos = np.nonzero(mask[:, j])[0]
                    if not len(pos):
                        continue
                    member, slot = divmod(first_expert + j, per)
                    positions[key].setdefault(src, {})[j] = pos
                    counts[key][member, src * per + slot] = len(pos)
                    sends[key].setdefault(exchange.address(key, member), {})[src * per + slot] = \
                        ops.gather(rows1[key][src], Tensor(pos.astype(np.int32)), 0)
        return counts, sends, positions, gates

    def _received(self, state: State, rows2: Dict[Key, dict]) -> Dict[Key, dict]:
        """received[dest key][source address][slot] from the second hop's rows (dest keys group
        by group, as the experts run them)."""
        ex, axes, exchange, groups = state.weights[0].execution, state.axes, state.exchange, state.groups
        per, members = axes.per_member, axes.members
        received = {}
        for dest in dict.fromkeys(axes.key_of_member(ex, key, m) for key in state.plans for m in range(members)):
            if dest not in state.plans:
                continue
            my_group = groups.group_of(axes.member(ex, dest))
            by_peer = rows2.get(dest, {})  # in process: nothing from any peer, no entry
            received[dest] = {exchange.address(dest, src): {
                slot: by_peer.get(exchange.address(dest, groups.peer(src, my_group)), {}).get(src * per + slot)
                for slot in range(per)} for src in range(members)}
        return received

    def _run_hop(self, state: State, what: str, sends, send_counts, recv_counts, width=None) -> Dict[Key, dict]:
        """One hop's exchange, in line; its bytes go to the link levels of `what`."""
        state.exchange.start(sends, send_counts, recv_counts, state.weights[0].dtype, width=width)
        received = state.exchange.finish()
        self.count_sends(state, what, sends)
        return received

    def start_combine(self, state: State, outputs: Dict[Key, dict], background: bool) -> None:
        """Expert outputs back member -> peer (one row per copy); the peer weights them by the
        gates that came with the rows and sends one row per (token, group) to the source."""
        ex, axes, exchange, groups, hops = state.weights[0].execution, state.axes, state.exchange, state.groups, \
            state.hops
        per = axes.per_member
        # reverse hop 2: to the peer that forwarded each source's copies
        sends2 = {}
        for key, by_src in outputs.items():
            my_group = groups.group_of(axes.member(ex, key))
            sends2[key] = {}
            for src, outs in by_src.items():
                peer = exchange.address(key, groups.peer(exchange.member_of(src), my_group))
                for slot, t in outs.items():
                    if t is not None:
                        sends2[key].setdefault(peer, {})[exchange.member_of(src) * per + slot] = t
        back2 = self._run_hop(state, "combine", sends2, hops.recv2, hops.counts2)
        # the forwarding device weights each source's copies by their gates and sums them per token
        sends1 = {}
        for key in state.plans:
            first_expert = groups.members_of(groups.group_of(axes.member(ex, key))).start * per
            sends1[key] = {}
            for src, by_expert in hops.positions[key].items():
                weighted, rows_of = [], []
                for j, pos in by_expert.items():
                    member, slot = divmod(first_expert + j, per)
                    gate = ops.gather(hops.gates[key][src][:, j], Tensor(pos.astype(np.int32)), 0)
                    weighted.append(back2[key][exchange.address(key, member)][src * per + slot] * gate.reshape(-1, 1))
                    rows_of.append(pos)
                summed = _sum_rows(weighted, rows_of, int(hops.recv1[key][src, 0]))
                sends1[key][exchange.address(key, src)] = {0: summed}
        # reverse hop 1: one row per (token, group) back to its source
        back1 = self._run_hop(state, "combine", sends1, hops.recv1, hops.counts1)
        state.chain = exchange.last_output
        state.pending = {}
        for key in state.plans:
            me = axes.member(ex, key)
            state.pending[key] = [(send.tokens, back1[key][exchange.address(key, groups.peer(me, send.group))][0])
                                  for send in state.group_sends[key]]

    def receive_combine(self, state: State) -> Dict[Key, Tensor]:
        """Per source key, its groups' rows (already weighted and summed) added per token."""
        shards = {}
        dtype = state.weights[0].dtype
        for key, plan in state.plans.items():
            parts = state.pending[key]
            shards[key] = ops.zeros((plan.num_tokens, self.engine.moe.hidden), dtype) if not parts else \
                _sum_rows([r for _, r in parts], [t for t, _ in parts], plan.num_tokens)
        return shards
