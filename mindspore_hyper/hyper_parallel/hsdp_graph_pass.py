"""Upstream's hsdp graph-pass scheduler (`hyper_parallel.platform.mindspore.hsdp.scheduler`): absent here.

Under `ms.jit` upstream's `hsdp(use_eager_hook=False)` registers its parameter hooks through a
MindSpore graph-pass plugin (a shared library in its wheel), and its tests ask
`MindSporeHSDPScheduler.get_pass_library_pass()` whether that library exists, skipping the graph
cases when it does not. This package runs hsdp's hooks eagerly only and ships no such library, so
the answer is None; building the scheduler itself is refused.
"""
from __future__ import annotations

from mindspore_hyper.hyper_parallel.refused_names import NotProvidedError

__all__ = ["MindSporeHSDPScheduler"]


class MindSporeHSDPScheduler:
    """Upstream's graph-mode hsdp scheduler: only its plugin query answers (None: no plugin)."""

    def __init__(self, *args, **kwargs):
        raise NotProvidedError("hyper_parallel MindSporeHSDPScheduler: upstream's graph-mode hsdp scheduler "
                               "(hooks compiled into ms.jit graphs by its MindSpore plugin) is not provided; "
                               "hsdp here runs its hooks eagerly: hsdp(..., use_eager_hook=True) and "
                               "parallelize_value_and_grad")

    @staticmethod
    def get_pass_library_pass() -> None:
        """The path of upstream's MindSpore graph-pass library: None, none is shipped here."""
        return None
