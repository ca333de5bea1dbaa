"""Model FLOPs utilisation: the figures it is computed from and the formula.

MFU = model FLOPs of the step / (seconds x devices x peak FLOP/s per device), with model FLOPs =
FLOPs per token x tokens (training: 3 x the forward's, no recomputation counted; PaLM's
definition). FLOPs per token come from the estimator for a GPT-like `TransformerConfig`
(`estimate.layer_ops.model_flops_per_token`) or from the user; the peak from a hardware preset
(configs/hardware/*.yaml, dense 16-bit), a `Hardware`, a number, or "cpu": this machine measured
by `estimate.calibrate.calibrate_cpu` (one process's float32 matmul FLOP/s).
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

from mindspore_hyper.estimate.calibrate import calibrate_cpu
from mindspore_hyper.estimate.hardware import Hardware, load_hardware
from mindspore_hyper.estimate.layer_ops import model_flops_per_token
from mindspore_hyper.estimate.transformer_config import TransformerConfig

__all__ = ["flops_per_token_of", "peak_flops_of", "model_flops_utilization"]

CPU = "cpu"  # hardware="cpu": calibrate this machine


def flops_per_token_of(flops_per_token: Optional[float] = None,
                       config: Optional[TransformerConfig] = None) -> Optional[float]:
    """Training FLOPs per token: the number given, else the estimator's for `config`, else None.

    Raises:
        ValueError: both or a bad value given (named).
    """
    if flops_per_token is not None and config is not None:
        raise ValueError("flops_per_token=, config=: give one (the config's FLOPs come from the estimator)")
    if config is not None:
        if not isinstance(config, TransformerConfig):
            raise ValueError(f"config: expected an estimate.TransformerConfig, got {type(config).__name__}")
        return float(model_flops_per_token(config))
    if flops_per_token is None:
        return None
    if isinstance(flops_per_token, bool) or not isinstance(flops_per_token, (int, float)) or not flops_per_token > 0:
        raise ValueError(f"flops_per_token={flops_per_token!r}: expected a number > 0")
    return float(flops_per_token)


def peak_flops_of(peak_flops: Optional[float] = None,
                  hardware: Union[None, str, Hardware, dict] = None) -> Tuple[Optional[float], Optional[str]]:
    """(peak FLOP/s per device, where it comes from) from a number or a hardware (module docstring).

    Raises:
        ValueError: both or a bad value given, an unknown preset (named).
    """
    if peak_flops is not None and hardware is not None:
        raise ValueError("peak_flops=, hardware=: give one")
    if hardware == CPU:
        measured = calibrate_cpu(processes=1, seconds=0.2)
        return measured.peak_flops, "cpu (calibrate_cpu: this machine, one process, float32 matmul)"
    if hardware is not None:
        hw = load_hardware(hardware)
        return hw.peak_flops, f"hardware preset {hw.name}"
    if peak_flops is None:
        return None, None
    if isinstance(peak_flops, bool) or not isinstance(peak_flops, (int, float)) or not peak_flops > 0:
        raise ValueError(f"peak_flops={peak_flops!r}: expected a number > 0 (FLOP/s per device)")
    return float(peak_flops), "peak_flops="


def model_flops_utilization(flops_per_token: float, tokens: float, seconds: float, devices: int,
                            peak_flops: float) -> float:
    """flops_per_token x tokens / (seconds x devices x peak_flops)."""
    return flops_per_token * tokens / (seconds * devices * peak_flops)

