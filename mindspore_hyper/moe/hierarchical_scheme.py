"""The hierarchical (two-level) dispatch, `MoE(dispatch="hierarchical")`: each row goes once to
every destination group holding one of its experts (to the peer, with the row's gates for that
group's experts), then inside the group to its experts' devices; combine reverses the hops, the
peer weighting and summing a group's copies so one row per (token, group) returns to the source
(`hierarchical` holds the plan: `ExpertGroups`, `group_rows`). In simulation the segments change
hands in process; under msrun both hops are uneven AllToAlls of the expert group's communicator
(`exchange.ProcessExchange`), run in line."""
from __future__ import annotations

from dataclasses import replace
from typing import Dict, List, Optional

import numpy as np
from mindspore import Tensor, ops

from mindspore_hyper.moe.dispatch_scheme import DispatchScheme
from mindspore_hyper.moe.exchange import _nbytes
from mindspore_hyper.moe.expert_state import Axes, Key, State
from mindspore_hyper.moe.hierarchical import group_rows

__all__ = ["HierarchicalScheme"]


def _copy_gates(plan, gates: Tensor, expert: int) -> Tensor:
    """The gates of expert `expert`'s copies, in the plan's token order (differentiable)."""
    flat = plan.tokens[expert] * gates.shape[1] + plan.slots[expert]
    return ops.gather(gates.reshape(-1), Tensor(flat.astype(np.int32)), 0)


class HierarchicalScheme(DispatchScheme):
    """Two hops each way: between the link groups once per (token, group), then inside the group
    (see module docstring). Needs more than one member in the expert group."""

    def start_dispatch(self, state: State, tokens: Dict[Key, Tensor], background: bool) -> None:
        ex = state.weights[0].execution
        axes = state.axes
        if not axes.local(ex):
            (key,) = state.plans
            state.pending = self._dispatch_process(ex, axes, state, key, tokens[key])
            return
        from mindspore_hyper.context import get_context

        if get_context("sim_collectives") == "library":
            raise NotImplementedError("MoE dispatch='hierarchical' hands rows over in process; "
                                      "sim_collectives='library' moves only the flat dispatch")
        state.pending = self._dispatch_in_process(ex, axes, state, tokens)

    def start_combine(self, state: State, outputs: Dict[Key, dict], background: bool) -> None:
        ex = state.weights[0].execution
        if state.axes.local(ex):
            state.pending = self._combine_in_process(ex, state.axes, state, outputs)
        else:
            (by_src,) = outputs.values()
            state.pending = self._combine_process(ex, state.axes, state, by_src)

    def receive_combine(self, state: State) -> Dict[Key, Tensor]:
        """Per source key, its groups' rows (already weighted and summed) added per token."""
        shards = {}
        dtype = state.weights[0].dtype
        for key, plan in state.plans.items():
            parts = state.pending[key]
            shards[key] = ops.zeros((plan.num_tokens, self.engine.moe.hidden), dtype) if not parts else \
                ops.unsorted_segment_sum(ops.concat([r for _, r in parts], 0) if len(parts) > 1 else parts[0][1],
                                         Tensor(np.concatenate([t for t, _ in parts]).astype(np.int32)),
                                         plan.num_tokens)
        return shards

    def _dispatch_in_process(self, ex, axes: Axes, state: State, tokens: Dict[Key, Tensor]):
        """Simulation: the two-level dispatch of every device's chunk (`moe.hierarchical`); returns
        received[dest key][src key][slot] as the flat exchange does. A row crosses to another
        group once (to the peer), then the peer gathers each expert's copies from it."""
        groups = state.groups = self.link_groups(ex, axes)
        first = ex.keys(axes.token)[0]
        received: Dict[Key, Dict[Key, Dict[int, Optional[Tensor]]]] = {}
        for key in state.plans:
            for member in range(axes.members):
                dest = axes.key_of_member(ex, key, member)
                received.setdefault(dest, {})[key] = {slot: None for slot in range(axes.per_member)}
        inter, intra = [], []
        sent = {"inter_group": 0, "intra_group": 0}  # what device `first` sends, per hop
        state.group_sends = {}
        for key, plan in state.plans.items():
            me = axes.member(ex, key)
            state.group_sends[key] = group_rows(plan.tokens, groups, axes.per_member)
            for send in state.group_sends[key]:
                rows = ops.gather(tokens[key], Tensor(send.tokens.astype(np.int32)), 0)
                peer = groups.peer(me, send.group)
                # the rows with their gates for the group's experts (the columns msrun appends to the
                # rows), which the peer weights the outputs by
                nbytes = _nbytes(rows) + len(send.tokens) * groups.size * axes.per_member * rows.dtype.itemsize
                inter.append((me, peer, nbytes))
                if key == first and peer != me:
                    sent["inter_group"] += nbytes
                peer_key = axes.key_of_member(ex, key, peer)
                for e, pos in send.positions.items():
                    member, slot = divmod(e, axes.per_member)
                    seg = ops.gather(rows, Tensor(pos.astype(np.int32)), 0)
                    intra.append((peer, member, _nbytes(seg)))
                    if peer_key == first and member != peer:
                        sent["intra_group"] += _nbytes(seg)
                    received[axes.key_of_member(ex, key, member)][key][slot] = seg
        self.add_levels(state, "dispatch", inter + intra)
        self._record_hops(ex, axes, sent)
        return received

    def _combine_in_process(self, ex, axes: Axes, state: State, outputs) -> Dict[Key, List[tuple]]:
        """Simulation: outputs[dest][src][slot] go back member -> peer (one row per copy); the peer
        weights each copy by its gate (sent with the rows) and sums them per token, then sends one
        row per (token, group) to the source. Returns {src key: [(token indices, rows)] per group}."""
        groups = state.groups
        first = ex.keys(axes.token)[0]
        dtype = state.weights[0].dtype
        returned: Dict[Key, List[tuple]] = {}
        pairs = []
        sent = {"inter_group": 0, "intra_group": 0}
        for src, sends in state.group_sends.items():
            me = axes.member(ex, src)
            plan, gates = state.plans[src], state.gates[src]
            returned[src] = []
            for send in sends:
                peer = groups.peer(me, send.group)
                peer_key = axes.key_of_member(ex, src, peer)
                weighted, positions = [], []
                for e, pos in send.positions.items():
                    member, slot = divmod(e, axes.per_member)
                    dest = axes.key_of_member(ex, src, member)
                    out = outputs[dest][src][slot]
                    pairs.append((member, peer, _nbytes(out)))
                    if dest == first and member != peer:
                        sent["intra_group"] += _nbytes(out)
                    weighted.append(out * _copy_gates(plan, gates, e).astype(dtype).reshape(-1, 1))
                    positions.append(pos)
                rows = ops.unsorted_segment_sum(ops.concat(weighted, 0) if len(weighted) > 1 else weighted[0],
                                                Tensor(np.concatenate(positions).astype(np.int32)), len(send.tokens))
                pairs.append((peer, me, _nbytes(rows)))
                if peer_key == first and peer != me:
                    sent["inter_group"] += _nbytes(rows)
                returned[src].append((send.tokens, rows))
        self.add_levels(state, "combine", pairs)
        self._record_hops(ex, axes, sent)
        return returned

    def _dispatch_process(self, ex, axes: Axes, state: State, key: Key, tokens: Tensor):
        """msrun: the two-level dispatch of this process's tokens; both hops are uneven AllToAlls
        over the expert group's communicator with rows only to the hop's destinations (peers in
        other groups, then members of the own group). Metadata: row counts (int64) and, with
        the first hop's rows, the 1-bit token x expert mask of the destination group's experts.
        Returns received {key: {source member: {slot: rows}}} as the flat exchange."""
        from mindspore_hyper.moe.routing_bits import pack_routing, packed_routing_bytes, unpack_routing

        groups = state.groups = self.link_groups(ex, axes)
        exchange = self.process_exchange(ex, key, axes)
        meta = self.recorder(ex, axes, "metadata")
        per, members, me = axes.per_member, axes.members, axes.member(ex, key)
        experts_in_group = groups.size * per
        hidden = self.engine.moe.hidden
        wide = replace(exchange, hidden=hidden + experts_in_group)  # rows + their gates
        dtype = state.weights[0].dtype
        plan, gates = state.plans[key], state.gates[key]
        # hop 1: each token once to the peer of every group holding one of its experts, with its
        # gates for that group's experts (columns H.., differentiable: the router's gradient
        # comes back through this exchange)
        sends = group_rows(plan.tokens, groups, per)
        state.group_sends = {key: sends}
        counts1 = np.zeros((members, 1), dtype=np.int64)
        segs1, masks = {}, {}
        for send in sends:
            peer = groups.peer(me, send.group)
            counts1[peer, 0] = len(send.tokens)
            mask = np.zeros((len(send.tokens), experts_in_group), dtype=bool)
            first_expert = groups.members_of(send.group).start * per
            cells, values = [], []
            for e, pos in send.positions.items():
                mask[pos, e - first_expert] = True
                cells.append(pos * experts_in_group + (e - first_expert))
                values.append(_copy_gates(plan, gates, e))
            gate_matrix = ops.unsorted_segment_sum(ops.concat(values, 0) if len(values) > 1 else values[0],
                                                   Tensor(np.concatenate(cells).astype(np.int32)),
                                                   len(send.tokens) * experts_in_group)
            segs1[peer] = {0: ops.concat([ops.gather(tokens, Tensor(send.tokens.astype(np.int32)), 0),
                                          gate_matrix.astype(dtype).reshape(len(send.tokens), experts_in_group)], 1)}
            masks[peer] = pack_routing(mask)
        meta(counts1.size * 8)
        recv1 = exchange.counts(counts1)
        nbytes = [packed_routing_bytes(int(counts1[m, 0]), experts_in_group) for m in range(members)]
        packed = np.concatenate([masks[m] if m in masks else np.zeros(0, np.uint8) for m in range(members)])
        meta(int(packed.size))
        buf, got = exchange.comm.all_to_all_v(packed, nbytes)
        expect = [packed_routing_bytes(int(recv1[m, 0]), experts_in_group) for m in range(members)]
        if list(got) != expect:
            raise RuntimeError(f"hierarchical dispatch: received {list(got)} mask bytes per member, expected {expect}")
        flat1 = wide.flatten(segs1, counts1, dtype)
        moved1 = wide.move(flat1.asnumpy(), counts1, recv1)
        wide_rows = wide.receive(flat1, moved1, counts1, recv1)
        self.add_levels(state, "dispatch", [(me, peer, int(counts1[peer, 0]) * wide.hidden * dtype.itemsize)
                                      for peer in segs1])
        rows1, got_gates = {}, {}
        for src in range(members):
            if int(recv1[src, 0]):
                rows1[src] = {0: wide_rows[src][0][:, :hidden]}
                got_gates[src] = wide_rows[src][0][:, hidden:]
        # hop 2: the peer (this process, for the sources sharing its index) to the experts' members
        my_group = groups.group_of(me)
        counts2 = np.zeros((members, members * per), dtype=np.int64)
        segs2: Dict[int, Dict[int, Optional[Tensor]]] = {}
        positions: Dict[int, Dict[int, np.ndarray]] = {}  # source -> its group-local expert -> token rows
        offset = 0
        for src in range(members):
            n = int(recv1[src, 0])
            size = packed_routing_bytes(n, experts_in_group)
            if not n:
                offset += size
                continue
            mask = unpack_routing(buf[offset:offset + size], n, experts_in_group)
            offset += size
            for j in range(experts_in_group):
                pos = np.nonzero(mask[:, j])[0]
                if not len(pos):
                    continue
                member, slot = divmod(groups.members_of(my_group).start * per + j, per)
                positions.setdefault(src, {})[j] = pos
                counts2[member, src * per + slot] = len(pos)
                segs2.setdefault(member, {})[src * per + slot] = ops.gather(rows1[src][0],
                                                                            Tensor(pos.astype(np.int32)), 0)
        meta(counts2.size * 8)
        recv2 = exchange.counts(counts2)
        flat2 = exchange.chained(exchange.flatten(segs2, counts2, dtype), wide.last_output)
        moved2 = exchange.move(flat2.asnumpy(), counts2, recv2)
        rows2 = exchange.receive(flat2, moved2, counts2, recv2)
        self.add_levels(state, "dispatch", [(me, m, int(counts2[m].sum()) * self.engine.moe.hidden * dtype.itemsize)
                                      for m in segs2])
        received = {}
        for src in range(members):
            peer = groups.peer(src, groups.group_of(me))
            received[src] = {slot: rows2[peer][src * per + slot] for slot in range(per)}
        state.hops = {"exchange": exchange, "counts1": counts1, "recv1": recv1, "counts2": counts2, "recv2": recv2,
                      "gates": got_gates, "positions": positions}
        state.chain = exchange.last_output
        return {key: received}

    def _combine_process(self, ex, axes: Axes, state: State, by_src) -> Dict[Key, dict]:
        """msrun: expert outputs back member -> peer (one row per copy); the peer weights them by the
        gates that came with the rows and sends one row per (token, group) to the source;
        returns {key: [(token indices, rows)] per destination group}."""
        groups, hops = state.groups, state.hops
        exchange, counts2, recv2 = hops["exchange"], hops["counts2"], hops["recv2"]
        per = axes.per_member
        (key,) = state.plans
        me = axes.member(ex, key)
        dtype = state.weights[0].dtype
        row_bytes = self.engine.moe.hidden * dtype.itemsize
        # reverse hop 2: to the peer that forwarded each source's copies
        segs = {}
        for src, outs in by_src.items():
            peer = groups.peer(src, groups.group_of(me))
            for slot, t in outs.items():
                if t is not None:
                    segs.setdefault(peer, {})[src * per + slot] = t
        flat = exchange.chained(exchange.flatten(segs, recv2, dtype), state.chain)
        back2 = exchange.receive(flat, exchange.move(flat.asnumpy(), recv2, counts2), recv2, counts2)
        self.add_levels(state, "combine", [(me, p, int(recv2[p].sum()) * row_bytes) for p in segs])
        # the forwarding device weights each source's copies by their gates and sums them per token
        first_expert = groups.members_of(groups.group_of(me)).start * per
        segs1: Dict[int, Dict[int, Optional[Tensor]]] = {}
        for src, by_expert in hops["positions"].items():
            weighted, rows_of = [], []
            for j, pos in by_expert.items():
                member, slot = divmod(first_expert + j, per)
                gate = ops.gather(hops["gates"][src][:, j], Tensor(pos.astype(np.int32)), 0)
                weighted.append(back2[member][src * per + slot] * gate.reshape(-1, 1))
                rows_of.append(pos)
            segs1[src] = {0: ops.unsorted_segment_sum(ops.concat(weighted, 0) if len(weighted) > 1 else weighted[0],
                                                      Tensor(np.concatenate(rows_of).astype(np.int32)),
                                                      int(hops["recv1"][src, 0]))}
        # reverse hop 1: one row per (token, group) back to its source
        recv1, counts1 = hops["recv1"], hops["counts1"]
        flat = exchange.chained(exchange.flatten(segs1, recv1, dtype), exchange.last_output)
        back1 = exchange.receive(flat, exchange.move(flat.asnumpy(), recv1, counts1), recv1, counts1)
        state.chain = exchange.last_output
        self.add_levels(state, "combine", [(me, s, int(recv1[s, 0]) * row_bytes) for s in segs1])
        return {key: [(send.tokens, back1[groups.peer(me, send.group)][0]) for send in state.group_sends[key]]}

    def _record_hops(self, ex, axes: Axes, sent: Dict[str, int]) -> None:
        """Each hop as one AllToAll over the expert axes in the report, with device 0's bytes (the
        bytes per link level are in `last_stats`)."""
        record = self.recorder(ex, axes, "rows")
        for n in sent.values():
            record(n)
