"""Upstream's `fully_shard` policies (`core.fully_shard.utils`): mixed precision and offload.

`fully_shard` takes the ones whose effect this package reproduces, and refuses the others by
name when it is called (never a silently different training):
- `OffloadPolicy()` is "no offload", the default: the same as passing nothing.
- `CPUOffloadPolicy(...)` keeps the shards in host memory between uses: refused here (this
  package's host/disk tiers are `mindspore_hyper.offload.hyper_offload`).
- `MixedPrecisionPolicy(...)` is taken when it changes no value for the Cell: no `param_dtype`
  or `output_dtype` cast, and a `reduce_dtype` that is None or every Parameter's own dtype (a
  float32 model reducing in float32). `apply_grad_on_fp32_main_grad=True` acts: each backward
  adds the reduced gradients onto `param.main_grad` (`main_grad.py`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

__all__ = ["MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy", "check_policies"]


@dataclass
class MixedPrecisionPolicy:
    """Upstream's mixed-precision settings for fully_shard (dtypes are MindSpore dtypes).

    Attributes:
        param_dtype: dtype the gathered parameters are computed in (None: their own).
        reduce_dtype: dtype gradients are reduced in (None: param_dtype).
        output_dtype: dtype the Cell's outputs are cast to (None: no cast).
        cast_forward_inputs: cast floating inputs to param_dtype.
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
    """Accept the policies whose effect is the default's for Parameters of `param_dtypes`.

    Args:
        mp_policy: None or a MixedPrecisionPolicy.
        offload_policy: None or an OffloadPolicy.
        param_dtypes: the dtypes of the Parameters fully_shard manages.

    Raises:
        ValueError: a policy of another type, CPU offload, or mixed precision that would cast a
            value (each named with the way that runs).
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
    if mp_policy.param_dtype is not None or mp_policy.output_dtype is not None:
        raise ValueError(f"fully_shard(mp_policy={mp_policy!r}): param_dtype/output_dtype casts are not supported "
                         "yet; build the model in the dtype to compute in and leave them None")
    dtypes = set(param_dtypes)
    if mp_policy.reduce_dtype is not None and dtypes - {mp_policy.reduce_dtype}:
        raise ValueError(f"fully_shard(mp_policy.reduce_dtype={mp_policy.reduce_dtype}): the Parameters are "
                         f"{sorted(map(str, dtypes))}; reducing gradients in another dtype is not supported yet "
                         "(leave reduce_dtype None)")
    if not isinstance(mp_policy.apply_grad_on_fp32_main_grad, bool):
        raise ValueError(f"fully_shard(mp_policy.apply_grad_on_fp32_main_grad="
                         f"{mp_policy.apply_grad_on_fp32_main_grad!r}): expected a bool")
