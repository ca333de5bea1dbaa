"""Expert parallelism for `MoE`: tokens go to the devices holding their experts and come back.

The strategy splits the expert dimension (dim 0) of the batched expert weights over one or more
mesh axes (the *expert axes*); it may split their feed-forward dimension over others (tensor
parallelism inside each expert); the router weight stays replicated. For one call:

1. the tokens [T, H] are laid out split over the token axes: the axes they already were split
   over (data) plus the expert axes, minus the experts' tensor axes (every tensor-parallel member
   holds the same tokens);
2. each device routes its own tokens (router gradients summed over the token axes) and plans its
   dispatch (`token_routing.route_call`);
3. *dispatch*: an uneven AllToAll within the expert group (the devices that differ only on the
   expert axes) sends each expert the rows routed to it (`flat_scheme`); or, with
   `MoE(dispatch="hierarchical")`, two hops: each row (with its gates for that group's experts)
   once to every destination group, then inside the group to its experts' devices
   (`hierarchical_scheme`). The scheme, picked once per layer, moves the rows on `exchange`;
4. each device runs its experts on what it received (with tensor-parallel experts, on its slice
   of F, then an AllReduce over the tensor axes; `expert_compute`);
5. *combine*: the reverse AllToAll brings the rows back; each token's output is the gate-weighted
   sum of its copies (hierarchical: the group's copies weighted and summed by the device that
   forwarded them, one row per (token, group) back to the source). The load-balancing loss adds
   the devices' routing sums first (one AllReduce over the token axes), so it is the whole
   batch's loss, as on one device.

Dispatch and combine are separate calls whose state is kept per microbatch
(`token_dispatch.DispatchStates`), so microbatches (and chunks of one) can interleave. A placement from
`eplb.rebalance_experts` (`apply_placement`) replaces logical experts by physical replicas:
replicas hold copies of their expert's weights (all-gathered over the expert axes each call;
the backward reduce-scatters, so replica gradients are summed into their expert) and an
expert's copies are dealt round-robin to its replicas.
"""
from __future__ import annotations

import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Dict, Hashable, List, Optional

from mindspore import Tensor, ops

from mindspore_hyper import _core
from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.moe.token_dispatch import DispatchStates
from mindspore_hyper.moe.exchange import ProcessExchange
from mindspore_hyper.moe.expert_compute import run_experts
from mindspore_hyper.moe.expert_state import ExpertInputs, ExpertOutputs, Key, Prepared, State
from mindspore_hyper.moe.flat_scheme import FlatScheme
from mindspore_hyper.moe.hierarchical_scheme import HierarchicalScheme
from mindspore_hyper.moe.overlap_stats import overlap_report
from mindspore_hyper.moe.token_routing import route_call
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["ExpertParallel", "ExpertInputs", "ExpertOutputs"]


class ExpertParallel:
    """The expert-parallel engine of one MoE layer (see module docstring): it routes, runs the
    experts and keeps the states, the background thread and the statistics; its dispatch scheme
    (`FlatScheme`, or `HierarchicalScheme` for `MoE(dispatch="hierarchical")` over more than one
    device) moves the rows.

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
        self._flat = FlatScheme(self)
        self._scheme = HierarchicalScheme(self) if moe.dispatch == "hierarchical" else self._flat

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
    def _prepare(self, x: DTensor) -> Prepared:
        """Lay the tokens out, route them and plan every device's dispatch (no exchange yet)."""
        self.last_stats = {}
        # one member: nothing for the hierarchical dispatch to de-duplicate
        return route_call(self.moe, x, self.placement, lambda axes: self._scheme if axes.members > 1 else self._flat)

    # -- dispatch -----------------------------------------------------------------------------------
    def _dispatch(self, prep: Prepared, microbatch: Hashable, rows: slice) -> ExpertInputs:
        self._start_dispatch(prep, microbatch, rows, background=False)
        return self._receive_dispatch(microbatch)

    def _start_dispatch(self, prep: Prepared, microbatch: Hashable, rows: slice, background: bool) -> None:
        """Plan the chunk `rows` of every device's tokens and start sending it (in the background
        under msrun when `background`); the state waits under `microbatch`."""
        state = State(prep, rows)
        whole = rows == slice(None)
        chunk_tokens: Dict[Key, Tensor] = {}
        for key, full in prep.plans.items():
            plan = full if whole else full.chunk(rows.start, rows.stop)
            state.plans[key] = plan if self.placement is None else self.placement.physical_plan(plan)
            chunk_tokens[key] = prep.tokens[key] if whole else ops.narrow(prep.tokens[key], 0, rows.start,
                                                                          rows.stop - rows.start)
            state.gates[key] = prep.gates[key] if whole else ops.narrow(prep.gates[key], 0, rows.start,
                                                                          rows.stop - rows.start)
        prep.scheme.start_dispatch(state, chunk_tokens, background)
        self.states.put(microbatch, state)

    def _receive_dispatch(self, microbatch: Hashable) -> ExpertInputs:
        """What the dispatch of `microbatch` delivered (waits for its exchange under msrun)."""
        state = self.states.peek(microbatch)
        return ExpertInputs(microbatch, state.prep.scheme.receive_dispatch(state))

    # -- the background thread (overlap chunks under msrun) ----------------------------------------
    def run_exchange(self, job, background: bool) -> Future:
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

    def wait_exchange(self, future: Future):
        """The result of a `run_exchange`; the seconds waited go to last_stats."""
        start = time.perf_counter()
        result = future.result()
        end = time.perf_counter()
        self.last_stats["wait_seconds"] = self.last_stats.get("wait_seconds", 0.0) + end - start
        self.last_stats.setdefault("wait_intervals", []).append((start, end))
        return result

    # -- expert compute -----------------------------------------------------------------------------
    def compute(self, inputs: ExpertInputs) -> ExpertOutputs:
        """Every local expert on the rows it received (`expert_compute.run_experts`)."""
        state = self.states.peek(inputs.microbatch)
        return ExpertOutputs(inputs.microbatch, run_experts(state, inputs.received, self.placement))

    # -- combine ------------------------------------------------------------------------------------
    def _combine(self, outputs: ExpertOutputs) -> Dict[Key, Tensor]:
        self._start_combine(outputs, background=False)
        return self._receive_combine(outputs.microbatch)

    def _start_combine(self, outputs: ExpertOutputs, background: bool) -> None:
        """Start sending the expert outputs back to their tokens' devices."""
        state = self.states.peek(outputs.microbatch)
        state.prep.scheme.start_combine(state, outputs.outputs, background)

    def _receive_combine(self, microbatch: Hashable) -> Dict[Key, Tensor]:
        """Wait for the outputs of `microbatch` and sum each token's copies; forgets its state."""
        state = self.states.pop(microbatch)
        shards = state.prep.scheme.receive_combine(state)
        if state.chain is not None:  # msrun: the last exchange joins the output (see ProcessExchange.chained)
            shards = {key: ProcessExchange.chained(shard, state.chain) for key, shard in shards.items()}
        return shards

    def _assemble(self, prep: Prepared, chunks: List[Dict[Key, Tensor]]):
        """(y DTensor shaped like the layer's input, aux loss DTensor) from the chunks' shards."""
        ex = prep.weights[0].execution
        shards = {key: chunks[0][key] if len(chunks) == 1 else ops.concat([c[key] for c in chunks], 0)
                  for key in chunks[0]}
        total = math.prod(prep.x_shape[:-1])
        dtype = prep.weights[0].dtype
        y = DTensor._create(prep.layout, shards, (total, self.moe.hidden), dtype, ex)
        aux = DTensor._create(TensorLayout.replicated(ex.mesh, 0), {(): prep.aux}, (), prep.aux.dtype, ex)
        return y.reshape(prep.x_shape), aux