"""Whole-job memory estimate: a TransformerConfig x a JobStrategy -> bytes per device, per stage.

Per device of pipeline stage k (d data, t tensor, p pipeline, cp context parallel, e = dtype_bytes;
the ZeRO group is the d x cp ranks holding the same parameters, written d below):

- parameters: the stage's pieces (embedding on stage 0; layers; final norm and head on the last
  stage), each count divided as ParamCounts says (tensor / expert parallel), times e; ZeRO-3
  divides by d (experts by d / expert). Rounded up per piece, as a padded partition would be.
- gradients: like the parameters (e bytes each); ZeRO-2 and 3 divide by d.
- optimizer states: 4 bytes x optimizer_states per parameter, plus 4 for fp32 master weights;
  ZeRO-1, 2 and 3 divide by d.
- offload: parameters off the device leave on it the largest piece being used (its parameters and
  gradients, like DeepSpeed's ZeRO-3 offload estimate); the rest, and offloaded optimizer states,
  are counted in the host or disk tier.
- activations ("megatron"): Table 2's bytes per layer x the stage's layers x in-flight
  micro-batches (1F1B: min(p - k, microbatches)); on the last stage the fp32 logits for the
  cross-entropy, 4sbv/t bytes per in-flight micro-batch. Like Table 2, the transient buffers of
  a layer being recomputed are not counted. Inference: one layer's activations without the attention core
  (Table 2's selective-recompute row; fused attention never materialises the scores), no logits.
- activations ("simulation"): `simulation_activation_bytes` (every forward tensor of the
  examples' GPT, all layers: the simulation runs all stages' layers in one program).
- context parallel: activations (and the last stage's logits) divided by cp.
- KV cache (inference): 2 x layers x b x ceil(s / cp) x ceil(kv_heads / t) x head_dim x e.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from mindspore_hyper.estimate.activations import TABLE2_ROWS, activation_bytes_per_layer, table2_row
from mindspore_hyper.estimate.transformer_config import ParamCounts, TransformerConfig
from mindspore_hyper.estimate.simulation_activations import simulation_activation_bytes
from mindspore_hyper.estimate.strategy import JobStrategy
from mindspore_hyper.units import format_bytes

__all__ = ["StageEstimate", "JobEstimate", "estimate_job", "estimate_stage", "stage_layers", "in_flight_microbatches",
           "format_bytes", "DEVICE_KINDS"]

DEVICE_KINDS = ("parameters", "gradients", "optimizer_states", "activations", "kv_cache")
FP32_BYTES = 4


@dataclass
class StageEstimate:
    """Bytes per device of one pipeline stage.

    Attributes:
        stage: pipeline stage index.
        layers: transformer layers on the stage.
        in_flight: micro-batches whose activations the stage holds (0 for inference; fractional
            for the interleaved schedule, in units of the stage's whole share).
        parameters, gradients, optimizer_states, activations, kv_cache: device bytes.
        host, disk: bytes offloaded to host memory and to disk, per device.
        notes: how the figures were counted.
    """

    stage: int
    layers: int
    in_flight: float
    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    kv_cache: int
    host: int = 0
    disk: int = 0
    notes: List[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Device bytes: parameters + gradients + optimizer states + activations + KV cache."""
        return sum(getattr(self, kind) for kind in DEVICE_KINDS)

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("stage", "layers", "in_flight") + DEVICE_KINDS}
        out.update(total=self.total, host=self.host, disk=self.disk, notes=list(self.notes))
        return out


@dataclass
class JobEstimate:
    """The estimate of every pipeline stage, and whether the worst one fits `device_memory`."""

    config: TransformerConfig
    strategy: JobStrategy
    stages: List[StageEstimate]
    device_memory: Optional[int] = None

    @property
    def peak(self) -> StageEstimate:
        """The stage needing the most device memory."""
        return max(self.stages, key=lambda s: s.total)

    @property
    def fits(self) -> Optional[bool]:
        """Whether every stage fits `device_memory` (None when no budget was given)."""
        return None if self.device_memory is None else self.peak.total <= self.device_memory

    def to_dict(self) -> dict:
        return {"config": self.config.to_dict(), "strategy": self.strategy.to_dict(),
                "total_params": self.config.total_params(), "devices": self.strategy.devices,
                "device_memory": self.device_memory, "fits": self.fits, "peak_stage": self.peak.stage,
                "peak_bytes": self.peak.total, "stages": [s.to_dict() for s in self.stages]}

    def __str__(self) -> str:
        c, st = self.config, self.strategy
        context = f" x context {st.context_parallel} ({st.context_method})" if st.context_parallel > 1 else ""
        lines = [f"model: {c.layers} layers, hidden {c.hidden}, heads {c.heads}, ffn {c.ffn}, vocab {c.vocab}, "
                 f"seq {c.seq_len}, micro-batch {c.micro_batch}, {c.dtype_bytes}-byte elements, "
                 f"{c.total_params() / 1e6:.1f}M parameters",
                 f"strategy: data {st.data} x tensor {st.tensor} x pipeline {st.pipeline}"
                 f"{context} = {st.devices} devices"
                 f"{', expert ' + str(st.expert) if st.expert > 1 else ''}"
                 f"{', sequence parallel' if st.sequence_parallel else ''}, ZeRO-{st.zero_stage}, "
                 f"recompute {st.recompute}, {'inference' if st.inference else 'training'}, "
                 f"activations: {st.activation_model}"]
        head = ["stage", "layers", "in-flight", "parameters", "gradients", "optimizer", "activations", "kv cache",
                "device total", "host", "disk"]
        rows = [[str(s.stage), str(s.layers), f"{s.in_flight:g}"] +
                [format_bytes(getattr(s, k)) for k in DEVICE_KINDS] +
                [format_bytes(s.total), format_bytes(s.host), format_bytes(s.disk)] for s in self.stages]
        widths = [max(len(x) for x in col) for col in zip(head, *rows)]
        fmt = "  ".join("{:>%d}" % w for w in widths)
        lines += [fmt.format(*head)] + [fmt.format(*r) for r in rows]
        if self.device_memory is not None:
            verdict = "fits" if self.fits else "does NOT fit"
            lines.append(f"peak: stage {self.peak.stage} needs {format_bytes(self.peak.total)}; {verdict} in "
                         f"{format_bytes(self.device_memory)} per device")
        notes = dict.fromkeys(n for s in self.stages for n in s.notes)
        lines += [f"note: {n}" for n in notes]
        return "\n".join(lines)


def stage_layers(layers: int, pipeline: int, stage: int) -> int:
    """Transformer layers on `stage`: an even split, the remainder going to the last stages."""
    extra = layers % pipeline
    return layers // pipeline + (1 if stage >= pipeline - extra else 0)


def in_flight_microbatches(strategy: JobStrategy, stage: int) -> float:
    """Micro-batches whose activations `stage` holds at once, in units of one micro-batch through
    the stage's whole share of the model: the strategy's `in_flight`, else by its schedule (m
    micro-batches, p stages, v chunks per rank, stage k):

    - 1f1b, zb_h1, zb_v: min(p - k, m) (zero-bubble schedules keep 1F1B's peak, Qi et al.);
    - interleaved_1f1b: Megatron's warm-up, ((p - k - 1) * 2 + (v - 1) * p + 1) / v chunks of a
      stage, at most m (stage 0: p(1 + (p - 1)/(pv)), Narayanan et al. 2021);
    - dualpipe_v: min(p + 1, m) (DeepSeek's DualPipe README: PP + 1);
    - gpipe: m.
    """
    if strategy.in_flight is not None:
        return strategy.in_flight
    p, m, v, k = strategy.pipeline, strategy.step_microbatches, strategy.chunks, stage
    if strategy.schedule == "gpipe":
        return m
    if strategy.schedule == "interleaved_1f1b":
        return min(((p - k - 1) * 2 + (v - 1) * p + 1) / v, m)
    if strategy.schedule == "dualpipe_v":
        return min(p + 1, m)
    return min(p - k, m)


def _check_fit(config: TransformerConfig, strategy: JobStrategy) -> None:
    t = strategy.tensor
    if config.heads % t:
        raise ValueError(f"tensor={t}: the attention heads ({config.heads}) must divide by the tensor-parallel size")
    if config.layers < strategy.pipeline:
        raise ValueError(f"pipeline={strategy.pipeline}: more stages than layers ({config.layers})")
    if strategy.sequence_parallel and config.seq_len % t:
        raise ValueError(f"sequence_parallel: seq_len={config.seq_len} must divide by tensor={t}")
    cp = strategy.context_parallel
    if config.seq_len % cp:
        raise ValueError(f"context_parallel={cp}: seq_len={config.seq_len} must divide by the context-parallel size")
    if strategy.sequence_parallel and (config.seq_len // cp) % t:
        raise ValueError(f"sequence_parallel: the context chunk seq_len/context_parallel={config.seq_len // cp} must "
                         f"divide by tensor={t}")
    if cp > 1 and strategy.context_method == "ulysses" and config.heads % (t * cp):
        raise ValueError(f"context_method='ulysses': heads={config.heads} must divide by tensor x context_parallel "
                         f"= {t} x {cp}")
    if strategy.expert > 1 and (not config.experts or config.experts % strategy.expert):
        raise ValueError(f"expert={strategy.expert}: needs a MoE model whose experts ({config.experts}) divide by it")
    if strategy.activation_model == "simulation":
        bad = {"tensor": (t, 1), "context_parallel": (cp, 1), "sequence_parallel": (strategy.sequence_parallel, False),
               "inference": (strategy.inference, False), "recompute": (strategy.recompute, "none"),
               "in_flight": (strategy.in_flight, None), "microbatches": (strategy.microbatches, None)}
        for name, (value, allowed) in bad.items():
            if value != allowed:
                raise ValueError(f"activation_model='simulation' models the simulation's data-parallel runs "
                                 f"(tensor=1, no sequence parallelism or recomputation, training, every layer "
                                 f"in one program); {name}={value!r} is not covered")
        if strategy.zero_stage == 3:
            raise ValueError("activation_model='simulation' does not cover zero_stage=3: the simulation counts "
                             "gathered parameter shards as activations in a layout-dependent way")


def _local(counts: ParamCounts, config: TransformerConfig, strategy: JobStrategy) -> ParamCounts:
    """Elements per device after tensor / expert parallelism (rounded up per part)."""
    t = strategy.tensor
    kv_local = math.ceil(config.kv_heads / t)
    return ParamCounts(split=math.ceil(counts.split / t), replicated=counts.replicated,
                       kv=math.ceil(counts.kv * kv_local / config.kv_heads),
                       experts=math.ceil(counts.experts / (strategy.expert * t)))


def _stage_pieces(config: TransformerConfig, strategy: JobStrategy, stage: int) -> List[ParamCounts]:
    p = strategy.pipeline
    pieces = [config.layer_params()] * stage_layers(config.layers, p, stage)
    if stage == 0:
        pieces.insert(0, config.embedding_params())
    if stage == p - 1:
        pieces.append(config.head_params(separate_copy=p > 1))
    return [_local(piece, config, strategy) for piece in pieces]


def _sharded(elements: int, ways: int) -> int:
    return math.ceil(elements / ways)


def estimate_stage(config: TransformerConfig, strategy: JobStrategy, stage: int) -> StageEstimate:
    """Bytes per device of pipeline stage `stage` (see module docstring).

    Raises:
        ValueError: `stage` out of range, or config and strategy that do not fit together.
    """
    _check_fit(config, strategy)
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < strategy.pipeline:
        raise ValueError(f"stage={stage!r}: expected an int in [0, {strategy.pipeline - 1}]")
    e, d = config.dtype_bytes, strategy.replicas
    zero_group_experts = d // strategy.expert
    pieces = _stage_pieces(config, strategy, stage)
    dense = sum(pc.split + pc.replicated + pc.kv for pc in pieces)
    experts = sum(pc.experts for pc in pieces)
    notes: List[str] = []

    def zero(stage_from: int) -> int:
        if strategy.zero_stage >= stage_from:
            return _sharded(dense, d) + _sharded(experts, zero_group_experts)
        return dense + experts

    training = not strategy.inference
    param_elems = zero(3)
    grad_elems = zero(2) if training else 0
    master = strategy.master_weights if strategy.master_weights is not None else e < FP32_BYTES
    optimizer_per_param = FP32_BYTES * (strategy.optimizer_states + (1 if master else 0)) if training else 0
    optimizer = zero(1) * optimizer_per_param
    tiers: Dict[str, int] = {"device": 0, "host": 0, "disk": 0}

    parameters, gradients = param_elems * e, grad_elems * e
    if strategy.offload_params != "device":
        largest = max(pc.total for pc in pieces)
        tiers[strategy.offload_params] += parameters + gradients
        parameters = largest * e
        gradients = largest * e if training else 0
        notes.append("offloaded parameters: the device keeps the largest piece in use (parameters and gradients)")
    if strategy.offload_optimizer != "device":
        tiers[strategy.offload_optimizer] += optimizer
        optimizer = 0

    layers = stage_layers(config.layers, strategy.pipeline, stage)
    in_flight = 0 if strategy.inference else in_flight_microbatches(strategy, stage)
    if strategy.activation_model == "simulation":
        activations = simulation_activation_bytes(config, config.micro_batch)
        in_flight = 1
        notes.append("activations: every forward tensor of the examples' GPT at its shard size, all layers "
                     "(what the simulation's accounting counts; see simulation_activations)")
    else:
        activations = _megatron_activations(config, strategy, stage, layers, in_flight, notes)
    kv_cache = 0
    if strategy.inference:
        kv_local = math.ceil(config.kv_heads / strategy.tensor)
        tokens = math.ceil(config.seq_len / strategy.context_parallel)
        kv_cache = 2 * layers * config.micro_batch * tokens * kv_local * config.head_dim * e
    return StageEstimate(stage=stage, layers=layers, in_flight=in_flight, parameters=parameters,
                         gradients=gradients, optimizer_states=optimizer, activations=activations,
                         kv_cache=kv_cache, host=tiers["host"], disk=tiers["disk"], notes=notes)


def _megatron_activations(config: TransformerConfig, strategy: JobStrategy, stage: int, layers: int,
                          in_flight: int, notes: List[str]) -> int:
    c, st = config, strategy
    args = (c.seq_len, c.micro_batch, c.hidden, c.heads, st.tensor, st.sequence_parallel)
    cp = st.context_parallel
    if st.inference:
        notes.append("inference activations: one layer's working set without the attention core (Table 2's "
                     "selective-recompute row: fused attention kernels never materialise the scores)")
        return math.ceil(activation_bytes_per_layer(*args, "selective") / cp)
    per_layer = activation_bytes_per_layer(*args, st.recompute) / cp
    row = table2_row(st.tensor, st.sequence_parallel, st.recompute)
    notes.append(f"activations per layer: Korthikanti et al. 2022 Table 2 row {row}, {TABLE2_ROWS[row]}, "
                 f"16-bit activations")
    if cp > 1:
        notes.append(f"context parallel {cp}: activations, logits and KV cache per device divided by {cp}")
    total = per_layer * layers * in_flight
    if stage == st.pipeline - 1:
        total += FP32_BYTES * c.seq_len * c.micro_batch * c.vocab / st.tensor * in_flight / cp
        notes.append("last stage: plus the fp32 logits of the cross-entropy, 4sbv/t per in-flight micro-batch")
    if c.dtype_bytes != 2:
        notes.append(f"Table 2 counts 16-bit activations; the model's {c.dtype_bytes}-byte elements are used for "
                     f"parameters and gradients only")
    return math.ceil(total)


def estimate_job(config: TransformerConfig, strategy: JobStrategy, device_memory: Optional[int] = None) -> JobEstimate:
    """Estimate every pipeline stage's bytes per device.

    Args:
        config: the model and micro-batch.
        strategy: parallel sizes, ZeRO, offload, schedule, activation model.
        device_memory: per-device budget in bytes for `JobEstimate.fits` (None: not judged).

    Returns:
        The JobEstimate (one StageEstimate per pipeline stage).

    Raises:
        ValueError: config and strategy that do not fit together (the message names the field).
    """
    if device_memory is not None and (isinstance(device_memory, bool) or not isinstance(device_memory, int)
                                      or device_memory < 1):
        raise ValueError(f"device_memory={device_memory!r}: expected a byte count >= 1")
    stages = [estimate_stage(config, strategy, k) for k in range(strategy.pipeline)]
    return JobEstimate(config, strategy, stages, device_memory)
