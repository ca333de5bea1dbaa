"""Step time and MFU of a transformer job on a hardware: `estimate_step_time` (docs/estimate.md).

One step = the pipelined micro-batches (the schedule simulator's makespan, `pipeline_time`) +
the exposed part of the data-parallel gradient sync + the optimizer step (+ ZeRO-1's parameter
all-gather). Per layer and micro-batch:

- compute: each op of `layer_ops` timed by its roofline; backward = the input gradient (GEMMs
  again, memory ops x 2, the attention core x 2, x 2.5 with a flash kernel that recomputes the
  scores) + the weight gradient (the weighted GEMMs again); recompute: full = the forward again
  (with its tensor-parallel communication), selective = the attention core (and scores) again;
  with recompute_scope="stage" (mindspore_hyper's pipeline runtime) the last stage's backward
  also runs its final norm, LM head and loss forward again.
- tensor parallel (Megatron): 2 all-reduces of T h e bytes forward and 2 backward; with sequence
  parallelism 2 all-gathers + 2 reduce-scatters each way (same bytes); exposed, except with
  `tp_backward_overlap` the backward's two input-gradient collectives of the column-parallel
  linears (qkv, MLP up), each hidden up to its linear's weight-gradient GEMM.
- context parallel: ring: (cp - 1) K/V blocks of T 2kv e bytes passed forward, hidden behind
  the attention core up to its time; backward (the hand-written ring of
  `dtensor/context_parallel/ring_core.py`) (cp - 1) steps of the K/V blocks and their gradient
  accumulators (twice the bytes), hidden behind the attention core's backward, then one more
  accumulator shift that brings each gradient home, exposed (nothing is left to overlap);
  Ulysses: 4 AllToAlls (q, k, v, output) forward and 4 backward, exposed; all-gather (Llama 3,
  Dubey et al. 2024 section 3.3.2): the whole sequence's K/V (cp T 2kv e bytes) all-gathered
  before the attention and their gradients reduce-scattered after its backward, exposed (the
  paper: the all-gather's latency lies on the critical path).
- expert parallel: 2 AllToAlls (dispatch, combine) of T top_k h e bytes forward, 2 backward.
- ZeRO-3: each layer's parameters all-gathered forward and backward and its gradients
  reduce-scattered, prefetched: hidden behind the layer's compute up to its time.
- gradient accumulation: inside the weight-gradient GEMMs (free), or with
  `grad_accumulation_fused=False` a separate add of each micro-batch's weight gradients into the
  step's buffer, 3 e bytes per local parameter at the memory bandwidth, in the weight-gradient phase.

Mesh order (innermost first): tensor, context, data (expert groups inside it), pipeline; each
axis's group spans the hardware levels `collective_time.group_fanouts` says. A stage-to-stage
transfer is `collective_time.transfer_seconds` of one activation, T h e / t bytes with tensor
parallelism (Megatron's scatter-gather: each tensor-parallel rank sends its 1/t; the receiver
then all-gathers it over the tensor group, a collective on its critical path; none with sequence
parallelism, whose stage boundary is sequence-sharded already); no peer wait: the schedule
simulation makes a receive wait for its sender. With `p2p_overlap=False` (Megatron-LM 2021-2022:
blocking transfers) each send also stops its sender for the transfer, charged inside the stage's
forward and backward. On a profile whose processes share cores
(`Hardware.core_sharing`, the `cpu` profile), the pipelined part is simulated with the speeds
of `core_sharing.StageSpeeds` (k computing pipeline ranks are k x data x tensor x context processes; bound
processes share only their own core):
the breakdown's "shared cores" is the makespan's change from it. The data-parallel
sync (over data x context) is reduce-scatter (ZeRO >= 1, followed by the parameter all-gather
after the step for ZeRO-1 and 2) or all-reduce, of the stage's gradient bytes, once per step
(ZeRO-2: once per micro-batch, as it keeps only a gradient shard); each overlaps a micro-batch's
backward ((L - 1)/L of it: a layer's gradients are ready when its backward ends), or none of it
with `grad_sync_overlap=False` (a sync after the backward, Megatron-LM's `local` DDP).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union

from mindspore_hyper.estimate.collective_time import (collective_seconds, group_fanouts, levels_spanned,
                                                      transfer_seconds)
from mindspore_hyper.estimate.hardware import Hardware, load_hardware
from mindspore_hyper.estimate.job import _check_fit, _local, stage_layers
from mindspore_hyper.estimate.layer_ops import (FLASH_BACKWARD, OPTIMIZER_KEY, head_forward_ops, layer_forward_ops,
                                                model_flops_per_token, op_phase_seconds)
from mindspore_hyper.estimate.transformer_config import TransformerConfig
from mindspore_hyper.estimate.pipeline_time import PipelineTime, pipeline_makespan, rank_stages
from mindspore_hyper.estimate.strategy import JobStrategy

__all__ = ["CommTerm", "LayerTime", "StepTimeEstimate", "estimate_step_time", "global_batch"]

FP32_BYTES = 4


@dataclass(frozen=True)
class CommTerm:
    """One communication pattern of the step, summed over the step on one device.

    Attributes:
        name: what it moves ("tensor parallel forward", ...).
        collective: all_reduce, all_gather, reduce_scatter, all_to_all or send_recv.
        axis: the mesh axis ("tensor", "context", "expert", "data", "pipeline").
        levels: the hardware levels the group spans.
        count: collectives per step on the device.
        bytes: bytes per collective (the alpha-beta formula's n).
        seconds: total seconds per step.
        hidden: of which overlapped with compute.
    """

    name: str
    collective: str
    axis: str
    levels: tuple
    count: float
    bytes: float
    seconds: float
    hidden: float = 0.0

    @property
    def exposed(self) -> float:
        return self.seconds - self.hidden


@dataclass(frozen=True)
class LayerTime:
    """Seconds of one transformer layer for one micro-batch on one device.

    Attributes:
        forward, backward_input, backward_weight, recompute: compute seconds.
        comm_forward, comm_backward: exposed communication seconds inside the layer.
        ops: the forward ops with their roofline seconds.
    """

    forward: float
    backward_input: float
    backward_weight: float
    recompute: float
    comm_forward: float
    comm_backward: float
    ops: tuple = ()

    @property
    def total(self) -> float:
        return (self.forward + self.backward_input + self.backward_weight + self.recompute + self.comm_forward
                + self.comm_backward)


@dataclass
class StepTimeEstimate:
    """Predicted time of one training step.

    Attributes:
        seconds: the step.
        mfu: model FLOPs (3 x forward, no recomputation) / (seconds x devices x peak).
        tokens_per_second: global batch x sequence / seconds.
        global_batch: sequences per step.
        model_flops: per step, all devices.
        layer: one layer's times (compute and exposed communication).
        comm: every communication term of the step.
        pipeline: the pipelined part (makespan, bubble, how it was obtained).
        optimizer: seconds of the optimizer step.
        grad_sync_exposed: exposed seconds of the data-parallel gradient sync (and ZeRO-1's gather).
        breakdown: seconds by part (compute, exposed comm, bubble, shared cores where the hardware's
            processes share cores, grad sync, optimizer) summing to `seconds`.
        hardware: the hardware's name.
        config, strategy: the inputs.
    """

    seconds: float
    mfu: float
    tokens_per_second: float
    global_batch: int
    model_flops: float
    layer: LayerTime
    comm: List[CommTerm]
    pipeline: PipelineTime
    optimizer: float
    grad_sync_exposed: float
    breakdown: Dict[str, float]
    hardware: str
    config: TransformerConfig
    strategy: JobStrategy
    notes: List[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "mfu": self.mfu, "tokens_per_second": self.tokens_per_second,
                "global_batch": self.global_batch, "model_flops": self.model_flops, "hardware": self.hardware,
                "breakdown": dict(self.breakdown),
                "layer": {k: getattr(self.layer, k) for k in ("forward", "backward_input", "backward_weight",
                                                              "recompute", "comm_forward", "comm_backward")},
                "pipeline": {"makespan": self.pipeline.makespan, "bubble": self.pipeline.bubble,
                             "bubble_fraction": self.pipeline.bubble_fraction, "sharing": self.pipeline.sharing,
                             "source": self.pipeline.source,
                             "simulated_microbatches": self.pipeline.simulated_microbatches},
                "comm": [{"name": c.name, "collective": c.collective, "axis": c.axis, "levels": list(c.levels),
                          "count": c.count, "bytes": c.bytes, "seconds": c.seconds, "hidden": c.hidden,
                          "exposed": c.exposed} for c in self.comm],
                "optimizer": self.optimizer, "notes": list(self.notes)}

    def __str__(self) -> str:
        st = self.strategy
        exposed = (self.layer.comm_forward + self.layer.comm_backward) * 1e3
        lines = [f"step {self.seconds:.4g} s on {self.hardware} ({st.devices} devices), MFU {self.mfu:.1%}, "
                 f"{self.tokens_per_second:,.0f} tokens/s, global batch {self.global_batch}",
                 "  " + ", ".join(f"{k} {v:.4g} s" for k, v in self.breakdown.items()),
                 f"  per layer and micro-batch: forward {self.layer.forward * 1e3:.3g} ms, backward "
                 f"{(self.layer.backward_input + self.layer.backward_weight) * 1e3:.3g} ms, recompute "
                 f"{self.layer.recompute * 1e3:.3g} ms, exposed comm {exposed:.3g} ms",
                 f"  pipeline ({st.schedule}, {self.pipeline.source}): bubble {self.pipeline.bubble:.4g} s "
                 f"({self.pipeline.bubble_fraction:.1%} of the pipelined part)"]
        for c in self.comm:
            if c.seconds:
                lines.append(f"  comm {c.name}: {c.count:g} x {c.collective} of {c.bytes / 2**20:.3g} MiB over "
                             f"{'+'.join(c.levels) or 'one device'}: {c.seconds:.4g} s ({c.exposed:.4g} s exposed)")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def global_batch(config: TransformerConfig, strategy: JobStrategy) -> int:
    """Sequences per step: micro-batches x micro_batch x data (context parallel splits sequences)."""
    return strategy.step_microbatches * config.micro_batch * strategy.data


def _check_hardware(strategy: JobStrategy, hw: Hardware, config: TransformerConfig) -> None:
    if strategy.devices > hw.max_devices:
        raise ValueError(f"strategy: {strategy.devices} devices; hardware {hw.name!r} has {hw.max_devices}")
    if strategy.inference:
        raise ValueError("inference=True: estimate_step_time models a training step")
    if strategy.offload_params != "device" or strategy.offload_optimizer != "device":
        raise ValueError("offload_params/offload_optimizer: the step-time model covers device-resident states only "
                         "(no host/disk transfer model); leave them at 'device'")
    p, m = strategy.pipeline, strategy.step_microbatches
    least = 2 * p if strategy.schedule == "dualpipe_v" else p
    if p > 1 and strategy.schedule != "gpipe" and m < least:
        raise ValueError(f"microbatches={m}: schedule={strategy.schedule!r} needs at least {least} micro-batches "
                         f"with pipeline={p}")
    if strategy.schedule == "interleaved_1f1b" and m % p:
        raise ValueError(f"microbatches={m}: schedule='interleaved_1f1b' needs a multiple of pipeline={p}")
    if config.layers < strategy.pipeline * strategy.chunks:
        raise ValueError(f"chunks={strategy.chunks}: pipeline x chunks = {strategy.pipeline * strategy.chunks} "
                         f"virtual stages, more than the {config.layers} layers")


def _layer_time(config: TransformerConfig, st: JobStrategy, hw: Hardware, fan: Dict[str, tuple],
                terms: Dict[str, list]) -> LayerTime:
    """One layer per micro-batch; appends per-layer communication (count 1) to `terms`."""
    ops = layer_forward_ops(config, st, hw.attention)
    phases = tuple((op, op_phase_seconds(op, hw)) for op in ops)
    timed = tuple((op, f) for op, (f, _, _) in phases)
    forward = sum(f for _, (f, _, _) in phases)
    backward_input = sum(bi for _, (_, bi, _) in phases)
    weight = sum(bw for _, (_, _, bw) in phases)
    attention = sum(t for op, t in timed if op.kind == "attention" or op.name == "scores")
    core = sum(t for op, t in timed if op.kind == "attention")
    e = config.dtype_bytes
    tokens = config.micro_batch * config.seq_len / st.context_parallel
    h = config.hidden

    def term(name: str, kind: str, axis: str, count: int, nbytes: float, hide: float = 0.0) -> float:
        seconds = count * collective_seconds(kind, nbytes, hw, fan[axis])
        hidden = min(seconds, hide)
        terms[name] = [kind, axis, count, nbytes, seconds, hidden]
        return seconds - hidden

    comm_f = comm_b = 0.0
    if st.tensor > 1:
        # the column-parallel linears' weight-gradient GEMMs, behind which tp_backward_overlap hides
        # the collective of their input gradients (one each), up to each GEMM's time
        wgrads = [bw for op, (_, _, bw) in phases if op.name == "qkv" or op.name.endswith("up")]
        one = collective_seconds("reduce_scatter" if st.sequence_parallel else "all_reduce", tokens * h * e, hw,
                                 fan["tensor"])
        hide = sum(min(one, w) for w in wgrads) if st.tp_backward_overlap else 0.0
        if st.sequence_parallel:
            comm_f += term("tensor parallel forward (all-gather)", "all_gather", "tensor", 2, tokens * h * e)
            comm_f += term("tensor parallel forward (reduce-scatter)", "reduce_scatter", "tensor", 2, tokens * h * e)
            comm_b += term("tensor parallel backward (all-gather)", "all_gather", "tensor", 2, tokens * h * e)
            comm_b += term("tensor parallel backward (reduce-scatter)", "reduce_scatter", "tensor", 2, tokens * h * e,
                           hide)
        else:
            comm_f += term("tensor parallel forward", "all_reduce", "tensor", 2, tokens * h * e)
            comm_b += term("tensor parallel backward", "all_reduce", "tensor", 2, tokens * h * e, hide)
    cp = st.context_parallel
    kv = math.ceil(config.kv_heads / st.tensor) * config.head_dim
    if cp > 1 and st.context_method == "ring":
        block = tokens * 2 * kv * e
        comm_f += term("context ring forward (K/V blocks)", "send_recv", "context", cp - 1, block, core)
        comm_b += term("context ring backward (K/V and their gradients)", "send_recv", "context", cp - 1, 2 * block,
                       core * (FLASH_BACKWARD if hw.attention == "flash" else 2.0))
        comm_b += term("context ring backward (gradients home)", "send_recv", "context", 1, block)
    elif cp > 1 and st.context_method == "all_gather":
        gathered = cp * tokens * 2 * kv * e  # the whole sequence's K/V (n = the gathered buffer)
        comm_f += term("context all-gather forward (K/V)", "all_gather", "context", 1, gathered)
        comm_b += term("context reduce-scatter backward (K/V gradients)", "reduce_scatter", "context", 1, gathered)
    elif cp > 1:
        width = 2 * h / st.tensor + 2 * kv
        comm_f += term("context Ulysses forward (q, k, v, output)", "all_to_all", "context", 1, tokens * width * e)
        comm_b += term("context Ulysses backward", "all_to_all", "context", 1, tokens * width * e)
    if config.experts and st.expert > 1:
        routed = tokens * config.top_k * h * e
        comm_f += term("expert AllToAll forward (dispatch, combine)", "all_to_all", "expert", 2, routed)
        comm_b += term("expert AllToAll backward", "all_to_all", "expert", 2, routed)
    if st.zero_stage == 3 and st.replicas > 1:
        local = (config.layer_params().total / st.tensor) * e
        comm_f += term("ZeRO-3 parameter all-gather forward", "all_gather", "replicas", 1, local, forward)
        comm_b += term("ZeRO-3 parameter all-gather and gradient reduce-scatter backward", "all_gather", "replicas",
                       2, local, backward_input + weight)
    recompute = 0.0
    if st.recompute == "full":
        recompute = forward + comm_f
    elif st.recompute == "selective":
        recompute = attention
    return LayerTime(forward, backward_input, weight, recompute, comm_f, comm_b,
                     tuple((op.name, op.kind, op.flops, op.bytes, t) for op, t in timed))


def _head_time(config: TransformerConfig, st: JobStrategy, hw: Hardware) -> tuple:
    phases = [op_phase_seconds(op, hw) for op in head_forward_ops(config, st)]
    return tuple(sum(p[i] for p in phases) for i in range(3))


def estimate_step_time(config: TransformerConfig, strategy: JobStrategy,
                       hardware: Union[str, Hardware, dict] = "a100-80gb",
                       simulation_limit: Optional[int] = None) -> StepTimeEstimate:
    """Predict one training step's seconds, MFU and tokens/s, with the breakdown (module doc).

    Args:
        config: the model and micro-batch (`micro_batch` sequences per data-parallel rank).
        strategy: sizes, ZeRO, recomputation, schedule; `microbatches` (default: pipeline)
            x micro_batch x data is the global batch.
        hardware: a preset name (`hardware_presets()`), a YAML path, a mapping or a Hardware.
        simulation_limit: ranks x micro-batches simulated at most (default
            `pipeline_time.SIMULATION_LIMIT`); beyond it the published bubble formula.

    Returns:
        The StepTimeEstimate.

    Raises:
        ValueError: config, strategy and hardware that do not fit together (named in the message).
    """
    hw = load_hardware(hardware)
    _check_fit(config, strategy)
    _check_hardware(strategy, hw, config)
    st, c = strategy, config
    t, cp, d, p = st.tensor, st.context_parallel, st.data, st.pipeline
    fan = {"tensor": group_fanouts(hw, t, 1), "context": group_fanouts(hw, cp, t),
           "data": group_fanouts(hw, d, t * cp), "expert": group_fanouts(hw, st.expert, t * cp),
           "replicas": group_fanouts(hw, d * cp, t), "pipeline": group_fanouts(hw, 2 if p > 1 else 1, t * cp * d)}
    layer_terms: Dict[str, list] = {}
    layer = _layer_time(c, st, hw, fan, layer_terms)
    head_f, head_bi, head_w = _head_time(c, st, hw)
    e = c.dtype_bytes
    tokens = c.micro_batch * c.seq_len / cp
    head_comm = 0.0
    if t > 1 and st.sequence_parallel:
        head_comm = 2 * collective_seconds("all_gather", tokens * c.hidden * e, hw, fan["tensor"])
    m, v = st.step_microbatches, st.chunks
    virtual = p * v
    layer_f = layer.forward + layer.comm_forward
    layer_bi = layer.backward_input + layer.recompute + layer.comm_backward
    head_recompute = head_f + head_comm / 2 if st.recompute_scope == "stage" else 0.0
    p2p_bytes = tokens * c.hidden * e / (t if t > 1 else 1)  # Megatron's scatter-gather across stages
    p2p = transfer_seconds(p2p_bytes, hw, fan["pipeline"])
    # the receiver all-gathers a scattered activation (or gradient) over the tensor group before using
    # it (`gather_split_1d_tensor`); with sequence parallelism the stage boundary is sequence-sharded already
    gather = collective_seconds("all_gather", tokens * c.hidden * e, hw, fan["tensor"]) \
        if p > 1 and t > 1 and not st.sequence_parallel else 0.0
    send = 0.0 if st.p2p_overlap else p2p  # a blocking transfer stops its sender until it has arrived
    accumulate = _accumulation_seconds(c, st, hw)
    forward, backward_input, backward_weight, stage_comm = [], [], [], []
    for vs in range(virtual):
        n = stage_layers(c.layers, virtual, vs)
        first, last = vs == 0, vs == virtual - 1
        f_comm = (0.0 if first else gather) + (0.0 if last else send)  # receive the input, send the output
        b_comm = (0.0 if last else gather) + (0.0 if first else send)  # receive the gradient, send the input's
        forward.append(n * layer_f + (head_f + head_comm / 2 if last else 0.0) + f_comm)
        backward_input.append(n * layer_bi + (head_bi + head_comm / 2 + head_recompute if last else 0.0) + b_comm)
        backward_weight.append(n * (layer.backward_weight + accumulate["layer"]) + (head_w if last else 0.0)
                               + (accumulate["embedding"] if first else 0.0) + (accumulate["head"] if last else 0.0))
        stage_comm.append(f_comm + b_comm)
    kwargs = {"simulation_limit": simulation_limit} if simulation_limit is not None else {}
    if hw.core_sharing is not None:  # each pipeline rank is d x t x cp processes
        kwargs["speeds"] = hw.core_sharing.stage_speeds(p, d * t * cp)
    pipe = pipeline_makespan(st.schedule, p, m, v, forward, backward_input, backward_weight, p2p - send, **kwargs)

    # per step communication terms
    busiest_layers = max(stage_layers(c.layers, p, k) for k in range(p))
    comm: List[CommTerm] = []
    for name, (kind, axis, count, nbytes, seconds, hidden) in layer_terms.items():
        n = busiest_layers * m * (2 if st.recompute == "full" and "forward" in name else 1)
        comm.append(CommTerm(name, kind, axis, levels_spanned(hw, fan[axis]), count * n, nbytes, seconds * n,
                             hidden * n))
    if p > 1:
        hidden_p2p = 2 * m * v * p2p - 2 * (p - 1) * p2p if st.p2p_overlap else 0.0
        comm.append(CommTerm("pipeline activations and gradients", "send_recv", "pipeline",
                             levels_spanned(hw, fan["pipeline"]), 2 * m * v, p2p_bytes, 2 * m * v * p2p, hidden_p2p))
    if gather:
        comm.append(CommTerm("pipeline scatter-gather (all-gather of what a stage received)", "all_gather", "tensor",
                             levels_spanned(hw, fan["tensor"]), 2 * m * v, tokens * c.hidden * e,
                             2 * m * v * gather, 0.0))
    # the busiest rank's stage-boundary communication inside its forwards and backwards (exposed)
    exposed_stage_comm = m * max(sum(stage_comm[s] for s in stages)
                                 for stages in rank_stages(st.schedule, p, v)) if p > 1 else 0.0

    # data-parallel gradient sync, optimizer
    stage_params = max(_stage_local_params(c, st, k) for k in range(p))
    grad_bytes = stage_params * e
    replicas = st.replicas
    sync = exposed_sync = 0.0
    notes: List[str] = []
    if replicas > 1 and st.zero_stage < 3:
        kind = "reduce_scatter" if st.zero_stage >= 1 else "all_reduce"
        # ZeRO-2 keeps only a gradient shard, so every micro-batch's gradients are reduce-scattered
        syncs = m if st.zero_stage == 2 else 1
        one = collective_seconds(kind, grad_bytes, hw, fan["replicas"])
        overlap = (layer.backward_input + layer.backward_weight + layer.recompute) * max(busiest_layers - 1, 0)
        if not st.grad_sync_overlap:  # after the backward (Megatron's local DDP): nothing hidden
            overlap = 0.0
        sync, hidden = syncs * one, syncs * min(one, overlap)
        comm.append(CommTerm(f"data-parallel gradient {kind.replace('_', '-')}", kind, "data",
                             levels_spanned(hw, fan["replicas"]), syncs, grad_bytes, sync, hidden))
        exposed_sync = sync - hidden
        if st.zero_stage >= 1:
            gather = collective_seconds("all_gather", grad_bytes, hw, fan["replicas"])
            comm.append(CommTerm("ZeRO-1/2 parameter all-gather after the step", "all_gather", "data",
                                 levels_spanned(hw, fan["replicas"]), 1, grad_bytes, gather, 0.0))
            exposed_sync += gather
    if c.tied_embeddings and p > 1:
        ends = group_fanouts(hw, 2, t * cp * d * (p - 1))  # the first and the last stage
        tied = collective_seconds("all_reduce", c.vocab * c.hidden / t * e, hw, ends)
        comm.append(CommTerm("tied embedding gradient (first and last stage)", "all_reduce", "pipeline",
                             levels_spanned(hw, ends), 1, c.vocab * c.hidden / t * e, tied, 0.0))
        exposed_sync += tied
    master = st.master_weights if st.master_weights is not None else e < FP32_BYTES
    per_param = 2 * e + 2 * FP32_BYTES * (st.optimizer_states + (1 if master else 0))
    optimizer_params = stage_params / (replicas if st.zero_stage >= 1 else 1)
    if OPTIMIZER_KEY in hw.kernels:  # measured seconds per parameter of the optimizer step
        optimizer = optimizer_params * hw.kernels[OPTIMIZER_KEY][0]
    else:
        optimizer = optimizer_params * per_param / (hw.memory_bandwidth * hw.efficiency.memory)

    seconds = pipe.makespan + exposed_sync + optimizer
    batch = global_batch(c, st)
    model_flops = model_flops_per_token(c) * batch * c.seq_len
    mfu = model_flops / (seconds * st.devices * hw.peak_flops)
    exposed_layer_comm = busiest_layers * m * (layer.comm_forward + layer.comm_backward +
                                               (layer.comm_forward if st.recompute == "full" else 0.0))
    compute = pipe.work - exposed_layer_comm - exposed_stage_comm
    breakdown = {"compute": compute, "exposed communication": exposed_layer_comm + exposed_stage_comm,
                 "pipeline bubble": pipe.bubble}
    if hw.core_sharing is not None:
        breakdown["shared cores"] = pipe.sharing
    breakdown.update({"gradient sync (exposed)": exposed_sync, "optimizer": optimizer})
    if pipe.source == "formula":
        notes.append(f"pipeline bubble from the published formula ({p} x {m} exceeds the simulation limit)")
    if hw.attention == "materialized":
        notes.append("attention: materialised scores (the full s x s computed and stored)")
    if hw.core_sharing is not None:
        cs = hw.core_sharing
        notes.append(f"processes share {cs.cores} cores (kernels measured with {cs.processes} processes x "
                     f"{cs.threads} threads computing); shared cores {pipe.sharing:+.4g} s")
    if hw.validated is not None:  # the preset's `validated:` field (docs/estimate.md, "Held-out validation")
        if hw.validated.lower().startswith("unvalidated"):
            why = hw.validated[len("unvalidated"):].lstrip(" :;,-")
            notes.append(f"step time on {hw.name}: factors unvalidated on this hardware" + (f" ({why})" if why else ""))
        else:
            notes.append(f"step time on {hw.name}: how the factors were checked: {hw.validated}")
    return StepTimeEstimate(seconds=seconds, mfu=mfu, tokens_per_second=batch * c.seq_len / seconds,
                            global_batch=batch, model_flops=model_flops, layer=layer, comm=comm, pipeline=pipe,
                            optimizer=optimizer, grad_sync_exposed=exposed_sync, breakdown=breakdown,
                            hardware=hw.name, config=c, strategy=st, notes=notes)


def _accumulation_seconds(config: TransformerConfig, strategy: JobStrategy, hw: Hardware) -> Dict[str, float]:
    """Seconds per micro-batch of the separate gradient-accumulation add (`grad_accumulation_fused=False`):
    one layer's, the embedding's (first stage) and the head's (last stage) local parameters x 3
    dtype bytes (read the gradient, read and write the buffer) at the memory bandwidth; 0 when fused."""
    pieces = {"layer": config.layer_params(), "embedding": config.embedding_params(),
              "head": config.head_params(separate_copy=strategy.pipeline > 1)}
    if strategy.grad_accumulation_fused:
        return {k: 0.0 for k in pieces}
    rate = hw.memory_bandwidth * hw.efficiency.memory
    return {k: _local(pc, config, strategy).total * 3 * config.dtype_bytes / rate for k, pc in pieces.items()}


def _stage_local_params(config: TransformerConfig, strategy: JobStrategy, stage: int) -> float:
    """Parameters on one device of `stage` after tensor and expert parallelism (no ZeRO)."""
    from mindspore_hyper.estimate.job import _stage_pieces

    return float(sum(pc.total for pc in _stage_pieces(config, strategy, stage)))
