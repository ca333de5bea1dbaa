"""JobStrategy: how a job runs on its devices, as the estimator sees it (sizes, not layouts)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from mindspore_hyper.estimate._checks import check_bool, check_choice, check_int
from mindspore_hyper.estimate._record import Record
from mindspore_hyper.estimate.activations import RECOMPUTE_MODES

__all__ = ["JobStrategy", "TIERS", "ACTIVATION_MODELS", "CONTEXT_METHODS", "SCHEDULES", "RECOMPUTE_SCOPES"]

TIERS = ("device", "host", "disk")
ACTIVATION_MODELS = ("megatron", "simulation")
CONTEXT_METHODS = ("ring", "ulysses", "all_gather")
SCHEDULES = ("1f1b", "interleaved_1f1b", "zb_h1", "zb_v", "dualpipe_v", "gpipe")
_TWO_CHUNK_SCHEDULES = ("zb_v", "dualpipe_v")
RECOMPUTE_SCOPES = ("layers", "stage")
_SPLIT_BACKWARD_SCHEDULES = ("zb_h1", "zb_v", "dualpipe_v")


@dataclass(frozen=True)
class JobStrategy(Record):
    """Parallel sizes, ZeRO stage, offload tiers, pipeline schedule and what activations count.

    Args:
        data: data-parallel size d.
        tensor: tensor-parallel size t (Megatron column/row parallel layers).
        pipeline: pipeline stages p.
        expert: expert-parallel size (MoE experts spread over this many ranks of the data group).
        sequence_parallel: Megatron sequence parallelism over the tensor-parallel group.
        zero_stage: 0 none; 1 optimizer states, 2 also gradients, 3 also parameters sharded over
            the data-parallel group.
        recompute: activation recomputation: "none", "selective" or "full".
        offload_params: tier of parameters (and their gradients): "device", "host" or "disk"; off
            the device, the device keeps the largest piece (layer, embedding or head) being used.
        offload_optimizer: tier of the optimizer states (and fp32 master weights).
        microbatches: micro-batches per step; None: as many as pipeline stages.
        in_flight: micro-batches whose activations a stage holds at once; None: 1F1B's
            min(p - stage, microbatches).
        optimizer_states: fp32 states per parameter (Adam: 2, momentum SGD: 1, SGD: 0).
        master_weights: an fp32 copy of 16-bit parameters in the optimizer; None: when the
            config's dtype_bytes < 4.
        inference: forward only with a KV cache (no gradients, optimizer states or stored activations).
        activation_model: "megatron" (Korthikanti et al. Table 2, 16-bit) or "simulation" (what
            the simulation's accounting counts for the examples' GPT, see simulation_activations).
        context_parallel: context-parallel size cp: every sequence is split into cp chunks along
            its length, one per rank of the context group (activations and KV cache per device
            divided by cp; ZeRO and the gradient sync span data x context).
        context_method: how attention crosses the chunks: "ring" (K/V blocks passed around the
            context group, overlapped with the attention of the current block) or "ulysses"
            (AllToAll from sequence-sharded to head-sharded and back; heads must divide by
            tensor x context_parallel) or "all_gather" (Llama 3's: every rank all-gathers the whole
            sequence's K/V before its attention and reduce-scatters their gradients after the
            attention backward, both exposed; estimate only, the runtime has ring and ulysses;
            its memory is estimated as ring's, without the gathered K/V buffer).
        schedule: pipeline schedule (a `mindspore_hyper.schedule` kind): "1f1b",
            "interleaved_1f1b", "zb_h1", "zb_v", "dualpipe_v" or "gpipe". It sets the step-time
            model's bubble and the default in-flight micro-batches.
        chunks: model chunks per pipeline rank v (virtual stages): 1 for 1f1b/zb_h1/gpipe, >= 2
            for interleaved_1f1b, 2 for zb_v and dualpipe_v.
        recompute_scope: what recompute="full" runs again in the backward (step time only):
            "layers" (Megatron-LM: the transformer layers) or "stage" (mindspore_hyper's pipeline
            runtime, docs/mpmd.md: a backward recomputes its whole stage from the stage input,
            the last stage's final norm, LM head and loss included; not with the split backwards
            of zb_h1, zb_v and dualpipe_v, whose two halves that runtime recomputes each). The
            memory estimate counts Table 2's full-recompute row for both.
        grad_sync_overlap: the data-parallel gradient sync overlaps the backward (True: PyTorch
            DDP's bucketed all-reduce, started as a layer's gradients are ready, hiding up to
            (L - 1)/L of a micro-batch's backward) or runs after the backward, all of it exposed
            (False: Megatron-LM's `local` DDP, one all-reduce of the gradient buffer after the
            last micro-batch). Step time only; not with zero_stage=3, whose gradient
            reduce-scatters run per layer inside the backward.
        p2p_overlap: the pipeline's stage-to-stage transfers run beside compute (True: a send
            does not stop its sender, a receive waits only for a late tensor) or block the
            sender for the transfer (False: Megatron-LM 2021-2022's `p2p_communication._communicate`,
            batch_isend_irecv, wait on every request, then a device synchronize, before the next
            forward or backward starts). Step time only; no effect without a pipeline.
        tp_backward_overlap: in the backward of each column-parallel linear (qkv, MLP up), the
            tensor-parallel collective of its input gradient (all-reduce; reduce-scatter with
            sequence parallelism) runs while its weight-gradient GEMM computes, hidden up to that
            GEMM's time (True: Megatron-LM from September 2021, `async_tensor_model_parallel_allreduce`
            and the sequence-parallel `LinearWithGradAccumulationAndAsyncCommunication`) or after it,
            exposed (False). Step time only; no effect without tensor parallelism.
        grad_accumulation_fused: each micro-batch's weight gradients reach the step's gradient
            buffer inside the weight-gradient GEMM (True: Megatron-LM's gradient_accumulation_fusion,
            the model's default) or through a separate memory-bound add per parameter and
            micro-batch (False: Megatron-LM 2021's local DDP, whose backward hook runs
            `main_grad.add_(grad)`: the gradient read, the buffer read and written, 3 x dtype bytes
            per parameter at the memory efficiency). Step time only.

    Raises:
        ValueError: a field of the wrong type or out of range, or fields that contradict each
            other (named in the message).
    """

    data: int = 1
    tensor: int = 1
    pipeline: int = 1
    expert: int = 1
    sequence_parallel: bool = False
    zero_stage: int = 0
    recompute: str = "none"
    offload_params: str = "device"
    offload_optimizer: str = "device"
    microbatches: Optional[int] = None
    in_flight: Optional[int] = None
    optimizer_states: int = 2
    master_weights: Optional[bool] = None
    inference: bool = False
    activation_model: str = "megatron"
    context_parallel: int = 1
    context_method: str = "ring"
    schedule: str = "1f1b"
    chunks: int = 1
    recompute_scope: str = "layers"
    grad_sync_overlap: bool = True
    p2p_overlap: bool = True
    tp_backward_overlap: bool = False
    grad_accumulation_fused: bool = True

    def __post_init__(self):
        for name in ("data", "tensor", "pipeline", "expert", "context_parallel", "chunks"):
            check_int(name, getattr(self, name), 1)
        for name in ("microbatches", "in_flight"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1)
        check_int("optimizer_states", self.optimizer_states, 0)
        if isinstance(self.zero_stage, bool) or self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage={self.zero_stage!r}: expected 0, 1, 2 or 3")
        check_choice("recompute", self.recompute, RECOMPUTE_MODES)
        check_choice("offload_params", self.offload_params, TIERS)
        check_choice("offload_optimizer", self.offload_optimizer, TIERS)
        check_choice("activation_model", self.activation_model, ACTIVATION_MODELS)
        check_choice("context_method", self.context_method, CONTEXT_METHODS)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("recompute_scope", self.recompute_scope, RECOMPUTE_SCOPES)
        if self.recompute_scope == "stage" and self.recompute != "full":
            raise ValueError(f"recompute_scope='stage' needs recompute='full' (it says what full recomputation "
                             f"runs again), got recompute={self.recompute!r}")
        if self.recompute_scope == "stage" and self.schedule in _SPLIT_BACKWARD_SCHEDULES:
            raise ValueError(f"recompute_scope='stage' models one recomputation per full backward; "
                             f"schedule={self.schedule!r} splits the backward (the pipeline runtime recomputes the "
                             f"stage in each half): use 1f1b, interleaved_1f1b or gpipe")
        if self.schedule in _TWO_CHUNK_SCHEDULES and self.chunks != 2:
            raise ValueError(f"chunks={self.chunks}: schedule={self.schedule!r} runs exactly 2 chunks per rank")
        if self.schedule == "interleaved_1f1b" and self.chunks < 2:
            raise ValueError(f"chunks={self.chunks}: schedule='interleaved_1f1b' needs >= 2 chunks per rank")
        if self.schedule in ("1f1b", "zb_h1", "gpipe") and self.chunks != 1:
            raise ValueError(f"chunks={self.chunks}: schedule={self.schedule!r} runs 1 chunk per rank")
        for name in ("sequence_parallel", "inference", "grad_sync_overlap", "p2p_overlap",
                     "tp_backward_overlap", "grad_accumulation_fused"):
            check_bool(name, getattr(self, name))
        if self.master_weights is not None and not isinstance(self.master_weights, bool):
            raise ValueError(f"master_weights={self.master_weights!r}: expected a bool or None")
        if not self.grad_sync_overlap and self.zero_stage == 3:
            raise ValueError("grad_sync_overlap=False: ZeRO-3 reduce-scatters each layer's gradients inside the "
                             "backward (there is no once-per-step sync to run after it); use zero_stage 0, 1 or 2")
        if self.data % self.expert:
            raise ValueError(f"expert={self.expert}: the expert-parallel size must divide data={self.data}")
        if self.inference:
            for name, default in (("recompute", "none"), ("microbatches", None), ("in_flight", None),
                                  ("offload_optimizer", "device")):
                if getattr(self, name) != default:
                    raise ValueError(f"{name}={getattr(self, name)!r} has no meaning with inference=True "
                                     f"(forward only, no optimizer); leave it at {default!r}")

    @property
    def devices(self) -> int:
        """Devices of the job: data x tensor x pipeline x context_parallel."""
        return self.data * self.tensor * self.pipeline * self.context_parallel

    @property
    def step_microbatches(self) -> int:
        """Micro-batches per step: `microbatches`, else as many as pipeline stages."""
        return self.microbatches if self.microbatches is not None else self.pipeline

    @property
    def replicas(self) -> int:
        """Ranks holding the same parameter shard (the ZeRO and gradient-sync group): data x context."""
        return self.data * self.context_parallel

