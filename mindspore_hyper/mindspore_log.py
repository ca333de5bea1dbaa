"""The MindSpore log messages the package keeps off the console: exact texts that name nothing the
user (or the package) did and nothing anyone can change, each listed with the reason.

MindSpore 2.10 logs through one Python logger per process, `ME.mindspore.log.<pid>`
(mindspore/log.py, configured when MindSpore first logs; its set-up clears the handlers, not the
filters). A `logging.Filter` on that logger drops a record whose message equals a listed text, and
nothing else. The filter is added by name, so the package's import stays free of MindSpore, and
again in a forked child (its pid names another logger).
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterable, Iterator, Tuple

__all__ = ["NN_ADAM_DEPRECATIONS", "CPU_SYNCHRONIZE_ERROR", "ExactMessageFilter", "mindspore_logger",
           "silence_nn_adam_deprecations", "silenced"]

# Logged (once per process, at WARNING) by `nn.Adam.__init__`, which builds the primitive of its
# sparse-gradient update (`FusedSparseAdam`, or `FusedSparseLazyAdam` with use_lazy=True) whatever
# the gradients: every `nn.Adam(...)` prints it, though nothing the user writes names the
# deprecated primitive and nn.Adam itself is not deprecated.
NN_ADAM_DEPRECATIONS: Tuple[str, ...] = (
    "'FusedSparseAdam' is deprecated from version 2.8.0 and will be removed in a future version.",
    "'FusedSparseLazyAdam' is deprecated from version 2.8.0 and will be removed in a future version.",
)

# Logged (once per process, at ERROR) by the first `mindspore.runtime.synchronize()` on CPU, which
# then returns without waiting; every later call waits for the launched kernels. Silenced only
# around the package's own calls (`pipeline/runner.py`), which make that first call twice.
CPU_SYNCHRONIZE_ERROR = "CPU device is not supported. Please use correct device"


class ExactMessageFilter(logging.Filter):
    """Drops the records whose formatted message equals one of `messages`; passes every other."""

    def __init__(self, messages: Iterable[str]):
        super().__init__()
        self.messages = frozenset(messages)

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in self.messages


_NN_ADAM_FILTER = ExactMessageFilter(NN_ADAM_DEPRECATIONS)


def mindspore_logger() -> logging.Logger:
    """This process's MindSpore logger (the one mindspore/log.py creates, by its name)."""
    return logging.getLogger(f"ME.mindspore.log.{os.getpid()}")


def _add_nn_adam_filter() -> None:
    logger = mindspore_logger()
    if _NN_ADAM_FILTER not in logger.filters:
        logger.addFilter(_NN_ADAM_FILTER)


def silence_nn_adam_deprecations() -> None:
    """Keep `NN_ADAM_DEPRECATIONS` off the console for this process and its forked children
    (called by the package's import; idempotent)."""
    global _FORK_HOOKED
    _add_nn_adam_filter()
    if not _FORK_HOOKED:
        os.register_at_fork(after_in_child=_add_nn_adam_filter)
        _FORK_HOOKED = True


_FORK_HOOKED = False


@contextlib.contextmanager
def silenced(*messages: str) -> Iterator[None]:
    """Drop MindSpore log records whose message equals one of `messages` inside the block only."""
    logger = mindspore_logger()
    message_filter = ExactMessageFilter(messages)
    logger.addFilter(message_filter)
    try:
        yield
    finally:
        logger.removeFilter(message_filter)
