"""A job described in YAML (`model:`, `strategy:`, `device_memory:`) for the estimator and the CLI.

    model:
      preset: llama2-7b        # optional: start from a preset, the keys below override it
      micro_batch: 2
      seq_len: 32768
    strategy:
      data: 8
      tensor: 4
      zero_stage: 1
      recompute: selective
    device_memory: 64GiB       # optional (64GB: decimal, 10^9 bytes)
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple, Union

from mindspore_hyper.context import parse_bytes
from mindspore_hyper.estimate.transformer_config import TransformerConfig, preset
from mindspore_hyper.estimate.strategy import JobStrategy

__all__ = ["read_job_file", "build_config", "build_strategy", "build_job"]

TOP_KEYS = ("model", "strategy", "device_memory")


def read_job_file(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """Read and check the layout of a job file.

    Returns:
        {"model": mapping, "strategy": mapping, "device_memory": bytes or None}.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not YAML, not a mapping, an unknown top-level key, a section that is not a
            mapping, or a bad device_memory (the message names the file and the key).
    """
    import yaml

    with open(path, "r", encoding="utf-8") as f:
        try:
            raw = yaml.safe_load(f)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping with keys {', '.join(TOP_KEYS)}")
    unknown = [k for k in raw if k not in TOP_KEYS]
    if unknown:
        raise ValueError(f"{path}: {unknown[0]}: unknown key; expected one of {', '.join(TOP_KEYS)}")
    out: Dict[str, Any] = {}
    for section in ("model", "strategy"):
        value = raw.get(section) or {}
        if not isinstance(value, dict):
            raise ValueError(f"{path}: {section}: expected a mapping, got {type(value).__name__}")
        out[section] = dict(value)
    memory = raw.get("device_memory")
    out["device_memory"] = None if memory is None else parse_bytes(memory, f"{path}: device_memory")
    return out


def build_config(values: Dict[str, Any], where: str = "model") -> TransformerConfig:
    """A TransformerConfig from a mapping; a `preset` key starts from that preset.

    Raises:
        ValueError: unknown preset or key, or a bad value (named with `where`).
    """
    values = dict(values)
    name: Optional[str] = values.pop("preset", None)
    if name is None:
        try:
            return TransformerConfig.from_dict(values, where)
        except TypeError as exc:  # a required field is missing
            raise ValueError(f"{where}: {exc}; give layers, hidden, heads, vocab and seq_len, or a preset") from None
    return TransformerConfig.from_dict({**preset(name).to_dict(), **values}, where)


def build_strategy(values: Dict[str, Any], where: str = "strategy") -> JobStrategy:
    """A JobStrategy from a mapping (unknown keys are an error naming `where`)."""
    return JobStrategy.from_dict(values, where)


def build_job(spec: Dict[str, Any]) -> Tuple[TransformerConfig, JobStrategy]:
    """(config, strategy) of a `read_job_file` result."""
    return build_config(spec["model"]), build_strategy(spec["strategy"])
