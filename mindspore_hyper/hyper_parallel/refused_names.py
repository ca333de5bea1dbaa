"""Upstream names that import here but refuse at use, each with the reason.

Some upstream modules are imported at the top of files that many scripts load (MindFormers
imports its Muon optimizer's and its activation-checkpoint helpers' names with every model),
while the names themselves are used only by features a script may not turn on. Such a name
imports, so the script gets as far as it can; using it (calling, instantiating, reading an
attribute, subclassing and then calling) raises `NotProvidedError` naming it and why. Names
whose absence upstream's callers expect (`custom_ops`, caught with `except ImportError`) are
refused at the import instead (`install.NOT_PROVIDED`).
"""
from __future__ import annotations

from typing import Callable, Dict

__all__ = ["NotProvidedError", "REFUSED", "refused_value"]


class NotProvidedError(NotImplementedError):
    """An upstream name this package imports but cannot run (the message says why)."""


_REASONS: Dict[str, str] = {
    "DFunction": "upstream's custom autograd Function over DTensor local tensors (MindFormers' MC2 fused "
                 "matmul-collective layers, Ascend-only kernels) is not provided; leave enable_mc2 off",
    "RedistributionOperatorInfer": "upstream's layout-to-operator inference (MindFormers' Muon optimizer) is "
                                   "not provided; use AdamW, or redistribute DTensors with .redistribute()",
    "_infer_slice_area_by_rank": "reads upstream's Layout internals (rank_list, tensor_map), which this "
                                 "package's layouts do not expose; use DTensor.to_local() / placements",
    "get_global_layout": "upstream's per-parameter layout dump for MindFormers' checkpoint format is not "
                         "provided; save with hyper_parallel.core.distributed_checkpoint.save",
    "CheckpointPolicy": "upstream's selective activation recompute/swap is not provided; turn recompute and "
                        "swap off (mindspore_hyper recomputes in its pipeline stages on its own)",
    "checkpoint_wrapper": "upstream's activation recompute wrapper is not provided; turn recompute off",
    "swap_wrapper": "upstream's activation swap to host is not provided; turn swap off",
    "SwapManager": "upstream's activation swap to host is not provided; turn swap off",
}


class _RefusedMeta(type):
    """Class-level attribute reads and calls of a refused class raise (module docstring)."""

    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise NotProvidedError(f"hyper_parallel {cls._refused_name}.{attr}: {_REASONS[cls._refused_name]}")

    def __call__(cls, *args, **kwargs):
        raise NotProvidedError(f"hyper_parallel {cls._refused_name}: {_REASONS[cls._refused_name]}")


def _refused_class(name: str) -> type:
    return _RefusedMeta(name, (), {"_refused_name": name, "__doc__": f"Refused at use: {_REASONS[name]}"})


def _refused_function(name: str) -> Callable:
    def refused(*args, **kwargs):
        raise NotProvidedError(f"hyper_parallel {name}: {_REASONS[name]}")

    refused.__name__ = refused.__qualname__ = name
    refused.__doc__ = f"Refused at use: {_REASONS[name]}"
    return refused


_FUNCTIONS = ("_infer_slice_area_by_rank", "get_global_layout", "checkpoint_wrapper", "swap_wrapper")
REFUSED = tuple(_REASONS)


def refused_value(name: str):
    """The importable stand-in for upstream's `name`: a function or class that raises at use.

    Raises:
        KeyError: `name` is not one of `REFUSED`.
    """
    if name not in _REASONS:
        raise KeyError(f"{name!r} is not a refused upstream name; expected one of {REFUSED}")
    return _refused_function(name) if name in _FUNCTIONS else _refused_class(name)
