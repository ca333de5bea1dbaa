"""The migration sweep: every transformers family with a causal-LM, masked-LM, seq2seq or image/audio
classification head, built offline from a scaled-down config, converted with the default `convert` (the
port) at one shape, checked at a second shape against torch and trained 5 AdamW steps beside torch, then run in
parallel as converted (parallel_checks: 2 x 2 data x tensor with tensor_parallel_plan's splits, and pipeline 2 for
causal LMs, in simulation, one step against one device).

Used by `benchmarks/bench_migration.py --sweep` (the table in docs/migration.md) and by
`tests/migrate/test_migrate_sweep.py` (a fast subset in the suite; the named list opt-in).

Tolerance: 1e-4 relative (max |cell - torch| / max |torch| per output; losses and parameters after 5
AdamW steps relative to their own size). Both sides compute in float32 (unit roundoff u = 2^-24 = 6e-8)
with different kernels and summation orders, so their difference is bounded by the sum of both sides'
rounding errors. A length-n dot product or reduction is within gamma_n = n u / (1 - n u) relative of the
exact value (Higham, Accuracy and Stability, 3.1): n <= 64 (the largest contraction of these configs:
intermediate size 64) gives 3.8e-6. A 2-layer model's output passes through ~12 such stages (per layer:
q/k/v and output projections, the attention scores and their weighted sum, the norm reductions, the two
MLP projections), so one side is within ~12 x 3.8e-6 = 4.6e-5 and the difference within twice that,
9.2e-5 <= 1e-4 (a worst case: the errors measured are ~1e-7). A wrong conversion is not near it (a
mistaken mask, scale or position gives errors of 1e-2 and more). Training uses AdamW with eps = 1e-3 for
the reason migrate_training.train_both gives (parameters with an exactly zero gradient); the first step's loss
must agree within 1e-4, every later step's loss within 1e-4 or, where torch's own float32 loss at that step is
further than that from the same training in float64, within 3x that distance (loss_error), and every parameter
after the 5 steps within 1e-4 of its size or, likewise, within 3x torch's own float32-to-float64 distance
(parameter_error). The MindSpore losses use `log_softmax_ms` (ops.log_softmax's gradient is 10x less accurate).

Why the float64 allowance on the losses too: from the first optimizer step on, a loss is a function of parameters
that carry every earlier step's rounding, amplified by the computation's own conditioning. The conv nets with
BatchNorm in training mode are the extreme case: batch statistics over 2-4 samples at 1 x 1 (or 2 x 2) spatial
maps divide by the spread of a handful of nearly equal values, and AdamW (eps 1e-3) turns gradient components
near eps into steps of either sign. Measured (first-step gradients, worst parameter, relative to max |float64
gradient|): ResNet torch float32 7.4e-2 from float64, the Cell 1.3e-1; RegNet 1.2e-3 / 1.3e-3; MobileNet-v1
1.3e-4 / 1.2e-4; the same ResNet in eval mode, or in training at batch 16 of 64 x 64 images, 2.3e-6 / 2.3e-6
and 2.8e-6 / 6.3e-6: the conversion is exact, the small-batch statistics are not. torch float32 and the Cell
are two float32 roundings of one computation, float64 (~1e-16 per operation) stands for the exact one, so
|cell - torch| <= |cell - f64| + |torch - f64| <= (r + 1) |torch - f64| where r bounds how much further from
float64 the Cell's run is than torch's: r <= 1.8 in those first-step gradients (parameter_error: 1.7 for
ViT), hence ROUNDING_FACTOR 3. The first step's loss (the converted forward at the initial weights, before
any step can amplify rounding) keeps the fixed 1e-4, so a family whose float32 training is chaotic passes only
if its forward is right first. Where the training is chaotic one float32-to-float64 distance can undershoot the
spread of float32 runs (torch float32 alone, with its inputs scaled by 1 +- 2^-23 or in channels_last order, puts
the third step's loss anywhere from 4e-6 to 12.9 for MobileNet-v1, 1e-6 to 19.8 for PP-LCNet), and such a family
fails, its reason naming at the worst step torch's float64 loss and a float32 run on nudged inputs
(nudged_batches) beside the two compared.
"""
from __future__ import annotations

import contextlib
import copy
import re
import signal
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

TOL = 1e-4
STEPS = 5
HEADS = ("causal-lm", "masked-lm", "seq2seq", "image-classification", "audio-classification")
# the list: (model type, head); CLIP's text tower is its own row (the vision tower is CLIP's
# image-classification model)
NAMED = [("llama", "causal-lm"), ("mistral", "causal-lm"), ("mixtral", "causal-lm"), ("qwen2", "causal-lm"),
         ("qwen2_moe", "causal-lm"), ("qwen3", "causal-lm"), ("qwen3_moe", "causal-lm"), ("gemma", "causal-lm"),
         ("gemma2", "causal-lm"), ("gemma3_text", "causal-lm"), ("phi3", "causal-lm"), ("gpt2", "causal-lm"),
         ("gpt_neox", "causal-lm"), ("gptj", "causal-lm"), ("falcon", "causal-lm"), ("olmo2", "causal-lm"),
         ("stablelm", "causal-lm"), ("deepseek_v3", "causal-lm"), ("gpt_oss", "causal-lm"), ("bert", "masked-lm"),
         ("roberta", "masked-lm"), ("electra", "masked-lm"), ("t5", "seq2seq"), ("bart", "seq2seq"),
         ("vit", "image-classification"), ("clip", "image-classification"), ("clip_text", "text-tower"),
         ("whisper", "seq2seq")]
FAST = [("gpt_neox", "causal-lm"), ("roberta", "masked-lm"), ("gemma", "causal-lm"),
        ("qwen2", "causal-lm"), ("gpt2", "causal-lm")]  # Qwen2-MoE: test_migrate_generated

# parallel as converted (parallel_checks): the converted Cell on a 2 x 2 data x tensor mesh in simulation with the
# splits of mindspore_hyper.migrate.tensor_plan.tensor_parallel_plan on the torch names (under the wrapper's `model.`),
# and, for causal-LM heads, `pipeline: 2` over the layer list; both one step against one device
PIPELINE_HEADS = ("causal-lm",)

VOCAB = 128
LAYERS, HIDDEN, FFN, HEADS_N, KV_HEADS, HEAD_DIM = 2, 32, 64, 4, 2, 8
# config keys (set where the family's config has them) -> scaled-down values
SCALED: Dict[str, Any] = {
    **{k: LAYERS for k in ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
                           "decoder_layers", "num_decoder_layers", "num_encoder_layers")},
    **{k: HIDDEN for k in ("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "embedding_size",
                           "projection_dim")},
    **{k: FFN for k in ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "d_ff", "hidden_dim")},
    **{k: HEADS_N for k in ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
                            "decoder_attention_heads")},
    **{k: KV_HEADS for k in ("num_key_value_heads", "num_kv_heads")},
    **{k: HEAD_DIM for k in ("head_dim", "d_kv", "qk_nope_head_dim", "v_head_dim")},
    "vocab_size": VOCAB, "max_position_embeddings": 64, "n_positions": 64, "n_ctx": 64,
    "max_target_positions": 64, "max_source_positions": 16, "num_mel_bins": 16,
    "image_size": 32, "patch_size": 8, "num_channels": 3, "rotary_dim": 4,
    # mixture of experts
    "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 16, "shared_expert_intermediate_size": 32, "n_shared_experts": 1, "n_group": 2,
    "topk_group": 1, "first_k_dense_replace": 1, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
    # audio feature extractors (wav2vec2-like) and conv nets
    "conv_dim": [16] * 3, "conv_kernel": [10, 3, 3], "conv_stride": [5, 2, 2], "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 4, "tdnn_dim": [16, 16], "tdnn_kernel": [3, 1], "tdnn_dilation": [1, 1],
    "xvector_output_dim": 16, "classifier_proj_size": 16,
    "use_cache": False, "num_labels": 5,
    # wav2vec2-like audio models: SpecAugment masks random time steps and features in training (NumPy's RNG, drawn
    # per call), which the two sides cannot share; off for every family that has these keys
    "mask_time_prob": 0.0, "mask_feature_prob": 0.0,
}
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
             "cls_token_id", "mask_token_id", "unk_token_id")


@dataclass
class SweepRow:
    """One family's result: stage reached and the first failure (op or module, with its reason)."""

    family: str
    head: str
    model: str = ""
    status: str = "fail"  # pass / fail / not built
    stage: str = ""  # build / convert / forward / train
    reason: str = ""
    forward_error: Optional[float] = None
    train_error: Optional[float] = None  # worst relative loss difference over the steps
    loss_units: Optional[float] = None  # worst loss difference / allowed (loss_error)
    parameter_units: Optional[float] = None  # worst parameter difference / allowed (parameter_error)
    parallel_error: Optional[float] = None  # 2 x 2 data x tensor in simulation vs one device (parallel_step_error)
    parallel_source: str = ""  # where the tensor splits came from (TensorPlan.source), or why data only
    pipeline_error: Optional[float] = None  # pipeline 2 over the layer list in simulation vs one device
    parallel_reason: str = ""  # the parallel / pipeline check's failure, "" when it passed or did not run
    fallbacks: List[str] = field(default_factory=list)
    seconds: float = 0.0


def _mapping(head: str) -> Dict[str, str]:
    from transformers.models.auto import modeling_auto as ma

    if head == "seq2seq":
        return {**ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, **ma.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES}
    return {"causal-lm": ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "masked-lm": ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
            "image-classification": ma.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
            "audio-classification": ma.MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES}[head]


def all_families() -> List[Tuple[str, str]]:
    """Every (model type, head) of the installed transformers, one head per family: seq2seq, then masked-LM,
    causal-LM, image and audio classification (BERT is swept as a masked LM, BART as seq2seq)."""
    chosen: Dict[str, str] = {}
    for head in ("seq2seq", "masked-lm", "causal-lm", "image-classification", "audio-classification"):
        for family in _mapping(head):
            chosen.setdefault(family, head)
    return sorted(chosen.items())


def _scaled_kwargs(config) -> Dict[str, Any]:
    """Constructor keywords of `config`'s class: the scaled sizes for the keys it has, dropout off, and the
    same for its sub-configs (text/vision/encoder ...)."""
    from transformers import PretrainedConfig

    values = config.to_dict()
    found: Dict[str, Any] = {}
    for key, value in values.items():
        sub = getattr(config, key, None)
        if isinstance(sub, PretrainedConfig):
            found[key] = _scaled_kwargs(sub)
        elif key in SCALED and (value is None and key in ("num_key_value_heads", "num_kv_heads") or
                                value is not None and type(value) is type(SCALED[key])):
            found[key] = SCALED[key]
        elif isinstance(value, float) and ("dropout" in key or "pdrop" in key or "drop_path" in key or
                                           "layerdrop" in key or key in ("jitter_noise", "router_jitter_noise")):
            found[key] = 0.0
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, float) for v in value) and (
                "dropout" in key or "drop_path" in key or "drop_rate" in key):
            found[key] = [0.0] * len(value)  # a rate per stage (CvT's drop_path_rate: random in training)
    heads = next((values[k] for k in ("num_attention_heads", "n_head", "num_heads") if isinstance(values.get(k), int)),
                 None)
    for key in ("num_key_value_heads", "num_kv_heads"):  # multi-head attention stays so (DeepSeek-V3's MLA)
        if key in found and isinstance(values.get(key), int) and heads is not None and values[key] >= heads:
            found[key] = HEADS_N
    if isinstance(values.get("hidden_sizes"), list):  # conv nets: small stages
        n = len(values["hidden_sizes"])
        found["hidden_sizes"] = [8 * (i + 1) for i in range(n)]
        if isinstance(values.get("depths"), list):
            found["depths"] = [1] * len(values["depths"])
    if isinstance(values.get("downsampling_ratios"), list) and isinstance(values.get("num_filters"), int):
        # VibeVoice's audio tokenizers: channels double at each of 6 stages (32 -> 2048 filters, ~1e9 parameters
        # at the defaults, out of memory in training); 4 filters and one block per stage keep the structure
        found["num_filters"] = 4
        if isinstance(values.get("depths"), list):
            found["depths"] = [1] * len(values["depths"])
    if isinstance(values.get("layer_types"), list):
        found["layer_types"] = None  # recomputed for the new depth by the config
    if values.get("default_language", "") is None and values.get("languages"):  # X-MOD: its adapters need one
        found["default_language"] = list(values["languages"])[0]
    for key in TOKEN_IDS:  # special tokens of the full vocabulary would not fit the small one
        v = values.get(key)
        if isinstance(v, int) and v >= VOCAB:
            found[key] = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}.get(key, 3)
    if "eos_token_id" in values and isinstance(values["eos_token_id"], list):
        found["eos_token_id"] = 2
    return found


def build_model(family: str, head: str) -> torch.nn.Module:
    """The scaled-down model (random weights, seed 0) of `family` with `head`, in training mode."""
    import transformers
    from transformers import AutoConfig

    torch.manual_seed(0)
    if head == "text-tower":  # CLIP's text tower
        base = AutoConfig.for_model(family.replace("_text", ""))
        text = type(base.text_config)(**_scaled_kwargs(base.text_config))
        cls = getattr(transformers, "CLIPTextModelWithProjection")
        return cls(text).train()
    config = AutoConfig.for_model(family)
    kwargs = _scaled_kwargs(config)
    try:
        config = type(config)(**kwargs)  # the class defaults (what for_model built) with the scaled sizes
    except Exception as exc:  # noqa: BLE001 - re-raised unless one of the two refusals below
        kinds = getattr(config, "layers_block_type", None)
        refused = [k for k in kwargs if re.search(rf"`{re.escape(k)}[`=]", str(exc))]  # `key` or `key=value`
        if "number of `layer_types`" in str(exc) and isinstance(kinds, list):
            # Zamba's default list of layer kinds has 3 or more entries whatever the depth: every layer "hybrid" (a
            # Mamba layer after the shared transformer, tied across the hybrid layers: Zamba refuses a single one)
            kwargs["layers_block_type"] = ["hybrid" if "hybrid" in kinds else kinds[0]] * LAYERS
        elif refused:  # a scaled value the config refuses by name (ZAYA: 1 expert per token only): its default
            for key in refused:
                kwargs.pop(key)
        else:
            raise
        config = type(config)(**kwargs)
    cls = getattr(transformers, _mapping(head)[family])
    try:
        return cls(config).train()  # transformers' default attention (sdpa where the family supports it)
    except ValueError as exc:
        if "attention implementation" not in str(exc):
            raise
    torch.manual_seed(0)
    config._attn_implementation = "eager"  # the family has no sdpa path (Gemma2): its eager attention
    return cls(config).train()


# masks a user passes to a model exported or compiled, built in the wrapper from the given ids (so the converted Cell
# builds them too), equal to the default the eager forward builds itself:
# - LongT5 and Switch Transformers build their all-ones attention_mask only when not compiling
#   (`if attention_mask is None and not is_torchdynamo_compiling()`), then index it: under torch.export it is None;
# - FSMT's decoder default (`make_padding_mask`: the pad positions, or None when there are none) branches on
#   `padding_mask.any()`, a value; decoder_attention_mask = ids != pad gives the same mask (an all-False one
#   where eager has None: masked_fill with nothing to fill) without the branch.
ONES_ATTENTION_MASK = ("longt5", "switch_transformers")
PAD_DECODER_MASK = ("fsmt",)


class _Named(torch.nn.Module):
    """The model called with its inputs by name (main input, and decoder ids for seq2seq), and the default masks
    of ONES_ATTENTION_MASK / PAD_DECODER_MASK."""

    def __init__(self, model: torch.nn.Module, names: Tuple[str, ...]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs):
        named = dict(zip(self.names, inputs))
        family = getattr(self.model.config, "model_type", "")
        if family in ONES_ATTENTION_MASK:
            named["attention_mask"] = torch.ones(inputs[0].shape[0], inputs[0].shape[1])
        if family in PAD_DECODER_MASK and "decoder_input_ids" in named:
            named["decoder_attention_mask"] = named["decoder_input_ids"].ne(self.model.config.pad_token_id)
        return self.model(**named)


def inputs_for(model: torch.nn.Module, head: str, batch: int, length: int, seed: int) -> Tuple[torch.Tensor, ...]:
    """Example inputs of `model` (its main input; decoder ids for seq2seq) at batch x length."""
    config = model.config
    g = torch.Generator().manual_seed(seed)
    main = getattr(model, "main_input_name", "input_ids")
    if main == "input_ids" or main == "inputs" and getattr(config, "vocab_size", None):  # Perceiver's MLM: ids
        vocab = getattr(config, "vocab_size", VOCAB) or VOCAB
        first = torch.randint(3, vocab, (batch, length), generator=g)
    elif main == "pixel_values":
        vision = getattr(config, "vision_config", None) or config  # CLIP: the vision tower's config
        # conv nets whose config has no image size (PoolFormer, PP-LCNet) take the sweep's
        size = getattr(vision, "image_size", SCALED["image_size"])
        size = size if isinstance(size, int) else size[0]
        first = torch.randn(batch, getattr(vision, "num_channels", 3), size, size, generator=g)
    elif main == "input_features" and isinstance(getattr(config, "feature_projection_input_dim", None), int):
        # Wav2Vec2-BERT: (batch, frames, features), frames as long as the length asks
        first = torch.randn(batch, length, config.feature_projection_input_dim, generator=g)
    elif main == "input_features":
        first = torch.randn(batch, config.num_mel_bins, 2 * config.max_source_positions, generator=g)
    elif main == "input_values":
        first = torch.randn(batch, 400 * length, generator=g)
    else:
        raise ValueError(f"main input {main!r} of {type(model).__name__} is not generated by the sweep")
    if head != "seq2seq":
        return (first,)
    vocab = getattr(config, "vocab_size", VOCAB) or VOCAB
    return first, torch.randint(3, vocab, (batch, max(length - 3, 2)), generator=g)


def wrapped(model: torch.nn.Module, head: str) -> torch.nn.Module:
    main = getattr(model, "main_input_name", "input_ids")
    return _Named(model, (main, "decoder_input_ids") if head == "seq2seq" else (main,))


def _logits_torch(out) -> torch.Tensor:
    for name in ("logits", "text_embeds", "last_hidden_state"):
        value = getattr(out, name, None)
        if isinstance(value, torch.Tensor):
            return value
    return out[0]


def _logits_index(report) -> int:
    for name in ("logits", "text_embeds", "last_hidden_state"):
        if name in report.outputs:
            return report.outputs.index(name)
    return 0


def log_softmax_ms(x):
    """log_softmax over the last dimension as `x - max - log(sum(exp(x - max)))` in mint ops: its gradient is
    within ~1e-7 of float64 where ops.log_softmax's is ~1.4e-6 (measured: every gradient of a ViT classifier
    inherited that error, which 5 AdamW steps with eps 1e-3 amplified to 2.4e-4 in the parameters).
    Computed in float64 and rounded back for float32 logits: MindSpore's CPU float32 exp is 6e-7 from exact
    (torch's 1e-8), which put FocalNet's classifier-bias gradient 18x further from float64 than torch's (under 2x
    with this; mindspore_hyper.migrate.mappings.common.in_float64 has the kernel measurements)."""
    import mindspore as ms
    from mindspore import mint, ops

    wide = ops.cast(x, ms.float64) if x.dtype == ms.float32 else x
    shifted = mint.sub(wide, ops.stop_gradient(mint.amax(wide, dim=-1, keepdim=True)))  # exact: shift invariant
    out = mint.sub(shifted, mint.log(mint.sum(mint.exp(shifted), dim=-1, keepdim=True)))
    return ops.cast(out, ms.float32) if x.dtype == ms.float32 else out


def next_token_loss_ms(logits, ids):
    """migrate_training.next_token_loss_ms with log_softmax_ms."""
    from mindspore import mint

    flat = mint.reshape(logits[:, :-1], (-1, logits.shape[-1]))
    picked = mint.gather(log_softmax_ms(flat), 1, mint.reshape(ids[:, 1:], (-1, 1)))
    return mint.neg(mint.mean(picked))


def losses(head: str, report, num_labels: int) -> Tuple[Callable, Callable]:
    """(torch loss(output, batch), MindSpore loss(output, batch)) of a head."""
    from mindspore import mint
    import mindspore as ms
    from migrate_training import next_token_loss_torch

    index = _logits_index(report)

    def pick(out):
        return out[index] if isinstance(out, (tuple, list)) else out

    if head in ("causal-lm", "masked-lm", "seq2seq"):
        target = 1 if head == "seq2seq" else 0

        def length(logits, b):
            # an audio/multimodal decoder's logits can be longer than the ids given (prefix positions): the loss
            # reads the positions both have, on both sides alike
            return min(logits.shape[1], b[target].shape[1])

        def torch_loss(out, b):
            logits = _logits_torch(out)
            n = length(logits, b)
            return next_token_loss_torch(logits[:, :n], b[target][:, :n])

        def ms_loss(out, b):
            logits = pick(out)
            n = length(logits, b)
            return next_token_loss_ms(logits[:, :n], b[target][:, :n])
        return torch_loss, ms_loss
    if head == "text-tower":
        return (lambda out, b: (_logits_torch(out) ** 2).mean(), lambda out, b: mint.mean(mint.pow(pick(out), 2)))

    def torch_loss(out, b):
        return torch.nn.functional.cross_entropy(_logits_torch(out), torch.arange(b[0].shape[0]) % num_labels)

    def ms_loss(out, b):
        labels = ms.Tensor((np.arange(b[0].shape[0]) % num_labels).reshape(-1, 1))
        return mint.neg(mint.mean(mint.gather(log_softmax_ms(pick(out)), 1, labels)))
    return torch_loss, ms_loss


@contextlib.contextmanager
def _time_limit(seconds: Optional[float]):
    if not seconds:
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"more than {seconds:.0f} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _first_line(exc: BaseException) -> str:
    from mindspore_hyper.migrate.errors import UnsupportedOpError

    if isinstance(exc, UnsupportedOpError) and exc.problems:
        text = exc.problems[0] + (f" (+{len(exc.problems) - 1} more)" if len(exc.problems) > 1 else "")
    else:
        # MindSpore's errors open with banners ("-----", "- Kernel select failed:"): the first line after them
        lines = [l for l in str(exc).strip().splitlines() if l.strip() and not set(l.strip()) <= set("-")
                 and not (l.startswith("- ") and l.rstrip().endswith(":"))]
        text = f"{type(exc).__name__}: {lines[0] if lines else ''}"
        if len(lines) > 1 and lines[0].rstrip().endswith(":"):
            text += " " + lines[1].strip()
    return text if len(text) <= 600 else text[:599] + "…"


def sweep_one(family: str, head: str, limit: Optional[float] = None, shapes=((2, 8), (3, 11))) -> SweepRow:
    """Build, convert at shapes[0], check at shapes[1], train 5 AdamW steps; the row says what failed first."""
    from mindspore_hyper.migrate import convert
    from mindspore_hyper.migrate.compare import compare_outputs
    from migrate_training import train_both

    row = SweepRow(family, head)
    start = time.perf_counter()
    stage = "build"
    try:
        with _time_limit(limit):
            try:
                model = build_model(family, head)
                row.model = type(model).__name__
                module = wrapped(model, head)
                first = inputs_for(model, head, *shapes[0], seed=0)
                with torch.no_grad():
                    module(*first)
            except Exception as exc:  # noqa: BLE001 - a family that does not build offline is not swept
                row.status, row.stage, row.reason = "not built", "build", _first_line(exc)
                return row
            stage = "convert"
            cell, report = convert(module, first)
            row.fallbacks = [f"{f['module']}: {f['reason']}" for f in report.fallbacks]
            stage = "forward"
            second = inputs_for(model, head, *shapes[1], seed=1)
            check = compare_outputs(module, cell, second, {}, list(second))
            row.forward_error = check.get("max_relative_error")
            if row.forward_error is None or not row.forward_error <= TOL:
                own = float32_distance(module, second)
                raise AssertionError(f"forward at {shapes[1]}: {check}"
                                     + ("" if own is None else f"; torch float32 itself {own:.1e} from float64"))
            stage = "train"
            torch_loss, ms_loss = losses(head, report, getattr(model.config, "num_labels", 5))
            sizes = [shapes[0], shapes[1], (2, 9), (4, 12), (3, 10)][:STEPS]
            batches = [inputs_for(model, head, b, t, seed=10 + i) for i, (b, t) in enumerate(sizes)]
            reference, initial = float64_copy(module), copy.deepcopy(module)
            want, got = train_both(module, cell, batches, torch_loss, ms_loss)
            try:
                exact = train_torch(reference, [tuple(x.double() if x.is_floating_point() else x for x in b)
                                                for b in batches], torch_loss)
            except Exception:  # noqa: BLE001 - a model that casts to float32 inside: the fixed tolerance only
                reference, exact = None, None
            row.train_error = max(abs(g - w) / max(abs(w), 1e-12) for w, g in zip(want, got))
            row.loss_units = loss_error(want, got, exact)
            row.parameter_units = param_units = parameter_error(module, cell, report, reference=reference)
            if not row.loss_units <= 1.0 or not param_units <= 1.0:
                k = loss_error.where
                nudged = train_torch(initial, nudged_batches(batches), torch_loss)[k] if k > 0 else None
                raise AssertionError(f"after {STEPS} AdamW steps: losses {row.train_error:.1e} relative, "
                                     f"{row.loss_units:.2f} x allowed (worst at step {k + 1}: torch {want[k]:.6f}, "
                                     f"MindSpore {got[k]:.6f}"
                                     + (f", torch float64 {exact[k]:.6f}" if exact is not None else "")
                                     + ("" if nudged is None else f", torch with inputs x (1 +- 2^-23) {nudged:.6f}")
                                     + f"), parameters {param_units:.2f} x allowed (worst {parameter_error.where})")
            row.status, row.stage = "pass", stage
            try:  # parallel as converted: its own column (parallel_reason); the row's result stays the port's
                row.stage = parallel_checks(row, model, head, cell, batches[0], ms_loss)
            except ParallelCheckFailed:
                pass
    except Exception as exc:  # noqa: BLE001 - every failure is a row with its reason
        row.status, row.stage, row.reason = "fail", getattr(exc, "stage", stage), _first_line(exc)
        if stage not in ("convert",) and not isinstance(exc, (AssertionError, TimeoutError)):
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if "mindspore_hyper" in f.filename
                      or "<mindspore_hyper" in f.filename]
            if frames:
                row.reason += f" (at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})"
    finally:
        row.seconds = time.perf_counter() - start
    return row


def float64_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of the wrapped model for the rounding reference. Experts that transformers runs through
    grouped_mm (no float64 kernel: Ergo, DeepSeek-V4, Kolibri) are switched to transformers' eager loop, the
    same sums expert by expert, so those families get the rounding term of the tolerance too."""
    reference = copy.deepcopy(module).double()
    inner = reference.model
    if getattr(inner.config, "_experts_implementation", None) not in (None, "eager") and hasattr(
            inner, "set_experts_implementation"):
        inner.set_experts_implementation("eager")
    return reference


def nudged_batches(batches: List[Tuple[torch.Tensor, ...]]) -> List[Tuple[torch.Tensor, ...]]:
    """The batches with every floating input scaled by 1 +- 2^-23 (one float32 ulp at 1, random signs, seed 0; 1 +
    2^-24 would round to 1): torch trained on them is another float32 rounding of the same training. Named in a
    failing loss check's reason (not in what passes): where it lands as far from torch's losses as the Cell does, the
    training itself amplifies rounding (SwiftFormer's third step: torch 0.450308, nudged 0.453578, torch in
    channels_last order 0.455866, the Cell 0.455864; PP-LCNet's: torch 1e-6, nudged 19.8, the Cell 11.3)."""
    g = torch.Generator().manual_seed(0)

    def nudge(x: torch.Tensor) -> torch.Tensor:
        if not x.is_floating_point():
            return x
        return x * (1 + 2.0 ** -23 * torch.sign(torch.randn(x.shape, generator=g, dtype=x.dtype)))
    return [tuple(nudge(x) for x in b) for b in batches]


def float32_distance(module: torch.nn.Module, inputs: Tuple[torch.Tensor, ...]) -> Optional[float]:
    """How far torch's own float32 forward is from the same model in float64 on `inputs` (relative_error over the
    outputs; buffers restored): the rounding the computation itself amplifies, named in a failing forward's reason
    so that conditioning is told from a wrong conversion (MobileNet-v2 in training mode, BatchNorm statistics of 3
    samples at 1 x 1 maps: 4e-4, the Cell 8e-5 from float64). None where the float64 copy does not run."""
    from mindspore_hyper.migrate.compare import relative_error, torch_outputs
    from mindspore_hyper.migrate.lowering import preserved_buffers

    try:
        with torch.no_grad(), preserved_buffers(module):
            exact = torch_outputs(float64_copy(module)(*(x.double() if x.is_floating_point() else x for x in inputs)))
            found = torch_outputs(module(*inputs))
        return relative_error(found, exact)
    except Exception:  # noqa: BLE001 - a model that casts to float32 inside: no reference to name
        return None


def parallel_checks(row: SweepRow, model: torch.nn.Module, head: str, cell, batch, ms_loss) -> str:
    """Parallel as converted: the converted Cell on a 2 x 2 data x tensor mesh in simulation with the splits of
    `tensor_parallel_plan(model, "model.")` (parallel_step_error), and for PIPELINE_HEADS `pipeline: 2` over the
    layer list (pipeline_step_error), each one step within TOL of one device. A family with no Linear in its layer
    lists (a conv net) runs data 4 only, and its row says so; one whose Linears the plan cannot split fails ("no
    Linear to split"). Fills row.parallel_error / parallel_source / pipeline_error, and row.parallel_reason when a
    check fails.

    Returns:
        The last stage run ("parallel" or "pipeline").

    Raises:
        ParallelCheckFailed: a check failed, or a layout was refused (the reason, also in row.parallel_reason).
    """
    from mindspore_hyper.migrate.tensor_plan import tensor_parallel_plan

    stage = "parallel"
    try:
        plan = tensor_parallel_plan(model, prefix="model.")
        checked = batch
        if plan.module_level:
            row.parallel_source = plan.source
            row.parallel_error = parallel_step_error(cell, batch, ms_loss, plan)
        elif not plan.replicated:  # no Linear in any layer list: data parallel over the 4 devices, a batch of 4
            row.parallel_source = "data 4 only: no Linear in the layer lists"
            checked = inputs_for(model, head, 4, 8, seed=10)
            row.parallel_error = parallel_step_error(cell, checked, ms_loss, None)
        else:
            first, why = plan.replicated[0]
            raise AssertionError(f"no Linear to split ({plan.source}: {len(plan.replicated)} left whole, e.g. "
                                 f"{first}: {why})")
        if not row.parallel_error <= TOL:
            raise AssertionError(f"2 x 2 data x tensor in simulation: loss or gradients {row.parallel_error:.1e} "
                                 f"relative from one device's; one device itself moves "
                                 f"{nudged_step_error(cell, checked, ms_loss):.1e} with its inputs x (1 +- 2^-23)")
        if head in PIPELINE_HEADS:
            stage = "pipeline"
            row.pipeline_error = pipeline_step_error(cell, batch, ms_loss)
            if not row.pipeline_error <= TOL:
                raise AssertionError(f"pipeline 2 in simulation: loss or gradients {row.pipeline_error:.1e} relative "
                                     f"from one device's")
    except Exception as exc:  # noqa: BLE001 - named in the row, raised with the stage that failed
        row.parallel_reason = f"{stage}: {_first_line(exc)}"
        raise ParallelCheckFailed(stage, row.parallel_reason) from exc
    return stage


class ParallelCheckFailed(AssertionError):
    """A parallel check failed; `stage` is "parallel" (2 x 2 data x tensor) or "pipeline"."""

    def __init__(self, stage: str, reason: str):
        super().__init__(reason)
        self.stage = stage


GRADIENT_FLOOR = 1e-3


def _step_error(got_loss, got, want_loss, want) -> float:
    """Worst relative difference of a loss and of each gradient, a gradient's relative to max(its largest entry,
    GRADIENT_FLOOR x the largest entry of any gradient). Why the floor: a gradient that is zero in exact arithmetic
    is rounding alone, of either sign on either side (attention's key bias: softmax is invariant to the per-query
    constant q . b_k; BERT's measured 7e-13 one device, 1e-12 off in simulation, from terms of the size of the other
    attention gradients). 1e-3 of the largest gradient times TOL is still far below what a wrong layout gives (a
    missing or doubled partial sum is off by a whole gradient), the same floor parameter_error puts under the
    parameters."""
    worst = abs(float(got_loss) - float(want_loss)) / abs(float(want_loss))
    floor = GRADIENT_FLOOR * max([float(np.abs(w).max()) for w in want if w.size] + [1e-30])
    for g, w in zip(got, want):
        if w.size:
            worst = max(worst, float(np.abs(g - w).max()) / max(float(np.abs(w).max()), floor))
    return worst


def _loss_and_gradients(run, params, inputs, ms_loss):
    """(loss, every parameter's gradient) as numpy of one step of `run` (a Cell or its parallel wrapper) on
    `inputs` (MindSpore tensors)."""
    import mindspore as ms

    loss, grads = ms.value_and_grad(lambda *xs: ms_loss(run(*xs), inputs), None, params)(*inputs)
    return loss.asnumpy(), [g.asnumpy() for g in grads]


def nudged_step_error(cell, batch, ms_loss) -> float:
    """How far one device's loss and gradients move (`_step_error`) when the batch's floating inputs are scaled by
    1 +- 2^-23 (`nudged_batches`): the rounding the model amplifies, named in a failing parallel check's reason so
    that conditioning is told from a wrong layout (MobileViT: one device moves 9.6e-3, the simulation is 5.6e-3
    from it; a wrong layout is off by a whole gradient)."""
    from mindspore_hyper.migrate.compare import to_mindspore

    params = cell.trainable_params()
    want_loss, want = _loss_and_gradients(cell, params, [to_mindspore(x) for x in batch], ms_loss)
    nudged = [to_mindspore(x) for x in nudged_batches([tuple(batch)])[0]]
    got_loss, got = _loss_and_gradients(cell, params, nudged, ms_loss)
    return _step_error(got_loss, got, want_loss, want)


def parallel_step_error(cell, batch, ms_loss, plan) -> float:
    """The converted Cell under auto_parallelize in simulation: a 2 x 2 data x tensor mesh with `plan`'s
    module_level / parameter_level entries (a TensorPlan; None: data 4 only): the worst relative difference of the
    loss and of every parameter's gradient from the same step on one device (equal gradients make the optimizer
    step equal). With a plan, some parameter must come out sharded over "tensor". The context is reset
    afterwards."""
    import mindspore as ms
    import mindspore_hyper as mh
    from mindspore_hyper.migrate.compare import to_mindspore

    inputs = [to_mindspore(x) for x in batch]
    params = cell.trainable_params()
    want_loss, want = _loss_and_gradients(cell, params, inputs, ms_loss)
    config = (plan.parallel_config(data=2) if plan is not None else
              {"parallel_config": {"device_matrix": [4], "alias_names": ["data"]}})
    mh.set_context(mode="simulation", device_num=4)
    try:
        simulated = mh.auto_parallelize(cell, config)
        if plan is not None and not any(1 in r.layout.sharded_axes() for r in simulated.table):  # mesh axis 1: tensor
            raise AssertionError(f"the plan ({plan.source}, first entry {plan.module_level[0]['name']}) sharded "
                                 f"nothing over tensor")
        got_loss, got = _loss_and_gradients(simulated, params, inputs, ms_loss)
    finally:
        mh.reset_context()
        ms.set_context(mode=ms.PYNATIVE_MODE)
    return _step_error(got_loss, got, want_loss, want)


def pipeline_step_error(cell, batch, ms_loss) -> float:
    """The converted Cell's loss under auto_parallelize with `pipeline: 2` on every Cell (`name: "*"`: the stages
    cut its layer list) in simulation, one train_step with learning rate 0: the worst relative difference of the
    loss and of every parameter's gradient (PipelineModel.last_gradients) from one device's. The context is reset
    afterwards."""
    import mindspore as ms
    import mindspore_hyper as mh
    from mindspore import nn
    from mindspore_hyper.migrate.compare import to_mindspore
    from mindspore_hyper.pipeline import PipelineModel

    class LossOf(nn.Cell):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def construct(self, *xs):
            return ms_loss(self.lm(*xs), xs)

    inputs = [to_mindspore(x) for x in batch]
    model = LossOf(cell)
    params = model.trainable_params()
    want_loss, want = ms.value_and_grad(model, None, params)(*inputs)
    config = {"parallel_config": {"device_matrix": [2], "alias_names": ["pipeline"],
                                  "module_level": [{"name": "*", "strategy": {"pipeline": 2}}]}}
    mh.set_context(mode="simulation", device_num=2)
    try:
        parallel = mh.auto_parallelize(model, config)
        if not isinstance(parallel, PipelineModel):
            raise AssertionError(f"pipeline: 2 gave a {type(parallel).__name__}, not a PipelineModel")
        got_loss = parallel.train_step(nn.SGD(parallel.optimizer_parameters(), learning_rate=0.0), *inputs)
        grads = parallel.last_gradients
    finally:
        mh.reset_context()
        ms.set_context(mode=ms.PYNATIVE_MODE)
    missing = [p.name for p in params if p.name not in grads]
    if missing:
        raise AssertionError(f"pipeline: no gradient for {len(missing)} parameters, e.g. {missing[0]}")
    return _step_error(got_loss.asnumpy(), [grads[p.name] for p in params], want_loss.asnumpy(),
                       [w.asnumpy() for w in want])


def parallel_only(row: SweepRow, limit: Optional[float] = None, shapes=((2, 8), (3, 11))) -> SweepRow:
    """A passing row with only the parallel checks run again (bench_migration.py --parallel-only): the family
    built and converted as sweep_one does, then parallel_checks on the first training batch; no torch training and
    no float64 reference. Returns a copy of `row` with the parallel fields merged in; its status stays the
    port's (a failing check, or a rebuild that fails, is named in parallel_reason only, as sweep_one does)."""
    from mindspore_hyper.migrate import convert

    new = copy.deepcopy(row)
    new.parallel_error = new.pipeline_error = None
    new.parallel_source = new.parallel_reason = ""
    stage = "convert"
    start = time.perf_counter()
    try:
        with _time_limit(limit):
            model = build_model(row.family, row.head)
            module = wrapped(model, row.head)
            cell, report = convert(module, inputs_for(model, row.head, *shapes[0], seed=0))
            _, ms_loss = losses(row.head, report, getattr(model.config, "num_labels", 5))
            stage = parallel_checks(new, model, row.head, cell, inputs_for(model, row.head, *shapes[0], seed=10),
                                    ms_loss)
            new.stage = stage
    except Exception as exc:  # noqa: BLE001 - a failing check is the parallel column's reason
        new.parallel_reason = new.parallel_reason or f"{stage}: {_first_line(exc)}"
    new.seconds = row.seconds + time.perf_counter() - start
    return new


def train_torch(model: torch.nn.Module, batches, torch_loss, lr: float = 1e-2, weight_decay: float = 0.01,
                eps: float = 1e-3) -> List[float]:
    """train_both's torch side alone (the float64 reference run)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, eps=eps)
    found = []
    for batch in batches:
        opt.zero_grad()
        loss = torch_loss(model(*batch), batch)
        loss.backward()
        opt.step()
        found.append(float(loss.detach()))
    return found


ROUNDING_FACTOR = 3.0


def loss_error(want: List[float], got: List[float], exact: Optional[List[float]] = None) -> float:
    """Worst difference between each training step's MindSpore loss and torch's in units of what is allowed.

    Allowed at step k: TOL * |torch loss|, or, from the second step on and when `exact` (the losses of the same
    torch training in float64) is given and it is larger, ROUNDING_FACTOR * |torch loss - float64 loss| (the
    reason: the module docstring and parameter_error). The first step's loss (the converted forward at the
    initial weights, before any optimizer step can amplify rounding) is held to TOL alone, so a family whose
    float32 training is chaotic does not pass on the allowance unless its forward agrees first.

    Args:
        want: torch float32's loss at each step.
        got: the Cell's loss at each step (same batches).
        exact: torch float64's loss at each step, or None (the fixed tolerance only).

    Returns:
        max over steps of |got - want| / allowed (<= 1 passes); `loss_error.where` is the worst step (0-based).

    Raises:
        ValueError: the lists differ in length.
    """
    if len(got) != len(want) or exact is not None and len(exact) != len(want):
        raise ValueError(f"loss_error: want, got and exact must have one loss per step; got lengths {len(want)}, "
                         f"{len(got)} and {None if exact is None else len(exact)}")
    worst, where = 0.0, 0
    for k, (w, g) in enumerate(zip(want, got)):
        allowed = TOL * max(abs(w), 1e-12)
        if exact is not None and k > 0 and np.isfinite(exact[k]):
            allowed = max(allowed, ROUNDING_FACTOR * abs(w - exact[k]))
        units = abs(g - w) / allowed
        units = units if np.isfinite(units) else float("inf")  # a NaN loss on either side fails
        if units > worst or k == 0:
            worst, where = units, k
    loss_error.where = where
    return worst


def parameter_error(module: torch.nn.Module, cell, report, floor: float = 1e-3,
                    reference: Optional[torch.nn.Module] = None) -> float:
    """Worst difference between every trained torch parameter and the Cell parameter it went to (report.weights;
    blocks that became mindspore_hyper.moe.MoE compared in MoE's layout through moe_weights) in units of what is
    allowed: TOL * max(max |torch|, floor) (as migrate_training.max_parameter_error), or, when `reference` (the
    same torch training in float64) is given and it is larger, ROUNDING_FACTOR * max |torch - reference|.

    Why the second: AdamW with eps 1e-3 turns float32 rounding of gradient components near eps into step
    differences, so after 5 steps float32 runs of one computation can differ by more than 1e-4 of a parameter
    (ViT: 1.2e-4) though every gradient agrees. The Cell's first-step gradients are measured within 1.7x of
    torch's own float32 distance from float64 (ViT, every parameter), so |cell - torch| <= |cell - f64| +
    |torch - f64| <= (1.7 + 1) |torch - f64|: 3x. <= 1 passes."""
    from mindspore_hyper.migrate.moe_blocks import moe_weights
    from mindspore_hyper.migrate.state_dict import cell_parameters

    params = cell_parameters(cell)
    expected: Dict[str, np.ndarray] = {}
    moe = [p for p, layer in report.layers.items() if layer == "mindspore_hyper.moe.MoE"]
    for path in moe:
        for name, (value, _, _) in moe_weights(module.get_submodule(path), path).items():
            expected[name] = value
    # parameters the forward never reads (CLIP's post_layernorm under CLIPForImageClassification) have no torch
    # gradient, so torch's AdamW skips them; the Cell's optimizer (migrate_training.AdamW) decays them
    trained = {n: p for n, p in module.named_parameters() if p.grad is not None}
    parameter_error.unused = [n for n, p in module.named_parameters() if p.grad is None]
    covered = set()
    for placed in report.weights.placed:
        covered.add(placed.torch_name)
        if placed.torch_name in trained and not any(placed.torch_name.startswith(f"{p}.") for p in moe):
            expected[placed.cell_name] = trained[placed.torch_name].detach().numpy()
    missing = [n for n, _ in module.named_parameters() if n not in covered]
    assert not missing, f"torch parameters without a Cell parameter: {missing}"
    exact: Dict[str, np.ndarray] = {}
    if reference is not None:
        ref = {n: p.detach().numpy() for n, p in reference.named_parameters()}
        for placed in report.weights.placed:
            if placed.torch_name in ref and placed.cell_name in expected and not any(
                    placed.torch_name.startswith(f"{p}.") for p in moe):
                exact[placed.cell_name] = ref[placed.torch_name]
    worst, where = 0.0, ""
    for name, want in expected.items():
        if want.size == 0:  # an empty parameter (MobileBERT's 0-output `predictions.dense`) has nothing to compare
            continue
        got = params[name].asnumpy().reshape(want.shape)
        allowed = TOL * max(float(np.abs(want).max()), floor)
        if name in exact:
            allowed = max(allowed, ROUNDING_FACTOR * float(np.abs(want - exact[name]).max()))
        error = float(np.abs(got - want).max()) / allowed
        if error > worst:
            worst, where = error, name
    parameter_error.where = where
    return worst


def table(rows: List[SweepRow]) -> str:
    """The markdown table of the rows, passes counted over the families that built; the last column is the
    parallel check (parallel_cell)."""
    lines = ["| family | head | model | result | first failing op / module and reason | parallel (simulation) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        result = r.status if r.status != "fail" else f"fail ({r.stage})"
        reason = r.reason.replace("|", "\\|").replace("\n", " ")
        if r.status == "pass":
            losses_units = "" if r.loss_units is None else f" ({r.loss_units:.2f} x allowed)"
            reason = (f"forward {r.forward_error:.1e}, losses over 5 AdamW steps {r.train_error:.1e}{losses_units}, "
                      f"parameters {r.parameter_units:.2f} x allowed")
            if r.fallbacks:
                reason += "; traced body: " + "; ".join(r.fallbacks).replace("|", "\\|")
        lines.append(f"| {r.family} | {r.head} | {r.model} | {result} | {reason} | {parallel_cell(r)} |")
    return "\n".join(lines)


def parallel_cell(r: SweepRow) -> str:
    """The parallel column: pass with the splits' source and the one-step errors, fail with the reason, or empty
    (not run: the row failed before, or predates the check)."""
    if r.parallel_reason:
        return "fail: " + r.parallel_reason.replace("|", "\\|").replace("\n", " ")
    if r.parallel_error is None:
        return ""
    source = r.parallel_source or "hand-written patterns"  # rows of the sweep before tensor_parallel_plan
    mesh = source if source.startswith("data") else f"2 x 2 data x tensor ({source})"
    text = f"pass: {mesh} {r.parallel_error:.1e}"
    if r.pipeline_error is not None:
        text += f"; pipeline 2 {r.pipeline_error:.1e}"
    return text


def pass_rate(rows: List[SweepRow]) -> Tuple[int, int]:
    built = [r for r in rows if r.status != "not built"]
    return sum(r.status == "pass" for r in built), len(built)
