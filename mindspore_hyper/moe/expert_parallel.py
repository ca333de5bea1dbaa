"""Expert parallelism for `MoE`: tokens go to the devices holding their experts and come back.

The strategy splits the expert dimension (dim 0) of the batched expert weights over one or more
mesh axes (the *expert axes*); it may split their feed-forward dimension over others (tensor
parallelism inside each expert); the router weight stays replicated. For one call:

1. the tokens [T, H] are laid out split over the token axes: the axes they already were split
   over (data) plus the expert axes, minus the experts' tensor axes (every tensor-parallel member
   holds the same tokens);
2. each device routes its own tokens (router gradients summed over the token axes) and plans its
   dispatch (`dispatch.plan_dispatch`);
3. *dispatch*: an uneven AllToAll within the expert group (the devices that differ only on the
   expert axes) sends each expert the rows routed to it (`exchange`); or, with
   `MoE(dispatch="hierarchical")`, two hops: each row (with its gates for that group's experts)
   once to every destination group, then inside the group to its experts' devices (`hierarchical`);
4. each device runs its experts on what it received (with tensor-parallel experts, on its slice
   of F, then an AllReduce over the tensor axes);
5. *combine*: the reverse AllToAll brings the rows back; each token's output is the gate-weighted
   sum of its copies (hierarchical: the group's copies weighted and summed by the device that
   forwarded them, one row per (token, group) back to the source). The load-balancing loss adds
   the devices' routing sums first (one AllReduce over the token axes), so it is the whole
   batch's loss, as on one device.

Dispatch and combine are separate calls whose state is kept per microbatch
(`dispatch.DispatchStates`), so microbatches (and chunks of one) can interleave. A placement from
`eplb.rebalance_experts` (`apply_placement`) replaces logical experts by physical replicas:
replicas hold copies of their expert's weights (all-gathered over the expert axes each call;
the backward reduce-scatters, so replica gradients are summed into their expert) and an
expert's copies are dealt round-robin to its replicas.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Dict, Hashable, List, Optional, Tuple

import numpy as np
from mindspore import Tensor, ops

from mindspore_hyper import _core
from mindspore_hyper.dtensor.dispatch import _fan_out, parameter_dtensor, replicated_dtensor
from mindspore_hyper.dtensor.dtensor import DTensor, significant_axes
from mindspore_hyper.moe.dispatch import DispatchPlan, DispatchStates, expert_capacity, plan_dispatch
from mindspore_hyper.moe.exchange import InProcessExchange, LibraryExchange, ProcessExchange, _nbytes, split_rows
from mindspore_hyper.moe.hierarchical import ExpertGroups, empty_levels, group_rows, level_bytes
from mindspore_hyper.moe.experts import combine_copies, swiglu
from mindspore_hyper.moe.losses import logsumexp_square_sum
from mindspore_hyper.moe.overlap_stats import overlap_report
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["ExpertParallel", "ExpertInputs", "ExpertOutputs"]

Key = Tuple[int, ...]


def _copy_gates(plan, gates: Tensor, expert: int) -> Tensor:
    """The gates of expert `expert`'s copies, in the plan's token order (differentiable)."""
    flat = plan.tokens[expert] * gates.shape[1] + plan.slots[expert]
    return ops.gather(gates.reshape(-1), Tensor(flat.astype(np.int32)), 0)


def _names(mesh, dims) -> tuple:
    """A layout's dims as alias tuples (None for a whole dimension), for messages."""
    return tuple(tuple(mesh.alias_names[a] for a in d) or None for d in dims)


@dataclass
class _Axes:
    """The mesh axes of one call (see module docstring)."""

    token: Tuple[int, ...]  # ascending
    expert: Tuple[int, ...]  # in the expert weights' order (member index = mixed radix over them)
    tensor: Tuple[int, ...]  # the experts' F split, in the weights' order
    members: int  # devices in an expert group
    per_member: int  # (physical) experts per device


@dataclass
class ExpertInputs:
    """What dispatch delivered: received[dest token key][source][expert slot] -> rows or None."""

    microbatch: Hashable
    received: Dict[Key, Dict[Hashable, Dict[int, Optional[Tensor]]]]


@dataclass
class ExpertOutputs:
    """Expert outputs in the same structure, to be sent back by combine."""

    microbatch: Hashable
    outputs: Dict[Key, Dict[Hashable, Dict[int, Optional[Tensor]]]]


@dataclass
class _Prepared:
    """One call's routing, shared by its chunks."""

    x_shape: tuple
    layout: TensorLayout
    axes: _Axes
    weights: tuple  # the expert weights (w_gate, w_up, w_down) as laid out for this call
    tokens: Dict[Key, Tensor]  # this call's token shards [T_local, H] by token key
    plans: Dict[Key, DispatchPlan]  # over the logical experts, all local tokens
    gates: Dict[Key, Tensor]
    aux: Tensor


@dataclass
class _State:
    """What a dispatch (of a microbatch, or a chunk of one) leaves for its combine."""

    prep: _Prepared
    rows: slice  # the chunk's local token rows
    plans: Dict[Key, DispatchPlan] = field(default_factory=dict)  # the chunk's (physical) plans
    gates: Dict[Key, Tensor] = field(default_factory=dict)
    counts: Dict[Key, Tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # (send, recv) under msrun
    pending: object = None  # received segments (simulation) or the background exchange (msrun)
    gathered: Dict[tuple, list] = field(default_factory=dict)  # all experts' weights, with a placement
    flat: Optional[Tensor] = None  # what this process sent (msrun), the autograd input of the exchange
    hops: Optional[dict] = None  # msrun hierarchical dispatch: the row counts of both hops, for combine
    group_sends: Optional[dict] = None  # hierarchical dispatch: per source key, its GroupRows
    chain: Optional[Tensor] = None  # msrun: the last exchange's output (`ProcessExchange.chained`)

    @property
    def axes(self) -> _Axes:
        return self.prep.axes

    @property
    def weights(self) -> tuple:
        return self.prep.weights


class ExpertParallel:
    """The expert-parallel engine of one MoE layer (see module docstring).

    Attributes:
        states: dispatch states waiting for their combine, keyed by microbatch (or
            (microbatch, chunk) inside `forward` with overlap chunks).
        placement: the `placement.ExpertPlacement` in use (None: expert e on member e // per).
        last_stats: bytes moved by the last call on this process's first device: rows sent
            (forward dispatch + combine) and routing metadata; under msrun with overlap chunks
            also the seconds the background exchanges took and the seconds the layer waited.
        background: run the chunks' exchanges on the background thread (msrun); False runs them
            in line, to measure what chunking alone costs.
        worker_nice: nice value (0..19) of the background exchange thread; None: the process's.
        counts_with_rows: under msrun with per-expert counts as metadata, send the counts in the
            rows' message (one rendezvous per dispatch); False: a counts exchange, then the rows.
    """

    def __init__(self, moe):
        self.moe = moe
        self.states = DispatchStates()
        self.placement = None
        self.last_stats: Dict[str, float] = {}
        self._worker = None  # one background thread for the exchanges (msrun, overlap chunks)
        self.background = True  # False: overlap chunks exchange synchronously (for measurements)
        self.worker_nice: Optional[int] = None
        self.counts_with_rows = True
        self._groups: Optional[ExpertGroups] = None  # the link groups of the last dispatch
        self._topology_groups: Dict[tuple, ExpertGroups] = {}  # from the topology, per (ranks, flag, dispatch)

    # -- the whole layer ---------------------------------------------------------------------------
    def forward(self, x: DTensor, microbatch: Hashable = 0):
        """(routed output DTensor like x, aux loss DTensor) of the layer on `x`. With
        `moe.overlap_chunks` = c > 1 each device's tokens go in c chunks, pipelined: under msrun
        the AllToAlls run on a background thread, chunk i+1's dispatch and chunk i-1's combine
        while chunk i is computed."""
        chunks = self.moe.overlap_chunks
        prep = self._prepare(x)
        if chunks == 1:
            return self._assemble(prep, [self._combine(self.compute(self._dispatch(prep, microbatch, slice(None))))])
        local = next(iter(prep.tokens.values())).shape[0]
        if local < chunks:
            raise ValueError(f"MoE overlap: {local} tokens per device cannot form overlap_chunks={chunks} chunks")
        bounds = [local * c // chunks for c in range(chunks + 1)]
        keys = [(microbatch, c) for c in range(chunks)]
        background = self.background and not prep.weights[0].execution.holds_all_ranks
        phase = self._phase_timer()
        self._start_dispatch(prep, keys[0], slice(bounds[0], bounds[1]), background)
        phase("send")
        for c in range(chunks):
            inputs = self._receive_dispatch(keys[c])
            phase("receive")
            if c + 1 < chunks:
                self._start_dispatch(prep, keys[c + 1], slice(bounds[c + 1], bounds[c + 2]), background)
                phase("send")
            outputs = self.compute(inputs)
            phase("compute")
            self._start_combine(outputs, background)
            phase("send")
        combined = [self._receive_combine(k) for k in keys]
        phase("receive")
        if "comm_intervals" in self.last_stats:
            self.last_stats.update(overlap_report(self.last_stats["comm_intervals"],
                                                  self.last_stats.get("wait_intervals", [])))
        return self._assemble(prep, combined)

    def _phase_timer(self):
        """Calls mark the end of a phase: its seconds (since the previous call) are added to
        ``last_stats["phase_seconds"][name]`` (send: planning and flattening a chunk on the layer's
        thread; receive: waiting and unpacking; compute: the experts)."""
        phases = self.last_stats.setdefault("phase_seconds", {})
        last = [time.perf_counter()]

        def mark(name: str) -> None:
            now = time.perf_counter()
            phases[name] = phases.get(name, 0.0) + now - last[0]
            last[0] = now

        return mark

    def dispatch(self, x: DTensor, microbatch: Hashable = 0) -> ExpertInputs:
        """Route `x` [..., H] and send every expert its rows; the state waits for `combine`."""
        return self._dispatch(self._prepare(x), microbatch, slice(None))

    def combine(self, outputs: "ExpertOutputs"):
        """Send the expert outputs back and sum each token's copies; returns (y like the input
        of dispatch, aux loss) and forgets the microbatch's state."""
        prep = self.states.peek(outputs.microbatch).prep
        return self._assemble(prep, [self._combine(outputs)])

    # -- set-up -------------------------------------------------------------------------------------
    def _param(self, ex, cell, name: str) -> DTensor:
        value = cell.__dict__.get(name)
        if isinstance(value, DTensor):
            return value
        param = cell._params[name]
        if id(param) in ex.parameters:
            return parameter_dtensor(ex, param)
        return replicated_dtensor(ex, param)

    def _axes(self, ex, x: DTensor, weights) -> _Axes:
        wr, wg, wu, wd = weights
        mesh = ex.mesh
        if wr.layout.sharded_axes() or wr.layout.is_partial:
            raise ValueError(f"MoE expert parallel: the router weight must be replicated; the strategy lays it "
                             f"out as {wr.layout.tensor_map}")
        expert = tuple(wg.layout.dims[0])
        tensor = tuple(wg.layout.dims[2])
        expect = {"w_gate": (expert, (), tensor), "w_up": (expert, (), tensor), "w_down": (expert, tensor, ())}
        for name, w in (("w_gate", wg), ("w_up", wu), ("w_down", wd)):
            if tuple(tuple(d) for d in w.layout.dims) != expect[name] or w.layout.is_partial:
                raise ValueError(f"MoE expert parallel: experts.{name} is laid out as {_names(mesh, w.layout.dims)}; "
                                 f"expected {_names(mesh, expect[name])} (experts split on dim 0, the feed-forward "
                                 f"dimension on the same axes in every expert weight)")
        tokens_dim = x.layout.dims[0] if x.ndim == 2 else ()
        token = tuple(sorted((set(tokens_dim) | set(expert)) - set(tensor)))
        members = math.prod(mesh.device_matrix[a] for a in expert)
        physical = self.moe.num_experts if self.placement is None else self.placement.num_physical
        if physical % members:
            raise ValueError(f"MoE expert parallel: {physical} experts do not split over {members} devices")
        return _Axes(token, expert, tensor, members, physical // members)

    @staticmethod
    def _local(ex, axes: _Axes) -> bool:
        """Every member of the expert groups is in this process (simulation, or no expert axis)."""
        return ex.holds_all_ranks or axes.members == 1

    def _member(self, ex, key: Key, axes: _Axes) -> int:
        coords = dict(zip(axes.token, key))
        return ex.member_index(axes.expert, coords)

    def _key_of_member(self, ex, key: Key, member: int, axes: _Axes) -> Key:
        coords = dict(zip(axes.token, key))
        for a in reversed(axes.expert):
            coords[a] = member % ex.mesh.device_matrix[a]
            member //= ex.mesh.device_matrix[a]
        return tuple(coords[a] for a in axes.token)

    def _process_exchange(self, ex, key: Key, axes: _Axes) -> ProcessExchange:
        group = ex.group(axes.expert, dict(zip(axes.token, key)))
        comm = ex.collectives.communicator(group)
        if not hasattr(comm, "all_to_all_v"):
            raise RuntimeError("MoE expert parallel under msrun needs the communication library's uneven all-to-all "
                               "(dist_transport='shm'); the configured transport has none")
        return ProcessExchange(comm, group.local[0], group.size, self.moe.hidden, self._recorder(ex, axes, "rows"))

    def _recorder(self, ex, axes: _Axes, what: str):
        name = "+".join(ex.mesh.alias_names[a] for a in axes.expert) or "expert"

        def record(nbytes: int) -> None:
            self.last_stats[what] = self.last_stats.get(what, 0) + int(nbytes)
            ex.accounting.record_comm("AllToAll", name, int(nbytes), int(nbytes))

        return record

    # -- dispatch -----------------------------------------------------------------------------------
    def _prepare(self, x: DTensor) -> _Prepared:
        """Lay the tokens out, route them and plan every device's dispatch (no exchange yet)."""
        moe = self.moe
        ex = x.execution
        weights = (self._param(ex, moe.router, "weight"), self._param(ex, moe.experts, "w_gate"),
                   self._param(ex, moe.experts, "w_up"), self._param(ex, moe.experts, "w_down"))
        num_tokens = math.prod(x.shape[:-1])
        xt = x.reshape(num_tokens, moe.hidden)
        axes = self._axes(ex, xt, weights)
        layout = TensorLayout.from_dims(ex.mesh, [list(axes.token), []])
        if num_tokens % layout.shard_count(0):
            raise ValueError(f"MoE expert parallel: {num_tokens} tokens do not split over the token axes "
                             f"{[ex.mesh.alias_names[a] for a in axes.token]} ({layout.shard_count(0)} devices)")
        xt = xt.redistribute(layout)
        wr, wg, wu, wd = weights
        if axes.token:
            wr = _fan_out(ex, wr, list(axes.token))
        data = [a for a in axes.token if a not in axes.expert]
        if data:
            wg, wu, wd = (_fan_out(ex, w, data) for w in (wg, wu, wd))
        self.last_stats = {}
        local_tokens = num_tokens // layout.shard_count(0)
        capacity = expert_capacity(local_tokens, moe.num_experts, moe.top_k, moe.capacity_factor)
        tokens, plans, gates = {}, {}, {}
        prob_sums, sq_sums, choice_counts = [], [], []
        for key in ex.keys(axes.token):
            tokens[key] = xt.shards[key]
            routing = moe.router.route(tokens[key], wr.shards[()], moe.router.noise(local_tokens))
            plans[key] = plan_dispatch(routing.experts, moe.num_experts, capacity)
            gates[key] = routing.gates
            prob_sums.append(routing.probs.sum(0))
            sq_sums.append(logsumexp_square_sum(routing.logits))
            choice_counts.append(Tensor(plans[key].choice_counts.astype(np.float32)))
        aux = self._aux(ex, axes, prob_sums, sq_sums, choice_counts, num_tokens)
        return _Prepared(tuple(x.shape), layout, axes, (wg, wu, wd), tokens, plans, gates, aux)

    def _dispatch(self, prep: _Prepared, microbatch: Hashable, rows: slice) -> ExpertInputs:
        self._start_dispatch(prep, microbatch, rows, background=False)
        return self._receive_dispatch(microbatch)

    def _start_dispatch(self, prep: _Prepared, microbatch: Hashable, rows: slice, background: bool) -> None:
        """Plan the chunk `rows` of every device's tokens and start sending it (in the background
        under msrun when `background`); the state waits under `microbatch`."""
        ex = prep.weights[0].execution
        axes = prep.axes
        state = _State(prep, rows)
        sends: Dict[Key, Dict[Key, Dict[int, Optional[Tensor]]]] = {}
        chunk_tokens: Dict[Key, Tensor] = {}
        for key, full in prep.plans.items():
            plan = full if rows == slice(None) else full.chunk(rows.start, rows.stop)
            if self.placement is not None:
                plan = self.placement.physical_plan(plan)
            whole = rows == slice(None)
            tokens = prep.tokens[key] if whole else ops.narrow(prep.tokens[key], 0, rows.start, rows.stop - rows.start)
            chunk_tokens[key] = tokens
            state.plans[key] = plan
            state.gates[key] = prep.gates[key] if whole else ops.narrow(prep.gates[key], 0, rows.start,
                                                                          rows.stop - rows.start)
            if self.moe.dispatch == "hierarchical":
                continue
            sends[key] = {}
            for member in range(axes.members):
                segs = {}
                for slot in range(axes.per_member):
                    ids = plan.tokens[member * axes.per_member + slot]
                    segs[slot] = ops.gather(tokens, Tensor(ids.astype(np.int32)), 0) if len(ids) else None
                sends[key][self._key_of_member(ex, key, member, axes)] = segs
        if self.moe.dispatch == "hierarchical" and axes.members > 1:
            if not self._local(ex, axes):
                (key,) = state.plans
                state.pending = self._hierarchical_process_dispatch(ex, axes, state, key, chunk_tokens[key])
                self.states.put(microbatch, state)
                return
            from mindspore_hyper.context import get_context

            if get_context("sim_collectives") == "library":
                raise NotImplementedError("MoE dispatch='hierarchical' hands rows over in process; "
                                          "sim_collectives='library' moves only the flat dispatch")
            state.pending = self._hierarchical_dispatch(ex, axes, state, chunk_tokens)
        elif self._local(ex, axes):
            self._count_levels(ex, axes, "dispatch", sends)
            state.pending = self._in_process(ex, axes, sends)
        else:
            self._count_levels(ex, axes, "dispatch", sends)
            (key, by_dest), = sends.items()
            exchange = self._process_exchange(ex, key, axes)
            plan = state.plans[key]
            send_counts = np.array([[len(plan.tokens[m * axes.per_member + s]) for s in range(axes.per_member)]
                                    for m in range(axes.members)], dtype=np.int64)
            state.flat = exchange.flatten({self._member(ex, d, axes): s for d, s in by_dest.items()}, send_counts,
                                          prep.weights[0].dtype)
            flat = state.flat.asnumpy()

            stats = self.last_stats

            def job():
                if self.counts_with_rows and not self.moe.routing_bits:
                    self._recorder(ex, axes, "metadata")(send_counts.size * 8)
                    return exchange.move_counted(flat, send_counts)
                start = time.perf_counter()
                recv_counts = self._metadata(ex, exchange, state, key, send_counts)
                stats["metadata_seconds"] = stats.get("metadata_seconds", 0.0) + time.perf_counter() - start
                return recv_counts, exchange.move(flat, send_counts, recv_counts)

            state.pending = (exchange, key, send_counts, self._run(job, background))
        self.states.put(microbatch, state)

    # -- link levels and the two-level dispatch ----------------------------------------------------
    def link_groups(self, ex, axes: _Axes) -> ExpertGroups:
        """The link groups of the expert-parallel devices: `moe.expert_groups`, else the topology's
        nodes (for a flat dispatch whose devices the nodes do not cut evenly: one group).

        Raises:
            ValueError: `expert_groups` does not divide the expert devices; the hierarchical
                dispatch without `expert_groups` on a topology whose nodes do not cut them evenly.
        """
        if self.moe.expert_groups is not None:
            return ExpertGroups(axes.members, self.moe.expert_groups)
        from mindspore_hyper.comm.topology import load_topology
        from mindspore_hyper.context import get_context

        ranks = tuple(ex.group(axes.expert, {}).ranks)
        key = (ranks, get_context("topology"), self.moe.dispatch)
        if key not in self._topology_groups:  # one topology look-up per layout and flag
            try:
                self._topology_groups[key] = ExpertGroups.from_topology(load_topology(None, ex.mesh.size), ranks)
            except ValueError:
                if self.moe.dispatch == "hierarchical":
                    raise
                self._topology_groups[key] = ExpertGroups(axes.members, 1)
        return self._topology_groups[key]

    def _add_levels(self, what: str, pairs) -> None:
        """Add transfers (src member, dst member, bytes) to last_stats[what + "_link_bytes"]."""
        counted = self.last_stats.setdefault(f"{what}_link_bytes", empty_levels())
        for level, n in level_bytes(pairs, self._groups).items():
            counted[level] += n

    def _count_levels(self, ex, axes: _Axes, what: str, sends) -> None:
        """Bytes per link level of a flat exchange sends[src key][dst key][slot] (every device here)."""
        self._groups = self.link_groups(ex, axes)
        self._add_levels(what, [(self._member(ex, src, axes), self._member(ex, dst, axes), _nbytes(t))
                                for src, by_dst in sends.items() for dst, segs in by_dst.items()
                                for t in segs.values() if t is not None])

    def _hierarchical_dispatch(self, ex, axes: _Axes, state: _State, tokens: Dict[Key, Tensor]):
        """Simulation: the two-level dispatch of every device's chunk (`moe.hierarchical`); returns
        received[dest key][src key][slot] as the flat exchange does. A row crosses to another
        group once (to the peer), then the peer gathers each expert's copies from it."""
        groups = self._groups = self.link_groups(ex, axes)
        first = ex.keys(axes.token)[0]
        received: Dict[Key, Dict[Key, Dict[int, Optional[Tensor]]]] = {}
        for key in state.plans:
            for member in range(axes.members):
                dest = self._key_of_member(ex, key, member, axes)
                received.setdefault(dest, {})[key] = {slot: None for slot in range(axes.per_member)}
        inter, intra = [], []
        sent = {"inter_group": 0, "intra_group": 0}  # what device `first` sends, per hop
        state.group_sends = {}
        for key, plan in state.plans.items():
            me = self._member(ex, key, axes)
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
                peer_key = self._key_of_member(ex, key, peer, axes)
                for e, pos in send.positions.items():
                    member, slot = divmod(e, axes.per_member)
                    seg = ops.gather(rows, Tensor(pos.astype(np.int32)), 0)
                    intra.append((peer, member, _nbytes(seg)))
                    if peer_key == first and member != peer:
                        sent["intra_group"] += _nbytes(seg)
                    received[self._key_of_member(ex, key, member, axes)][key][slot] = seg
        self._add_levels("dispatch", inter + intra)
        self._record_hops(ex, axes, sent)
        return received

    def _hierarchical_combine(self, ex, axes: _Axes, state: _State, outputs) -> Dict[Key, List[tuple]]:
        """Simulation: outputs[dest][src][slot] go back member -> peer (one row per copy); the peer
        weights each copy by its gate (sent with the rows) and sums them per token, then sends one
        row per (token, group) to the source. Returns {src key: [(token indices, rows)] per group}."""
        groups = self._groups
        first = ex.keys(axes.token)[0]
        dtype = state.weights[0].dtype
        returned: Dict[Key, List[tuple]] = {}
        pairs = []
        sent = {"inter_group": 0, "intra_group": 0}
        for src, sends in state.group_sends.items():
            me = self._member(ex, src, axes)
            plan, gates = state.plans[src], state.gates[src]
            returned[src] = []
            for send in sends:
                peer = groups.peer(me, send.group)
                peer_key = self._key_of_member(ex, src, peer, axes)
                weighted, positions = [], []
                for e, pos in send.positions.items():
                    member, slot = divmod(e, axes.per_member)
                    dest = self._key_of_member(ex, src, member, axes)
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
        self._add_levels("combine", pairs)
        self._record_hops(ex, axes, sent)
        return returned

    def _hierarchical_process_dispatch(self, ex, axes: _Axes, state: _State, key: Key, tokens: Tensor):
        """msrun: the two-level dispatch of this process's tokens; both hops are uneven AllToAlls
        over the expert group's communicator with rows only to the hop's destinations (peers in
        other groups, then members of the own group). Metadata: row counts (int64) and, with
        the first hop's rows, the 1-bit token x expert mask of the destination group's experts.
        Returns received {key: {source member: {slot: rows}}} as the flat exchange."""
        from mindspore_hyper.moe.routing_bits import pack_routing, packed_routing_bytes, unpack_routing

        groups = self._groups = self.link_groups(ex, axes)
        exchange = self._process_exchange(ex, key, axes)
        meta = self._recorder(ex, axes, "metadata")
        per, members, me = axes.per_member, axes.members, self._member(ex, key, axes)
        experts_in_group = groups.size * per
        hidden = self.moe.hidden
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
        self._add_levels("dispatch", [(me, peer, int(counts1[peer, 0]) * wide.hidden * dtype.itemsize)
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
        self._add_levels("dispatch", [(me, m, int(counts2[m].sum()) * self.moe.hidden * dtype.itemsize)
                                      for m in segs2])
        received = {}
        for src in range(members):
            peer = groups.peer(src, groups.group_of(me))
            received[src] = {slot: rows2[peer][src * per + slot] for slot in range(per)}
        state.hops = {"exchange": exchange, "counts1": counts1, "recv1": recv1, "counts2": counts2, "recv2": recv2,
                      "gates": got_gates, "positions": positions}
        state.chain = exchange.last_output
        return {key: received}

    def _hierarchical_process_combine(self, ex, axes: _Axes, state: _State, by_src) -> Dict[Key, dict]:
        """msrun: expert outputs back member -> peer (one row per copy); the peer weights them by the
        gates that came with the rows and sends one row per (token, group) to the source;
        returns {key: [(token indices, rows)] per destination group}."""
        groups, hops = self._groups, state.hops
        exchange, counts2, recv2 = hops["exchange"], hops["counts2"], hops["recv2"]
        per = axes.per_member
        (key,) = state.plans
        me = self._member(ex, key, axes)
        dtype = state.weights[0].dtype
        row_bytes = self.moe.hidden * dtype.itemsize
        # reverse hop 2: to the peer that forwarded each source's copies
        segs = {}
        for src, outs in by_src.items():
            peer = groups.peer(src, groups.group_of(me))
            for slot, t in outs.items():
                if t is not None:
                    segs.setdefault(peer, {})[src * per + slot] = t
        flat = exchange.chained(exchange.flatten(segs, recv2, dtype), state.chain)
        back2 = exchange.receive(flat, exchange.move(flat.asnumpy(), recv2, counts2), recv2, counts2)
        self._add_levels("combine", [(me, p, int(recv2[p].sum()) * row_bytes) for p in segs])
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
        self._add_levels("combine", [(me, s, int(recv1[s, 0]) * row_bytes) for s in segs1])
        return {key: [(send.tokens, back1[groups.peer(me, send.group)][0]) for send in state.group_sends[key]]}

    def _record_hops(self, ex, axes: _Axes, sent: Dict[str, int]) -> None:
        """Each hop as one AllToAll over the expert axes in the report, with device 0's bytes (the
        bytes per link level are in `last_stats`)."""
        name = "+".join(ex.mesh.alias_names[a] for a in axes.expert) or "expert"
        for n in sent.values():
            self.last_stats["rows"] = self.last_stats.get("rows", 0) + n
            ex.accounting.record_comm("AllToAll", name, n, n)

    def _in_process(self, ex, axes: _Axes, sends):
        """Simulation: sends[src key][dest key][slot] -> received[dest key][src key][slot], handed
        over, or with `sim_collectives="library"` moved by the library's in-process all-to-all."""
        from mindspore_hyper.context import get_context

        record = self._recorder(ex, axes, "rows")
        if get_context("sim_collectives") != "library":
            return InProcessExchange(record).exchange(sends, ex.keys(axes.token)[0])
        groups: Dict[tuple, List[Key]] = {}
        for key in sends:  # expert groups: keys that differ only on the expert axes
            rest = tuple(c for a, c in zip(axes.token, key) if a not in axes.expert)
            groups.setdefault(rest, []).append(key)
        received = {}
        for i, members in enumerate(groups.values()):
            members.sort(key=lambda k: self._member(ex, k, axes))
            received.update(LibraryExchange(self.moe.hidden, record if i == 0 else None).exchange(sends, members))
        return received

    def _receive_dispatch(self, microbatch: Hashable) -> ExpertInputs:
        state = self.states.peek(microbatch)
        if isinstance(state.pending, dict):
            received, state.pending = state.pending, None
            return ExpertInputs(microbatch, received)
        exchange, key, send_counts, future = state.pending
        recv_counts, moved = self._wait(future)
        state.counts[key] = (send_counts, recv_counts)
        state.pending = exchange
        received = exchange.receive(state.flat, moved, send_counts, recv_counts)
        state.chain = exchange.last_output
        return ExpertInputs(microbatch, {key: received})

    def _run(self, job, background: bool) -> Future:
        """Run `job` now, or on the background thread; its seconds go to last_stats."""
        stats = self.last_stats

        def timed():
            start = time.perf_counter()
            try:
                return job()
            finally:
                end = time.perf_counter()
                stats["comm_seconds"] = stats.get("comm_seconds", 0.0) + end - start
                if background:
                    stats.setdefault("comm_intervals", []).append((start, end))

        if background:
            if self._worker is None:
                init = {} if self.worker_nice is None else {
                    "initializer": _core.make_background_thread, "initargs": ("moe-alltoall", int(self.worker_nice))}
                self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="moe-alltoall", **init)
            return self._worker.submit(timed)
        done: Future = Future()
        done.set_result(timed())
        return done

    def _wait(self, future: Future):
        start = time.perf_counter()
        result = future.result()
        end = time.perf_counter()
        self.last_stats["wait_seconds"] = self.last_stats.get("wait_seconds", 0.0) + end - start
        self.last_stats.setdefault("wait_intervals", []).append((start, end))
        return result

    def _aux(self, ex, axes: _Axes, prob_sums, sq_sums, choice_counts, num_tokens: int) -> Tensor:
        if axes.token:
            group = ex.group(axes.token, {})
            coll = ex.collectives
            prob_sums = coll.all_reduce(prob_sums, "sum", group)
            sq_sums = coll.all_reduce(sq_sums, "sum", group)
            choice_counts = coll.all_reduce(choice_counts, "sum", group)
        self.moe.last_expert_counts = choice_counts[0].asnumpy().astype(np.int64)
        return self.moe.aux_loss(prob_sums[0], choice_counts[0], sq_sums[0], num_tokens)

    def _metadata(self, ex, exchange: ProcessExchange, state: _State, key: Key, send_counts: np.ndarray) -> np.ndarray:
        """Rows per (source, my expert slot): from int64 counts, or from the 1-bit routing mask."""
        record = self._recorder(ex, state.axes, "metadata")
        if not self.moe.routing_bits:
            record(send_counts.size * 8)
            return exchange.counts(send_counts)
        from mindspore_hyper.moe.routing_bits import exchange_routing_mask

        return exchange_routing_mask(exchange, state.plans[key], state.axes.per_member, record)

    # -- expert compute -----------------------------------------------------------------------------
    def compute(self, inputs: ExpertInputs) -> ExpertOutputs:
        """Every local expert on the rows it received (tensor-parallel experts: partial sums
        all-reduced over the tensor axes)."""
        state = self.states.peek(inputs.microbatch)
        ex = state.weights[0].execution
        axes = state.axes
        outputs = {}
        for key, by_src in inputs.received.items():
            order = [(slot, src) for slot in range(axes.per_member) for src in sorted(by_src)
                     if by_src[src].get(slot) is not None]
            outputs[key] = {src: {slot: None for slot in range(axes.per_member)} for src in by_src}
            if not order:
                continue
            pieces = [by_src[src][slot] for slot, src in order]
            rows = pieces[0] if len(pieces) == 1 else ops.concat(pieces, 0)
            tp_group = ex.group(axes.tensor, dict(zip(axes.token, key))) if axes.tensor else None
            if tp_group is not None:
                rows = ex.collectives.fan_out(rows, tp_group)
            sizes = [int(p.shape[0]) for p in pieces]
            slot_sizes = [sum(n for (s, _), n in zip(order, sizes) if s == slot) for slot in range(axes.per_member)]
            results = []
            slot_rows = split_rows(rows, slot_sizes)
            for tp_key in (ex.keys(axes.tensor) if axes.tensor else [()]):
                wg, wu, wd = (ops.unstack(w, 0) for w in self._weights(ex, state, key, tp_key))
                outs = [swiglu(r, wg[slot], wu[slot], wd[slot]) for slot, r in enumerate(slot_rows) if r is not None]
                results.append(outs[0] if len(outs) == 1 else ops.concat(outs, 0))
            if tp_group is not None:
                if len(results) != len(tp_group.local):
                    raise AssertionError(f"{len(results)} tensor-parallel results for {tp_group}")
                results = ex.collectives.all_reduce(results, "sum", tp_group)
            for (slot, src), piece in zip(order, split_rows(results[0], sizes)):
                outputs[key][src][slot] = piece
        return ExpertOutputs(inputs.microbatch, outputs)

    def _weights(self, ex, state: _State, key: Key, tp_key: Key):
        """This device's expert weights [per, H, F_local] ... for token key `key`, tensor key `tp_key`."""
        axes = state.axes
        coords = dict(zip(axes.token, key))
        coords.update(zip(axes.tensor, tp_key))
        if self.placement is None:
            return [w.shards[tuple(coords[a] for a in significant_axes(w.layout))] for w in state.weights]
        # replicas: every logical expert's weights (this tensor slice), all-gathered over the
        # expert axes (backward: reduce-scatter, so each replica's gradient reaches its expert)
        cache_key = tuple(sorted((a, c) for a, c in coords.items() if a not in axes.expert))
        if cache_key not in state.gathered:
            group = ex.group(axes.expert, {a: c for a, c in coords.items() if a not in axes.expert})
            gathered = []
            for w in state.weights:
                sig = significant_axes(w.layout)
                shards = [w.shards[tuple(ex.mesh.coords(group.ranks[i])[a] for a in sig)] for i in group.local]
                gathered.append(ex.collectives.all_gather(shards, 0, group, grad_partial=True)[0]
                                if group.size > 1 else shards[0])
            state.gathered[cache_key] = gathered
        return self.placement.member_weights(self._member(ex, key, axes), axes.per_member, state.gathered[cache_key])

    # -- combine ------------------------------------------------------------------------------------
    def _combine(self, outputs: ExpertOutputs) -> Dict[Key, Tensor]:
        self._start_combine(outputs, background=False)
        return self._receive_combine(outputs.microbatch)

    def _start_combine(self, outputs: ExpertOutputs, background: bool) -> None:
        """Start sending the expert outputs back to their tokens' devices."""
        state = self.states.peek(outputs.microbatch)
        ex = state.weights[0].execution
        if self.moe.dispatch == "hierarchical" and state.axes.members > 1:
            if self._local(ex, state.axes):
                state.pending = self._hierarchical_combine(ex, state.axes, state, outputs.outputs)
            else:
                (by_src,) = outputs.outputs.values()
                state.pending = self._hierarchical_process_combine(ex, state.axes, state, by_src)
            return
        if self._local(ex, state.axes):  # outputs[dest][src] are what dest sends back to src
            self._count_levels(ex, state.axes, "combine", outputs.outputs)
            state.pending = self._in_process(ex, state.axes, outputs.outputs)
            return
        (key,) = state.plans
        (by_src,) = outputs.outputs.values()
        me = self._member(ex, key, state.axes)
        self._add_levels("combine", [(me, src, _nbytes(t)) for src, segs in by_src.items()
                                     for t in segs.values() if t is not None])
        exchange = state.pending
        send_counts, recv_counts = state.counts[key]
        state.flat = exchange.chained(exchange.flatten(by_src, recv_counts, state.weights[0].dtype), state.chain)
        flat = state.flat.asnumpy()
        future = self._run(lambda: exchange.move(flat, recv_counts, send_counts), background)
        state.pending = (exchange, key, future)

    def _receive_combine(self, microbatch: Hashable) -> Dict[Key, Tensor]:
        """Wait for the outputs of `microbatch` and sum each token's copies; forgets its state."""
        state = self.states.pop(microbatch)
        ex = state.weights[0].execution
        if isinstance(state.pending, dict):
            returned = state.pending
        else:
            exchange, key, future = state.pending
            send_counts, recv_counts = state.counts[key]
            moved = self._wait(future)
            back = exchange.receive(state.flat, moved, recv_counts, send_counts)
            state.chain = exchange.last_output
            returned = {key: back}
        shards = {}
        dtype = state.weights[0].dtype
        for key, plan in state.plans.items():
            if state.group_sends is not None:  # hierarchical: per group, the rows already weighted and summed
                parts = returned[key]
                shards[key] = ops.zeros((plan.num_tokens, self.moe.hidden), dtype) if not parts else \
                    ops.unsorted_segment_sum(ops.concat([r for _, r in parts], 0) if len(parts) > 1 else parts[0][1],
                                             Tensor(np.concatenate([t for t, _ in parts]).astype(np.int32)),
                                             plan.num_tokens)
            else:
                by_dest = returned[key]
                outs = []
                for e in range(plan.num_experts):
                    member, slot = divmod(e, state.axes.per_member)
                    src = self._key_of_member(ex, key, member, state.axes) if self._local(ex, state.axes) else member
                    outs.append(by_dest[src][slot])
                shards[key] = combine_copies(plan, outs, state.gates[key], self.moe.hidden, dtype)
            if state.chain is not None:  # msrun: the last exchange joins the output (see ProcessExchange.chained)
                shards[key] = ProcessExchange.chained(shards[key], state.chain)
        return shards

    def _assemble(self, prep: _Prepared, chunks: List[Dict[Key, Tensor]]):
        """(y DTensor shaped like the layer's input, aux loss DTensor) from the chunks' shards."""
        ex = prep.weights[0].execution
        shards = {key: chunks[0][key] if len(chunks) == 1 else ops.concat([c[key] for c in chunks], 0)
                  for key in chunks[0]}
        total = math.prod(prep.x_shape[:-1])
        dtype = prep.weights[0].dtype
        y = DTensor._create(prep.layout, shards, (total, self.moe.hidden), dtype, ex)
        aux = DTensor._create(TensorLayout.replicated(ex.mesh, 0), {(): prep.aux}, (), prep.aux.dtype, ex)
        return y.reshape(prep.x_shape), aux
