"""Random ops on DTensors: every device gets its part of the values ONE device would draw.

The scheme (docs/training.md, "Random numbers"): a random op on DTensors draws once, for the
GLOBAL shape, with the op's own seeds and generator state, exactly as the single-device model
makes that call; each device keeps the part its shard covers. So masks and random values equal
single-device training's bit for bit under data, tensor and sequence parallelism, at any world
size and in every mode (each process of an msrun job draws the same global values from the same
seed and slices its own part). Cost: one global-size draw per call and process.

- `Dropout` (`nn.Dropout`, `ops.dropout`): the global draw runs on a tensor of ones (MindSpore's
  Dropout mask depends on the shape, the seeds and the primitive's state, never on the values);
  each shard of the input is then multiplied by its part of `mask * (1 / keep_prob)` in float32
  and rounded to the input's dtype, which is what MindSpore's CPU kernel computes (forward and
  backward equal it bitwise in float32 and float16). The input is not gathered; a Partial input is
  reduced first (the single device scales the sum, not the pieces). bfloat16 on the CPU with
  `cpu_bfloat16="emulate"` (MindSpore has no bfloat16 CPU Dropout): the mask is the float32 run's
  (drawn on float32 ones: equal to it bit for bit), and the input (rounded to bfloat16 first in a
  BF16 Cell) is scaled in float32 and rounded once to bfloat16, as Ascend's kernel does.
- Every other random op (`RANDOM_OPS`, or a primitive carrying seed attributes): its inputs are
  gathered and it runs once on the whole tensors (a replication fallback in the report); with
  bfloat16 emulated, on float32 copies (the float32 run's draw), floating outputs rounded once.
- In-place random ops (`Tensor.uniform_`, `normal_`, ...) are refused: MindSpore 2.10 has no CPU
  kernel for them, and a per-shard draw would differ from the single device's.

Random ops that take no DTensor (`ops.uniform`, `ops.randn`, `ops.rand`, `ops.normal` with shape
arguments, `ops.rand_like` of a DTensor, which MindSpore reads only for its shape) never reach the
dispatcher: they return a plain global tensor, used replicated, equal to the single device's as
long as the program makes the same random calls in the same order (it does: the simulation runs
the model's Python once per step, like one device).
"""
from __future__ import annotations

from typing import Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

from mindspore_hyper import bfloat16_emulation
from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["MASK_OPS", "RANDOM_OPS", "INPLACE_RANDOM_OPS", "random_kind", "draw_kind", "apply_dropout",
           "inplace_refusal"]

# Drawn on ones of the global shape; the input's shards are multiplied by their parts of the mask.
MASK_OPS = ("Dropout",)

# Run once on gathered inputs (their draws depend on input values, or are not verified mask-only).
RANDOM_OPS = frozenset((
    "DropoutExt", "FuncDropoutExt", "Dropout2D", "Dropout3D", "Dropout2dExt", "DropoutGenMask",
    "DropoutGenMaskV3", "DropoutGenMaskExt", "DropoutDoMask", "DropoutDoMaskExt", "StatelessDropOutGenMask",
    "Bernoulli", "BernoulliExt", "Multinomial", "MultinomialExt", "MultinomialWithReplacement",
    "RandomCategorical", "RandomChoiceWithMask", "RandomShuffle", "Randperm", "RandpermV2", "RandpermExt",
    "StandardNormal", "StandardLaplace", "UniformReal", "UniformInt", "UniformExt", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomGamma", "Gamma", "Poisson", "RandomPoisson", "LogNormalReverse",
    "NormalExt", "NormalFloatFloat", "NormalFloatTensor", "NormalTensorFloat", "NormalTensorTensor",
    "RandExt", "RandLikeExt", "Randn", "RandnLike", "RandInt", "RandIntLike", "NonDeterministicInts",
    "UniformCandidateSampler", "LogUniformCandidateSampler",
))

# Written in place with random values: refused (no CPU kernel in MindSpore 2.10; see module doc).
INPLACE_RANDOM_OPS = frozenset((
    "InplaceUniform", "InplaceNormal", "InplaceRandom", "InplaceExponential", "InplaceBernoulliScalar",
    "InplaceBernoulliTensor",
))

_SEED_ATTRS = frozenset(("seed", "seed2", "Seed0", "Seed1", "seed0", "seed1"))


def random_kind(name: str, attrs: dict) -> Optional[str]:
    """How the dispatcher runs op `name` (its primitive's `attrs`): "mask" (`apply_dropout`),
    "global" (once on gathered inputs), "inplace" (refused), or None (not a random op)."""
    if name in MASK_OPS:
        return "mask"
    if name in INPLACE_RANDOM_OPS:
        return "inplace"
    if name in RANDOM_OPS or not _SEED_ATTRS.isdisjoint(attrs):
        return "global"
    return None


def inplace_refusal(name: str) -> str:
    """The message of the refusal of an in-place random op."""
    return (f"in-place random op on a DTensor: not supported (each device would draw its own values, unlike "
            f"one device; MindSpore 2.10 has no CPU kernel for {name} either); draw out of place, e.g. "
            f"x = ops.uniform(x.shape, ...) or ops.rand_like(x)")


def apply_dropout(call, x: DTensor, draw) -> Tuple[DTensor, DTensor]:
    """Dropout of DTensor `x` with the mask one device would draw (see module docstring).

    Args:
        call: the dispatcher's OpCall of the Dropout primitive (inputs: x, keep_prob, seeds).
        x: the input DTensor.
        draw: runs the primitive on plain tensors (`call.run`): called once, with ones of the
            global shape in place of `x`.

    Returns:
        (output, mask) as the primitive returns them, laid out as `x` (without Partial axes).
    """
    execution = x.execution
    keep_prob = float(call.inputs[1]) if len(call.inputs) > 1 and not isinstance(call.inputs[1], Tensor) \
        else float(call.attrs.get("keep_prob", 0.5))
    if x.layout.is_partial:  # the single device scales the sum, not the pieces
        x = x.redistribute(x.layout.with_partial({}))
    emulate = bfloat16_emulation.emulated_kernel((x.dtype,))  # bfloat16 on the CPU, flag cpu_bfloat16
    rest = list(call.inputs[1:])
    if emulate is None:
        _, mask = draw([ops.ones(x.global_shape, x.dtype)] + rest)
    else:  # the float32 run's draw (the same mask); the mask's dtype is bfloat16 (0 and 1: exact)
        _, mask = bfloat16_emulation.run_in_float32(lambda inputs, kwargs: draw(inputs),
                                                    [ops.ones(x.global_shape, ms.float32)] + rest, {}, "inputs")
    mask = ops.stop_gradient(mask)
    with execution.uncounted():  # the global draw is transient; the shards of the mask are counted
        whole = DTensor._create(TensorLayout.replicated(execution.mesh, len(x.global_shape)), {(): mask},
                                x.global_shape, mask.dtype, execution)
    mask_dt = whole.redistribute(x.layout, record=False)
    if emulate is None:
        return _scaled(x, mask_dt, keep_prob), mask_dt
    with bfloat16_emulation.float32_kernels():  # a BF16 Cell's cast would round the float32 scale
        # the Cell's cast of x first; then Ascend's kernel: x * mask * (1 / keep_prob) in float32, rounded once
        x = x if x.dtype == ms.bfloat16 else ops.cast(x, ms.bfloat16)
        return _scaled(x, mask_dt, keep_prob), mask_dt


def _scaled(x: DTensor, mask: DTensor, keep_prob: float) -> DTensor:
    """`x * mask * (1 / keep_prob)` computed in float32 (MindSpore's CPU kernel), in `x`'s dtype."""
    scale = ops.cast(mask, ms.float32) * float(np.float32(1.0 / keep_prob))  # 0 or float32(1/keep_prob)
    if x.dtype == ms.float32:
        return x * scale
    return ops.cast(ops.cast(x, ms.float32) * scale, x.dtype)  # in float32, rounded once


def draw_kind(call) -> Optional[str]:
    """`random_kind` of a dispatcher OpCall (cheap: called for every op)."""
    return random_kind(call.prim_name or call.name, call.prim.attrs if call.prim is not None else {})
