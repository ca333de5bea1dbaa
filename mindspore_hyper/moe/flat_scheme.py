"""The flat dispatch: one uneven AllToAll within the expert group sends each expert the rows
routed to it; combine is the reverse AllToAll, and each token's output the gate-weighted sum of
its copies. In simulation the segments change hands in process (or through the library's
in-process all-to-all with `sim_collectives="library"`); under msrun the rows travel on the
background thread when the engine asks, with their per-expert counts in the same message
(`ExpertParallel.counts_with_rows`) or after a metadata exchange (int64 counts or the 1-bit
routing mask)."""
from __future__ import annotations

import time
from typing import Dict, List, Optional

import numpy as np
from mindspore import Tensor, ops

from mindspore_hyper.moe.dispatch_scheme import DispatchScheme
from mindspore_hyper.moe.exchange import InProcessExchange, LibraryExchange, ProcessExchange, _nbytes
from mindspore_hyper.moe.experts import combine_copies
from mindspore_hyper.moe.expert_state import Axes, Key, State

__all__ = ["FlatScheme"]


class FlatScheme(DispatchScheme):
    """One uneven AllToAll over the expert axes each way (see module docstring)."""

    def start_dispatch(self, state: State, tokens: Dict[Key, Tensor], background: bool) -> None:
        ex = state.weights[0].execution
        axes = state.axes
        sends: Dict[Key, Dict[Key, Dict[int, Optional[Tensor]]]] = {}
        for key, plan in state.plans.items():
            sends[key] = {}
            for member in range(axes.members):
                segs = {}
                for slot in range(axes.per_member):
                    ids = plan.tokens[member * axes.per_member + slot]
                    segs[slot] = ops.gather(tokens[key], Tensor(ids.astype(np.int32)), 0) if len(ids) else None
                sends[key][axes.key_of_member(ex, key, member)] = segs
        self._count_levels(ex, state, "dispatch", sends)
        if axes.local(ex):
            state.pending = self._in_process(ex, axes, sends)
            return
        (key, by_dest), = sends.items()
        exchange = self.process_exchange(ex, key, axes)
        plan = state.plans[key]
        send_counts = np.array([[len(plan.tokens[m * axes.per_member + s]) for s in range(axes.per_member)]
                                for m in range(axes.members)], dtype=np.int64)
        state.flat = exchange.flatten({axes.member(ex, d): s for d, s in by_dest.items()}, send_counts,
                                      state.weights[0].dtype)
        flat = state.flat.asnumpy()
        engine = self.engine
        stats = engine.last_stats

        def job():
            if engine.counts_with_rows and not engine.moe.routing_bits:
                self.recorder(ex, axes, "metadata")(send_counts.size * 8)
                return exchange.move_counted(flat, send_counts)
            start = time.perf_counter()
            recv_counts = self._metadata(ex, exchange, state, key, send_counts)
            stats["metadata_seconds"] = stats.get("metadata_seconds", 0.0) + time.perf_counter() - start
            return recv_counts, exchange.move(flat, send_counts, recv_counts)

        state.pending = (exchange, key, send_counts, engine.run_exchange(job, background))

    def receive_dispatch(self, state: State) -> Dict[Key, dict]:
        if state.axes.local(state.weights[0].execution):
            return super().receive_dispatch(state)
        exchange, key, send_counts, future = state.pending
        recv_counts, moved = self.engine.wait_exchange(future)
        state.counts[key] = (send_counts, recv_counts)
        state.pending = exchange
        received = exchange.receive(state.flat, moved, send_counts, recv_counts)
        state.chain = exchange.last_output
        return {key: received}

    def start_combine(self, state: State, outputs: Dict[Key, dict], background: bool) -> None:
        ex = state.weights[0].execution
        axes = state.axes
        if axes.local(ex):  # outputs[dest][src] are what dest sends back to src
            self._count_levels(ex, state, "combine", outputs)
            state.pending = self._in_process(ex, axes, outputs)
            return
        (key,) = state.plans
        (by_src,) = outputs.values()
        me = axes.member(ex, key)
        self.add_levels(state, "combine", [(me, src, _nbytes(t)) for src, segs in by_src.items()
                                           for t in segs.values() if t is not None])
        exchange = state.pending
        send_counts, recv_counts = state.counts[key]
        state.flat = exchange.chained(exchange.flatten(by_src, recv_counts, state.weights[0].dtype), state.chain)
        flat = state.flat.asnumpy()
        future = self.engine.run_exchange(lambda: exchange.move(flat, recv_counts, send_counts), background)
        state.pending = (exchange, key, future)

    def receive_combine(self, state: State) -> Dict[Key, Tensor]:
        ex = state.weights[0].execution
        axes = state.axes
        local = axes.local(ex)
        if local:
            returned = state.pending
        else:
            exchange, key, future = state.pending
            send_counts, recv_counts = state.counts[key]
            moved = self.engine.wait_exchange(future)
            back = exchange.receive(state.flat, moved, recv_counts, send_counts)
            state.chain = exchange.last_output
            returned = {key: back}
        shards = {}
        for key, plan in state.plans.items():
            by_dest = returned[key]
            outs = []
            for e in range(plan.num_experts):
                member, slot = divmod(e, axes.per_member)
                outs.append(by_dest[axes.key_of_member(ex, key, member) if local else member][slot])
            shards[key] = combine_copies(plan, outs, state.gates[key], self.engine.moe.hidden, state.weights[0].dtype)
        return shards

    def _count_levels(self, ex, state: State, what: str, sends) -> None:
        """Bytes per link level of the exchange sends[src key][dst key][slot] (every device here)."""
        axes = state.axes
        state.groups = self.link_groups(ex, axes)
        self.add_levels(state, what, [(axes.member(ex, src), axes.member(ex, dst), _nbytes(t))
                                      for src, by_dst in sends.items() for dst, segs in by_dst.items()
                                      for t in segs.values() if t is not None])

    def _in_process(self, ex, axes: Axes, sends):
        """Simulation: sends[src key][dest key][slot] -> received[dest key][src key][slot], handed
        over, or with `sim_collectives="library"` moved by the library's in-process all-to-all."""
        from mindspore_hyper.context import get_context

        record = self.recorder(ex, axes, "rows")
        if get_context("sim_collectives") != "library":
            return InProcessExchange(record).exchange(sends, ex.keys(axes.token)[0])
        groups: Dict[tuple, List[Key]] = {}
        for key in sends:  # expert groups: keys that differ only on the expert axes
            rest = tuple(c for a, c in zip(axes.token, key) if a not in axes.expert)
            groups.setdefault(rest, []).append(key)
        received, hidden = {}, self.engine.moe.hidden
        for i, members in enumerate(groups.values()):
            members.sort(key=lambda k: axes.member(ex, k))
            received.update(LibraryExchange(hidden, record if i == 0 else None).exchange(sends, members))
        return received

    def _metadata(self, ex, exchange: ProcessExchange, state: State, key: Key, send_counts: np.ndarray) -> np.ndarray:
        """Rows per (source, my expert slot): from int64 counts, or from the 1-bit routing mask."""
        record = self.recorder(ex, state.axes, "metadata")
        if not self.engine.moe.routing_bits:
            record(send_counts.size * 8)
            return exchange.counts(send_counts)
        from mindspore_hyper.moe.routing_bits import exchange_routing_mask

        return exchange_routing_mask(exchange, state.plans[key], state.axes.per_member, record)
