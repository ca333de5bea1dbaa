"""Runtimes: one protocol (base.Runtime), one folder per execution mode."""
from mindspore_hyper.runtime.base import RUNTIMES, Runtime, get_runtime, register_runtime

__all__ = ["Runtime", "RUNTIMES", "get_runtime", "register_runtime"]
