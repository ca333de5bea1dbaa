"""The flat dispatch: one uneven AllToAll within the expert group sends each expert the rows
routed to it; combine is the reverse AllToAll, and each token's output the gate-weighted sum of
its copies. The plan is data (per device the rows for each (member, expert slot)); one code path
runs it on the mode's exchange (`DispatchScheme.exchange`): in simulation the segments change
hands in process (or through the library's in-process all-to-all with `sim_collectives="library"`);
under msrun the rows travel on the background thread when the engine asks, with their per-expert
counts in the same message (`ExpertParallel.counts_with_rows`) or after a metadata exchange
(int64 counts or the 1-bit routing mask)."""
from __future__ import annotations

import time
from functools import partial
from typing import Dict

import numpy as np
from mindspore import Tensor, ops

from mindspore_hyper.moe import exchange_buffers
from mindspore_hyper.moe.dispatch_scheme import DispatchScheme
from mindspore_hyper.moe.experts import combine_copies
from mindspore_hyper.moe.expert_state import Key, State
from mindspore_hyper.moe.member_loads import MemberLoads

__all__ = ["FlatScheme"]


class FlatScheme(DispatchScheme):
    """One uneven AllToAll over the expert axes each way (see module docstring)."""

    def start_dispatch(self, state: State, tokens: Dict[Key, Tensor], background: bool) -> None:
        ex = state.weights[0].execution
        axes = state.axes
        loads = state.loads = MemberLoads.of_call(ex, axes, next(iter(state.plans.values())))
        exchange = state.exchange = self.exchange(ex, axes, record=loads is None)
        per = axes.per_member
        counts = {key: np.array([[len(plan.tokens[m * per + s]) for s in range(per)] for m in range(axes.members)],
                                dtype=np.int64) for key, plan in state.plans.items()}
        sends = {}
        for key, plan in state.plans.items():
            sends[key] = {}
            for member in range(axes.members):
                segs = {}
                for slot in range(per):
                    ids = plan.tokens[member * per + slot]
                    segs[slot] = ops.gather(tokens[key], Tensor(ids.astype(np.int32)), 0) if len(ids) else None
                sends[key][exchange.address(key, member)] = segs
        self._count_levels(state, "dispatch", sends)
        key = next(iter(state.plans))  # msrun: this process's (the only one)
        if loads is not None:  # every member its own bytes (`member_loads`)
            row_bytes = self.engine.moe.hidden * tokens[key].dtype.itemsize
            self.record_members(ex, axes, loads.by_ranks(lambda m: loads.sent(m) * row_bytes))
        move = partial(self._move, state, key, counts[key], self.engine.last_stats)
        exchange.start(sends, counts, dtype=state.weights[0].dtype, move=move,
                       run=partial(self.engine.run_exchange, background=background))

    def receive_dispatch(self, state: State) -> Dict[Key, dict]:
        received = state.exchange.finish(self.engine.wait_exchange)
        state.chain = state.exchange.last_output
        if state.axes.members == 1:  # nothing is exchanged
            return received
        key = next(iter(state.plans))  # the representative device's (msrun: this process's)
        itemsize = state.prep.tokens[key].dtype.itemsize
        hidden, loads = self.engine.moe.hidden, state.loads
        if loads is not None:
            state.dispatch_buffers = loads.by_ranks(lambda m: exchange_buffers.dispatch_buffer_bytes(
                loads.copies, loads.received(m), hidden, itemsize))
        else:
            state.dispatch_buffers = exchange_buffers.dispatch_buffer_bytes(
                int(state.plans[key].counts.sum()), _rows(received[key]), hidden, itemsize)
        exchange_buffers.allocate(state.weights[0].execution.accounting, state.dispatch_buffers)
        return received

    def start_combine(self, state: State, outputs: Dict[Key, dict], background: bool) -> None:
        """outputs[dest][src] are what dest sends back to src."""
        ex, axes, loads, hidden = state.weights[0].execution, state.axes, state.loads, self.engine.moe.hidden
        itemsize = state.weights[0].dtype.itemsize  # the experts' outputs' (and the combined rows') dtype
        key = next(iter(state.plans))
        if loads is not None:  # every member its own bytes (`member_loads`)
            self.record_members(ex, axes, loads.by_ranks(lambda m: loads.returned(m) * hidden * itemsize))
            state.combine_buffers = loads.by_ranks(lambda m: exchange_buffers.combine_buffer_bytes(
                loads.received(m), loads.copies, hidden, itemsize))
        elif axes.members > 1:  # (one member: nothing is exchanged)
            state.combine_buffers = exchange_buffers.combine_buffer_bytes(
                _rows(outputs[key]), int(state.plans[key].counts.sum()), hidden, itemsize)
        if state.combine_buffers is not None:
            exchange_buffers.allocate(ex.accounting, state.combine_buffers)
        self._count_levels(state, "combine", outputs)
        state.exchange.start_back(outputs, state.weights[0].dtype, partial(self.engine.run_exchange,
                                                                           background=background))

    def receive_combine(self, state: State) -> Dict[Key, Tensor]:
        exchange = state.exchange
        returned = exchange.finish(self.engine.wait_exchange)
        state.chain = exchange.last_output
        axes = state.axes
        shards = {}
        for key, plan in state.plans.items():
            by_dest = returned[key]
            outs = []
            for e in range(plan.num_experts):
                member, slot = divmod(e, axes.per_member)
                outs.append(by_dest[exchange.address(key, member)][slot])
            shards[key] = combine_copies(plan, outs, state.gates[key], self.engine.moe.hidden, state.weights[0].dtype)
        if state.combine_buffers is not None:
            exchange_buffers.free(state.weights[0].execution.accounting, state.combine_buffers)
        return shards

    def _count_levels(self, state: State, what: str, sends) -> None:
        """Bytes per link level of the exchange sends[src key][dst address][slot]."""
        state.groups = self.link_groups(state.weights[0].execution, state.axes)
        self.count_sends(state, what, sends)

    def _move(self, state: State, key: Key, send_counts: np.ndarray, stats: dict, flat: np.ndarray):
        """msrun, on the exchange's thread: (recv counts, received rows) of the dispatch's rows
        `flat`, the counts in the rows' message, or first from the metadata (int64 counts or the
        1-bit routing mask)."""
        ex, engine, exchange = state.weights[0].execution, self.engine, state.exchange
        record = self.recorder(ex, state.axes, "metadata")
        if engine.counts_with_rows and not engine.moe.routing_bits:
            record(send_counts.size * 8)
            return exchange.move_counted(flat, send_counts)
        start = time.perf_counter()
        if engine.moe.routing_bits:
            from mindspore_hyper.moe.routing_bits import exchange_routing_mask

            recv_counts = exchange_routing_mask(exchange, state.plans[key], state.axes.per_member, record)
        else:
            record(send_counts.size * 8)
            recv_counts = exchange.counts(send_counts)
        stats["metadata_seconds"] = stats.get("metadata_seconds", 0.0) + time.perf_counter() - start
        return recv_counts, exchange.move(flat, send_counts, recv_counts)


def _rows(by_peer: Dict) -> int:
    """Rows in segments {peer: {slot: rows or None}}."""
    return sum(int(t.shape[0]) for segs in by_peer.values() for t in segs.values() if t is not None)
