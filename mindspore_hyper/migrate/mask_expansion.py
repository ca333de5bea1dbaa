"""transformers' attention masks built with torch.vmap, built by broadcasting instead while exporting.

transformers' mask builders (`masking_utils.sdpa_mask`) evaluate a mask function of the indices
(batch, head, query, key) either by broadcasting index tensors (its default) or, when a model passes its
own `and_mask_function`/`or_mask_function` (T5Gemma 2's bidirectional sliding window), through four
nested `torch.vmap`s, because transformers cannot know that a custom function is index-based.
torch.export cannot trace those vmaps ("Either your tensor may have escaped from inside a function being
vmapped"). For a function of the indices made of element-wise ops the two evaluations are the same
tensor, so while exporting the vmapped one is replaced by the broadcast one.

That it is index-based is checked, not assumed: the model runs once beforehand and every vmapped mask it
builds is compared with the broadcast evaluation of the same function on the same indices (equal element
for element, or no replacement). An element-wise function of index tensors computes the same at every
size, so the check at the example shapes covers the others.

Most models build no vmapped mask (transformers broadcasts its own mask functions), so that run is only
made for those that do: the export runs first with the vmapped expansion stopping it at its first call
(`export_with_broadcast_masks`); a model whose export completes without one is exported in that one run.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Dict, Iterator, List, Sequence, Tuple, TypeVar

import torch

from mindspore_hyper.migrate.lowering import preserved_buffers

__all__ = ["broadcast_masks", "check_broadcast_masks", "export_with_broadcast_masks"]

Exported = TypeVar("Exported")


def _masking_utils() -> Any:
    """transformers.masking_utils when it is loaded (a model that builds its masks has imported it; no run and no
    import for the others) and has both expansions, else None."""
    masking_utils = sys.modules.get("transformers.masking_utils")
    if masking_utils is None:
        return None
    if not all(hasattr(masking_utils, n) for n in ("_vmap_expansion_sdpa", "_non_vmap_expansion_sdpa")):
        return None
    return masking_utils


def _broadcast_expansion(masking_utils: Any) -> Callable[[Callable], Callable]:
    """A stand-in for `_vmap_expansion_sdpa`: the mask function on broadcast index tensors, expanded to
    (batch, heads, queries, keys) as the vmapped evaluation returns it."""
    def expansion(mask_function: Callable) -> Callable:
        def evaluate(batch: torch.Tensor, head: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            mask = mask_function(*masking_utils._non_vmap_expansion_sdpa(batch, head, q, kv))
            return mask.expand(batch.shape[0], head.shape[0], q.shape[0], kv.shape[0])
        return evaluate
    return expansion


def check_broadcast_masks(module: torch.nn.Module, args: Sequence[Any], kwargs: Dict[str, Any]) -> Tuple[bool, List[str]]:
    """Run `module` once and compare every vmapped mask transformers builds with its broadcast evaluation.

    Returns:
        (replace, notes): whether the replacement is exact for every such mask (False also when the model builds
        none), and a note saying what was found.
    """
    masking_utils = _masking_utils()
    if masking_utils is None:
        return False, []
    original = masking_utils._vmap_expansion_sdpa
    broadcast = _broadcast_expansion(masking_utils)
    found: List[str] = []

    def checked(mask_function: Callable) -> Callable:
        vmapped = original(mask_function)

        def evaluate(*indices: torch.Tensor) -> torch.Tensor:
            want = vmapped(*indices)
            try:
                got = broadcast(mask_function)(*indices)
                same = got.shape == want.shape and got.dtype == want.dtype and bool(torch.equal(got, want))
            except Exception as exc:  # noqa: BLE001 - a function that is not index-based: kept vmapped
                same, got = False, exc
            found.append("equal" if same else f"differs ({type(got).__name__})")
            return want
        return evaluate

    masking_utils._vmap_expansion_sdpa = checked
    try:
        with torch.no_grad(), preserved_buffers(module), torch.random.fork_rng(devices=[]):  # RNG state kept too
            module(*args, **kwargs)
    finally:
        masking_utils._vmap_expansion_sdpa = original
    if not found:
        return False, []
    if all(f == "equal" for f in found):
        return True, [f"{len(found)} attention mask(s) that transformers builds with torch.vmap (a custom mask "
                      "function) built by broadcasting the same function over the indices (checked equal on the "
                      "example inputs), as torch.export cannot trace vmap"]
    return False, [f"an attention mask that transformers builds with torch.vmap is not index-based "
                   f"({[f for f in found if f != 'equal'][0]} when broadcast): left vmapped"]


@contextlib.contextmanager
def broadcast_masks(enabled: bool) -> Iterator[None]:
    """Inside (when `enabled`): transformers' vmapped mask expansion replaced by the broadcast one."""
    masking_utils = _masking_utils() if enabled else None
    if masking_utils is None:
        yield
        return
    original = masking_utils._vmap_expansion_sdpa
    masking_utils._vmap_expansion_sdpa = _broadcast_expansion(masking_utils)
    try:
        yield
    finally:
        masking_utils._vmap_expansion_sdpa = original


class _VmappedMaskFound(Exception):
    """The probe export reached a mask that transformers builds with torch.vmap."""


def export_with_broadcast_masks(export: Callable[[bool], Exported], module: torch.nn.Module, args: Sequence[Any],
                                kwargs: Dict[str, Any]) -> Tuple[Exported, bool, List[str]]:
    """`export(broadcast)` (an export of `module` inside `broadcast_masks(broadcast)`) with transformers' vmapped
    masks built by broadcasting where that is exact.

    The first export stops at the first vmapped mask expansion. When it completes without one (the model builds
    none), it is the result and the model never runs eagerly here; else `check_broadcast_masks` runs the model
    once and the export is made again with its decision.

    Args:
        export: makes the export; called with whether the vmapped masks are broadcast.
        module, args, kwargs: the model and its example inputs (for the check run).

    Returns:
        (export's result, whether the vmapped masks were broadcast, the check's notes).

    Raises:
        Exception: what `export` raises (the first export's error only where no vmapped mask was reached).
    """
    masking_utils = _masking_utils()
    if masking_utils is None:
        return export(False), False, []
    original = masking_utils._vmap_expansion_sdpa
    reached: List[bool] = []

    def stop(mask_function: Callable) -> Callable:
        reached.append(True)
        raise _VmappedMaskFound("a vmapped attention mask")

    masking_utils._vmap_expansion_sdpa = stop
    try:
        exported = export(False)
    except Exception:  # noqa: BLE001 - the stop, however torch.export wraps it, or what the model made of it
        if not reached:
            raise
    finally:
        masking_utils._vmap_expansion_sdpa = original
    if not reached:
        return exported, False, []
    # stopped, or the model caught the stop itself (then its export is not the model's computation): check
    broadcast, notes = check_broadcast_masks(module, args, kwargs)
    return export(broadcast), broadcast, notes
