"""mindspore_hyper: HyperParallel for MindSpore.

Declare parallelism once (a Layout over a named device matrix, or a YAML parallel config) and run
it as a CPU simulation of N devices, under msrun, or through MindSpore's native auto-parallel.

The context, layouts and strategies are imported with the package; `auto_parallelize` and the
checkpoint functions (which need MindSpore, ~3 s to import) on first use, so tools that only need
the communication library or the planner start without MindSpore.
"""
from typing import Any

from mindspore_hyper import context as _context
from mindspore_hyper.context import get_context, reset_context
from mindspore_hyper.mindspore_log import silence_nn_adam_deprecations
from mindspore_hyper.shard import Layout, Partial, Replicate, Shard
from mindspore_hyper.strategy import load_parallel_config, resolve_strategy

__version__ = "0.1.0"

silence_nn_adam_deprecations()  # MindSpore's nn.Adam logs a deprecation of a primitive nobody names

__all__ = [
    "set_context", "get_context", "reset_context", "auto_parallelize", "Layout", "Shard", "Replicate",
    "Partial", "load_parallel_config", "resolve_strategy", "save_checkpoint", "load_checkpoint", "clip_grad_norm",
    "dryrun_mock",
    "__version__",
]


def set_context(**flags: Any) -> None:
    """`mindspore_hyper.context.set_context` (flags, validation, precedence: see there); with
    `cpu_bfloat16="emulate"` it also installs the emulation's check of Cells called outside the
    package (`bfloat16_emulation.check_plain_cell`), which imports MindSpore.

    Args:
        **flags: flag names and values, e.g. ``mode="simulation", device_num=8``.

    Raises:
        ValueError: an unknown flag name or a value outside what the flag allows.
    """
    _context.set_context(**flags)
    if flags.get("cpu_bfloat16") == "emulate":
        from mindspore_hyper import bfloat16_emulation

        bfloat16_emulation.install()


# subpackages reachable as attributes of the package (`mh.checkpoint`), imported when first named
_SUBPACKAGES = ("checkpoint", "estimate", "launch", "pipeline", "mpmd", "moe", "offload", "multimodal", "migrate",
                "comm", "schedule", "runtime", "dtensor", "strategy", "shard", "cli", "rlhf", "data", "train")


def __getattr__(name: str):
    """The MindSpore-backed part of the public API, imported when first named."""
    if name == "auto_parallelize":
        from mindspore_hyper.parallelize import auto_parallelize as value
    elif name == "save_checkpoint":
        from mindspore_hyper.checkpoint import save_checkpoint as value
    elif name == "load_checkpoint":
        from mindspore_hyper.checkpoint import load_checkpoint as value
    elif name == "clip_grad_norm":
        from mindspore_hyper.runtime.grad_clip import clip_grad_norm as value
    elif name == "dryrun_mock":
        from mindspore_hyper.runtime.dryrun.mock import dryrun_mock as value
    elif name in _SUBPACKAGES:  # `mh.checkpoint.newest_step(...)` without importing the subpackage first
        import importlib

        value = importlib.import_module(f"mindspore_hyper.{name}")
    else:
        raise AttributeError(f"module 'mindspore_hyper' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
