"""Mamba's selective scan (transformers' `mamba_selective_scan`): one torch op while exporting, one helper after.

transformers' reference scan loops `for index in range(seq_len)` in Python, so torch.export unrolls it at the
example's length and the converted Cell is static in the sequence dimension (Mamba, FalconMamba, Jamba). While
`trace_modules` exports, `exported_scans` replaces the function in the model's modeling modules by the custom op
`mindspore_hyper::selective_scan` (the same recurrence in torch, so the recorded values are torch's); the length
then stays symbolic, and the op becomes the `selective_scan` helper (generated_support.py), which loops over the
run-time length in MindSpore. Calls the op does not cover (the last state returned for a cache, inputs that are not
float32, extra keyword arguments) keep the original function.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import sys
from typing import Iterator, Optional

import torch
import torch.nn.functional as F

from mindspore_hyper.migrate.mappings.common import call
from mindspore_hyper.migrate.mappings.registry import function

__all__ = ["selective_scan", "exported_scans", "SCAN_FUNCTION"]

SCAN_FUNCTION = "mamba_selective_scan"
_PARAMETERS = ("hidden_states", "dt", "A", "B", "C", "D", "z", "delta_bias", "delta_softplus", "return_last_state",
               "use_mambapy", "use_associative_scan", "kwargs")


@torch.library.custom_op("mindspore_hyper::selective_scan", mutates_args=())
def selective_scan(hidden_states: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                   C: torch.Tensor, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
                   delta_bias: Optional[torch.Tensor], delta_softplus: bool) -> torch.Tensor:
    """The recurrent branch of transformers' `mamba_selective_scan` (float32): hidden_states, dt, z (batch,
    channels, length), A (channels, state), B, C (batch, state, length), D, delta_bias (channels)."""
    batch, channels, length = hidden_states.shape
    if delta_bias is not None:
        dt = dt + delta_bias[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    B, C = B.transpose(1, 2), C.transpose(1, 2)
    discrete_A = torch.exp(A[None, :, None, :] * dt[:, :, :, None])
    deltaB_u = dt[:, :, :, None] * B[:, None, :, :] * hidden_states[:, :, :, None]
    state = hidden_states.new_zeros(batch, channels, A.shape[-1])
    outputs = []
    for index in range(length):
        state = discrete_A[:, :, index] * state + deltaB_u[:, :, index]
        outputs.append(torch.matmul(state, C[:, index, :].unsqueeze(-1))[:, :, 0])
    out = torch.stack(outputs, dim=-1)
    if D is not None:
        out = out + hidden_states * D[None, :, None]
    if z is not None:
        out = out * F.silu(z)
    return out


@selective_scan.register_fake
def _selective_scan_shape(hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus):
    return torch.empty_like(hidden_states)


def _as_op(original):
    @functools.wraps(original)
    def scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
             return_last_state=False, use_mambapy=False, use_associative_scan=False, **kwargs):
        # use_mambapy / use_associative_scan choose another algorithm for the same recurrence
        tensors = [t for t in (hidden_states, dt, A, B, C, D, z, delta_bias) if t is not None]
        if return_last_state or kwargs or any(t.dtype != torch.float32 for t in tensors):
            return original(hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus, return_last_state,
                            use_mambapy, use_associative_scan, **kwargs)
        return torch.ops.mindspore_hyper.selective_scan(hidden_states, dt, A, B, C, D, z, delta_bias,
                                                        bool(delta_softplus))
    return scan


def _reference_function(found):
    """The Python function behind a module global: itself, or the one a `kernels` hub wrapper (an nn.Module whose
    forward calls the closed-over `func`, transformers' `use_kernel_func_from_hub_with_fallback`) falls back to."""
    if isinstance(found, torch.nn.Module):
        forward = type(found).forward
        cells = dict(zip(forward.__code__.co_freevars, forward.__closure__ or ()))
        found = cells["func"].cell_contents if "func" in cells else None
    return found if callable(found) else None


@contextlib.contextmanager
def exported_scans(model: torch.nn.Module) -> Iterator[None]:
    """While the body runs, the `mamba_selective_scan` of every modeling module `model`'s classes come from is the
    custom op (only where its signature is the reference one); restored afterwards."""
    saved = []
    for name in sorted({type(m).__module__ for m in model.modules()}):
        owner = sys.modules.get(name)
        original = getattr(owner, SCAN_FUNCTION, None)
        reference = _reference_function(original)
        if reference is None or tuple(inspect.signature(reference).parameters) != _PARAMETERS:
            continue
        saved.append((owner, original))
        setattr(owner, SCAN_FUNCTION, _as_op(original))
    try:
        yield
    finally:
        for owner, original in saved:
            setattr(owner, SCAN_FUNCTION, original)


@function("selective_scan (helper)", torch.ops.mindspore_hyper.selective_scan)
def selective_scan_call(hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus):
    return call("selective_scan", hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus)
