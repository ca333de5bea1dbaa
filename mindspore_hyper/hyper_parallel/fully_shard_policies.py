"""Upstream's `fully_shard` policies (`core.fully_shard.utils`): mixed precision and offload.

`fully_shard` takes the ones whose effect this package reproduces, and refuses the others by
name when it is called (never a silently different training):
- `OffloadPolicy()` is "no offload", the default: the same as passing nothing.
- `CPUOffloadPolicy(...)` keeps the shards in host memory between uses: refused here (this
  package's host/disk tiers are `mindspore_hyper.offload.hyper_offload`).
- `MixedPrecisionPolicy(...)` acts with torch FSDP2's semantics (`fully_shard.py`, `_gather`):
  the sharded Parameters keep their dtype (the float32 master weights, what the optimizer
  updates); each forward gathers them and casts the gathered copy to `param_dtype` for compute;
  the gradient comes back through the cast in the Parameters' dtype and is reduced (reduce-
  scattered) in it, so `reduce_dtype` must be the Parameters' own dtype (None means
  `param_dtype`, as in torch, so None with a narrower `param_dtype` is refused: pass
  `reduce_dtype=float32`). `cast_forward_inputs=True` casts the Cell's floating inputs to
  `param_dtype`; `output_dtype` casts its floating outputs. `apply_grad_on_fp32_main_grad=True`
  adds each backward's reduced gradients onto `param.main_grad` (`main_grad.py`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

import mindspore as ms

__all__ = ["MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy", "check_policies", "compute_dtype",
           "FLOAT_DTYPES"]

FLOAT_DTYPES = (ms.float16, ms.bfloat16, ms.float32, ms.float64)  # what the dtype fields may name


@dataclass
class MixedPrecisionPolicy:
    """Upstream's and torch FSDP2's mixed-precision settings for fully_shard (dtypes are MindSpore
    floating dtypes; see the module docstring for what acts and what is refused).

    Attributes:
        param_dtype: dtype the gathered parameters are computed in (None: their own).
        reduce_dtype: dtype gradients are reduced in (None: param_dtype, as torch); must be the
            Parameters' own dtype.
        output_dtype: dtype the Cell's floating outputs are cast to (None: no cast).
        cast_forward_inputs: cast the Cell's floating inputs to param_dtype (when it is set).
        apply_grad_on_fp32_main_grad: accumulate reduced gradients on `param.main_grad`.
    """

    param_dtype: Optional[Any] = None
    reduce_dtype: Optional[Any] = None
    output_dtype: Optional[Any] = None
    cast_forward_inputs: bool = True
    apply_grad_on_fp32_main_grad: bool = False


@dataclass
class OffloadPolicy:
    """No offloading (upstream's default policy and the base of the others)."""


@dataclass
class CPUOffloadPolicy(OffloadPolicy):
    """Shards kept in host memory, copied in before each gather (refused here: module docstring).

    Attributes:
        pin_memory: pin the host buffers.
    """

    pin_memory: bool = True


def check_policies(mp_policy, offload_policy, param_dtypes: Iterable[Any]) -> None:
    """Accept the policies `fully_shard` runs for Parameters of `param_dtypes` (module docstring).

    Args:
        mp_policy: None or a MixedPrecisionPolicy.
        offload_policy: None or an OffloadPolicy.
        param_dtypes: the dtypes of the Parameters fully_shard manages.

    Raises:
        ValueError: a policy of another type, CPU offload, a dtype field that is not a floating
            MindSpore dtype, a gradient reduction in another dtype than the Parameters', or a
            flag that is not a bool (each named with the field and what is expected).
    """
    if offload_policy is not None:
        if not isinstance(offload_policy, OffloadPolicy):
            raise ValueError(f"fully_shard: offload_policy must be an OffloadPolicy, got {type(offload_policy).__name__}")
        if type(offload_policy) is not OffloadPolicy:
            raise ValueError(f"fully_shard(offload_policy={offload_policy!r}): host offload of the shards is not "
                             "provided through fully_shard; pass OffloadPolicy() (no offload) and use "
                             "mindspore_hyper.offload.hyper_offload for host/disk tiers")
    if mp_policy is None:
        return
    if not isinstance(mp_policy, MixedPrecisionPolicy):
        raise ValueError(f"fully_shard: mp_policy must be a MixedPrecisionPolicy, got {type(mp_policy).__name__}")
    for field in ("param_dtype", "reduce_dtype", "output_dtype"):
        value = getattr(mp_policy, field)
        if value is not None and not any(value is d for d in FLOAT_DTYPES):
            raise ValueError(f"fully_shard(mp_policy.{field}={value!r}): expected None or a floating MindSpore "
                             f"dtype ({', '.join(map(str, FLOAT_DTYPES))})")
    for field in ("cast_forward_inputs", "apply_grad_on_fp32_main_grad"):
        if not isinstance(getattr(mp_policy, field), bool):
            raise ValueError(f"fully_shard(mp_policy.{field}={getattr(mp_policy, field)!r}): expected a bool")
    floats = {d for d in param_dtypes if any(d is f for f in FLOAT_DTYPES)}
    reduce_dtype = mp_policy.reduce_dtype if mp_policy.reduce_dtype is not None else mp_policy.param_dtype
    if reduce_dtype is not None and floats - {reduce_dtype}:
        said = "" if mp_policy.reduce_dtype is not None else " (None: param_dtype's, as in torch)"
        raise ValueError(f"fully_shard(mp_policy.reduce_dtype={reduce_dtype}{said}): the Parameters are "
                         f"{sorted(map(str, floats))}; gradients are reduced in the Parameters' own dtype (the "
                         f"gathered copy is cast to param_dtype after the gather), so reduce_dtype must be that "
                         f"dtype: pass reduce_dtype={sorted(map(str, floats))[0]}")


def compute_dtype(mp_policy: Optional[MixedPrecisionPolicy], dtype) -> Any:
    """The dtype a gathered Parameter of `dtype` is computed in under `mp_policy`: `param_dtype`
    for a floating Parameter when set, else `dtype` (integer Parameters are never cast)."""
    if mp_policy is None or mp_policy.param_dtype is None or not any(dtype is f for f in FLOAT_DTYPES):
        return dtype
    return mp_policy.param_dtype
