"""`dryrun_mock`: a stand-in for a value a script reads, in the dry run only (which has none)."""
from __future__ import annotations

from typing import Any, Callable, Union

from mindspore_hyper.context import get_context

__all__ = ["dryrun_mock"]


def dryrun_mock(stand_in: Any, read: Union[Callable[[], Any], Any]) -> Any:
    """`stand_in` in the dry-run mode, else the real value: `read()` if it is callable (pass a
    callable for reads of tensor values, e.g. `lambda: loss.item()`, which the dry run refuses),
    else `read` itself. The same idea as MindSpore's `mindspore.utils.dryrun.mock`.

    Args:
        stand_in: what the script gets in a dry run.
        read: the real value, or a function returning it.

    Returns:
        The stand-in or the real value.
    """
    if get_context("mode") == "dryrun":
        return stand_in
    return read() if callable(read) else read
