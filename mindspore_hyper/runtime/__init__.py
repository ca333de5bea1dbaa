"""Execution runtimes: simulation (one process), distributed (msrun), native (MindSpore auto-parallel)."""
from mindspore_hyper.runtime.base import OpByOpRuntime, Runtime

__all__ = ["Runtime", "OpByOpRuntime"]
