"""MindFormers 2.0.0's PyNative GPT (a tiny Qwen3), parallelized by MindFormers' own
`parallelize_gptmodel` on 4 devices (simulated in one process, or 4 msrun processes), against the
same model on one device.

An experiment, not part of the package: MindFormers is not a dependency. Install it outside the
package's environment and point PYTHONPATH at it (docs/hyper_parallel.md, "MindFormers 2.0"):

    .venv/bin/pip download mindformers==2.0.0 --no-deps -d /tmp/mf_wheel
    .venv/bin/pip install --no-deps --target /tmp/mf_site /tmp/mf_wheel/mindformers-2.0.0-py3-none-any.whl
    # + the light packages it imports (--no-deps): Deprecated wrapt requests jieba rouge_chinese nltk
    #   datasets pandas==2.2.3 "pyarrow<20" pytz sentencepiece tiktoken mindpet tensorboardX ...
    PYTHONPATH=/tmp/mf_site .venv/bin/python examples/mindformers_qwen3_fsdp.py      # simulation
    PYTHONPATH=/tmp/mf_site .venv/bin/mindspore-hyper run --processes 4 examples/mindformers_qwen3_fsdp.py  # msrun

What it does, and what it changes:
- MindSpore 2.10's CPU backend lacks kernels MindFormers' layers call (`mint.arange`,
  `mint.outer`, `mint.zeros_like`, `mint.scatter_add`, the fused `rms_norm`, `FlashAttentionScore`). The script gives those names CPU
  implementations of the same math, in both runs (single device and 4 devices), before building the model.
- Everything else is MindFormers' code: its `ParallelDims` builds the meshes (torch's private
  `DeviceMesh._unflatten`/`_flatten`, which this package's DeviceMesh provides), and
  `parallelize_gptmodel` applies its FSDP plan (fully_shard on the embedding, every layer, the
  final norm, the output layer and the root, prefetch chains, `disable_fsdp_gradient_division`).
- `apply_fsdp` passes `MixedPrecisionPolicy(reduce_dtype=float32, apply_grad_on_fp32_main_grad=True)`:
  each backward adds the reduced gradients onto `param.main_grad`. The 4-device run trains as
  MindFormers' Trainer does (`training_step`/`_optimizer_update`): `enable_mindspore_backward_compat()`,
  `loss.backward(sense)` with its sense for 4 devices (1/4), the optimizer on `main_grad` (its
  `get_grad`), `zero_grad()`; 5 Adam steps, compared with
  one device trained on `mindspore.value_and_grad`'s gradients. The Trainer itself is not run
  (its config, data and checkpoint machinery are beyond this example).
- Every device trains on the same batch (2 sequences: too few to split over 4): the ranks'
  gradients summed (MindFormers disables FSDP's division) times the sense 1/4 are one device's.
- Under msrun every process first trains the one-device model itself (the reference), then its
  rank of the FSDP model; each process compares its losses, and its gradients and weights
  gathered from the ranks' pieces (`DTensor.from_local(...).full_tensor()`), with one device's.

Tensor parallelism (`--tp 2`: tp 2 x dp_shard 2) stops inside MindFormers: its TP plan for GPT
(`apply_non_moe_tp`) is written for MLA attention (`linear_qb`/`linear_kvb`) and stops on Qwen3's
attention (parallelize.py:738 reads `config.q_lora_rank`, which a non-MLA TransformerConfig lacks:
AttributeError, tried in simulation and under msrun).
"""
import argparse
import importlib.util
import sys

import numpy as np
import mindspore as ms
from mindspore import Tensor, mint, nn, ops

import mindspore_hyper as mh
from mindspore_hyper.hyper_parallel import install_hyper_parallel
from mindspore_hyper.hyper_parallel.script_runner import under_msrun

STEPS, BATCH, SEQ, VOCAB = 5, 2, 8, 64


def cpu_kernels() -> None:
    """CPU implementations of the kernels MindSpore 2.10's CPU backend lacks (same math)."""
    import mindformers.pynative.layers.flash_attention as flash_attention
    import mindformers.pynative.layers.layer_norm as layer_norm

    mint.arange = lambda *args, **kwargs: ops.arange(*args, **kwargs)
    mint.outer = lambda a, b: ops.outer(a, b)
    mint.zeros_like = lambda x, dtype=None: ops.zeros_like(x, dtype=dtype)
    mint.scatter_add = lambda x, dim, index, src: ops.tensor_scatter_elements(x, index, src, axis=dim, reduction="add")

    def rms_norm(x, weight, eps=1e-6):
        rstd = ops.rsqrt((x * x).mean(-1, keep_dims=True) + eps)
        return x * rstd * weight, rstd

    class FlashAttentionScore:
        """softmax(scale q k^T, -1e9 where attn_mask is 1) v for BNSD inputs (the output only)."""

        def __init__(self, head_num, scale_value, pre_tokens, next_tokens, inner_precise, input_layout,
                     sparse_mode):
            if input_layout != "BNSD":
                raise ValueError(f"FlashAttentionScore on CPU: input_layout {input_layout!r}; only BNSD is written")
            self.scale = scale_value

        def __call__(self, query, key, value, real_shift=None, padding_mask=None, attn_mask=None, prefix=None,
                     actual_seq_qlen=None, actual_seq_kvlen=None):
            scores = ops.matmul(query, key.transpose(0, 1, 3, 2)) * self.scale
            if attn_mask is not None:
                scores = scores + attn_mask.astype(scores.dtype) * -1e9
            return None, None, None, ops.matmul(ops.softmax(scores, -1), value)

    layer_norm.rms_norm = rms_norm
    flash_attention.FlashAttentionScore = FlashAttentionScore


def build_model():
    """The tiny Qwen3 (2 layers, hidden 32, 4 heads of 8, vocab 64), weights from a fixed seed."""
    from mindformers.models.qwen3.configuration_qwen3 import Qwen3Config
    from mindformers.models.qwen3.modeling_qwen3_train_pynative import PyNativeQwen3ForCausalLM

    config = Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, head_dim=8, max_position_embeddings=SEQ * 2,
                         compute_dtype="float32", params_dtype="float32", use_flash_attention=False,
                         attention_dropout=0.0, hidden_dropout=0.0)
    model = PyNativeQwen3ForCausalLM(config)
    rng = np.random.RandomState(0)
    for name, param in model.parameters_and_names():
        value = np.ones(param.shape) if "norm" in name else rng.randn(*param.shape) * 0.1
        param.set_data(Tensor(value.astype(np.float32)))
    model.set_train(True)
    return model


def parallelize(model, tp: int = 1):
    """MindFormers' `parallelize_gptmodel` with FSDP over 4 devices, or with `tp` 2: tensor
    parallel 2 x FSDP 2 (module docstring: it stops inside MindFormers for Qwen3)."""
    from types import SimpleNamespace

    import mindformers.pynative.base_models.gpt.parallelize as gpt_parallelize
    from mindformers.pynative.distributed.parallel_dims import ParallelDims

    dims = ParallelDims(dp_replicate=1, dp_shard=-1, cp=1, tp=tp, pp=1, ep=1, world_size=4)  # FSDP over the rest
    dims.build_mesh()
    parallelism = SimpleNamespace(enable_loss_parallel=False, enable_mc2=False, context_parallel_method="colossal",
                                  context_parallel_async=False, pipeline_parallel=1, tensor_parallel=tp,
                                  reshard_after_forward_policy="default", cpu_offload=False, data_parallel=4 // tp,
                                  data_parallel_shard=-1, moe_token_dispatcher_type="alltoall")
    off = SimpleNamespace(mode="None", enable=False)
    (model,), _, _, _ = gpt_parallelize.parallelize_gptmodel(model, dims, parallelism, off, off, off)
    return model


def train(model, trainer_loop: bool = False):
    """5 Adam steps on a fixed batch; the losses, the first step's gradients and the final weights.

    One device: `mindspore.value_and_grad`'s gradients. `trainer_loop`: MindFormers' Trainer's
    step (`_forward_backward`, `_optimizer_update`): `loss.backward(sense)` with its sense for 4
    data-parallel devices, 1/4 (its FSDP sums the ranks' gradients), the optimizer on
    `param.main_grad` (its `get_grad`), then `zero_grad()`."""
    from mindformers.pynative.trainer.utils import get_grad

    ids = Tensor(np.random.RandomState(1).randint(0, VOCAB, (BATCH, SEQ)).astype(np.int32))
    optimizer = nn.Adam(model.trainable_params(), learning_rate=1e-2)
    grad_fn = ms.value_and_grad(lambda x: model(input_ids=x, labels=x)[0], None, optimizer.parameters)
    losses, first_grads = [], None
    for _ in range(STEPS):
        if trainer_loop:
            loss = model(input_ids=ids, labels=ids)[0]
            loss.backward(Tensor([1 / 4], ms.float32))  # get_loss_sense's value for 4 devices, its shape
            grads = tuple(get_grad(p) for p in optimizer.parameters)
        else:
            loss, grads = grad_fn(ids)
        first_grads = first_grads or {p.name: g.asnumpy() for p, g in zip(optimizer.parameters, grads)}
        optimizer(grads)
        if trainer_loop:
            model.zero_grad()
        losses.append(float(loss.asnumpy()))
    return losses, first_grads, {p.name: p.asnumpy() for p in model.trainable_params()}


def whole(dtensor, value: np.ndarray) -> np.ndarray:
    """`value` (a Parameter's value or gradient) as the whole tensor: in simulation it is already;
    under msrun it is this rank's piece of `dtensor`'s layout, gathered from every rank."""
    from hyper_parallel import DTensor

    if value.shape == tuple(dtensor.shape):
        return value
    piece = DTensor.from_local(Tensor(value), dtensor.device_mesh, dtensor.placements, shape=dtensor.shape)
    return piece.full_tensor().asnumpy()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, choices=(1, 2), default=1,
                        help="MindFormers' tensor parallelism: 1 (FSDP over 4) or 2 (tp 2 x FSDP 2; stops in "
                             "MindFormers' MLA-only TP plan, module docstring)")
    args = parser.parse_args()
    if importlib.util.find_spec("mindformers") is None:  # an experiment's dependency, not the package's
        print("mindformers is not installed: install it outside the package's environment and set PYTHONPATH, "
              "as this script's docstring says")
        return 2
    install_hyper_parallel()
    ms.set_context(mode=ms.PYNATIVE_MODE)
    cpu_kernels()

    one_losses, one_grads, one_weights = train(build_model())  # every msrun rank computes it too
    if not under_msrun():  # under `mindspore-hyper run --processes 4` each process is one rank already
        mh.set_context(mode="simulation", device_num=4)
    try:
        model = parallelize(build_model(), args.tp)
    except (ValueError, AttributeError) as error:  # AttributeError: MindFormers' TP plan on Qwen3 (docstring)
        print(f"parallelize_gptmodel stopped: {type(error).__name__}: {error}")
        return 1
    from mindspore_hyper.hyper_parallel import laid_out_parameters

    placements = {name: dt.placements for name, dt in laid_out_parameters(model).items()}
    split = sorted(name for name, p in placements.items() if any(type(x).__name__ == "Shard" for x in p))
    print(f"{len(split)} of {len(list(model.trainable_params()))} parameters split over the 4 devices "
          f"(e.g. {split[0]}: {placements[split[0]]})")
    from hyper_parallel.platform.mindspore.autograd_compat import enable_mindspore_backward_compat

    enable_mindspore_backward_compat()  # as MindFormers' Trainer does (trainer.py:153)
    losses, grads, weights = train(model, trainer_loop=True)
    by_path = laid_out_parameters(model)  # keyed by path in the model; train() keys by Parameter name
    laid_out = {param.name: by_path[name] for name, param in model.parameters_and_names()}
    grads = {k: whole(laid_out[k], v) for k, v in grads.items()}
    weights = {k: whole(laid_out[k], v) for k, v in weights.items()}
    print("step  one device      4 devices (FSDP)")
    for step, (a, b) in enumerate(zip(one_losses, losses)):
        print(f"{step:4d}  {a:.7f}  {b:.7f}")
    loss_diff = max(abs(a - b) / abs(a) for a, b in zip(one_losses, losses))
    grad_diff = max(float(np.abs(grads[k] - one_grads[k]).max() / np.abs(one_grads[k]).max()) for k in one_grads)
    weight_diff = max(float(np.abs(weights[k] - one_weights[k]).max()) for k in one_weights)
    print(f"max relative loss difference {loss_diff:.2e}; first step's gradients: max difference / max |gradient| "
          f"{grad_diff:.2e} (per parameter, worst); max weight difference after {STEPS} steps {weight_diff:.2e}")
    # FSDP changes only the order of float32 sums (a gradient summed from 4 shards' batches): after
    # STEPS Adam steps the loss moves by a few units of float32 rounding (u = 6e-8) per step, far below 1e-5.
    if loss_diff > 1e-5:
        print(f"FAILED: the 4-device losses differ from one device's by {loss_diff:.2e} (> 1e-5)")
        return 1
    where = "4 msrun processes (this rank's view)" if under_msrun() else "4 simulated devices"
    print(f"OK: MindFormers' FSDP on {where} trains like one device")
    return 0


if __name__ == "__main__":
    sys.exit(main())
