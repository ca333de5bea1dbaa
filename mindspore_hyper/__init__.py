"""mindspore_hyper: HyperParallel for MindSpore.

Declare parallelism once (a Layout over a named device matrix, or a YAML parallel config) and run
it as a CPU simulation of N devices, under msrun, or through MindSpore's native auto-parallel.
"""
from mindspore_hyper.checkpoint import load_checkpoint, save_checkpoint
from mindspore_hyper.context import get_context, reset_context, set_context
from mindspore_hyper.parallelize import auto_parallelize
from mindspore_hyper.shard import Layout, Partial, Replicate, Shard
from mindspore_hyper.strategy import load_parallel_config, resolve_strategy

__version__ = "0.1.0"

__all__ = [
    "set_context", "get_context", "reset_context", "auto_parallelize", "Layout", "Shard", "Replicate",
    "Partial", "load_parallel_config", "resolve_strategy", "save_checkpoint", "load_checkpoint", "__version__",
]
