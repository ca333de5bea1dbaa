"""Running a converted Cell beside its torch original: input conversion, flat outputs, relative error."""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Sequence

import numpy as np
import torch
import torch.utils._pytree as pytree
import mindspore as ms
from mindspore import Tensor, nn

from mindspore_hyper.migrate.lowering import preserved_buffers
from mindspore_hyper.migrate.mappings.common import DTYPES
from mindspore_hyper.migrate.state_dict import cell_parameters

__all__ = ["to_mindspore", "torch_outputs", "cell_outputs", "relative_error", "compare_outputs",
           "preserved_cell_state", "FLOAT32_TOLERANCE", "check_tolerance"]


def to_mindspore(value: Any) -> Any:
    """A torch tensor as a MindSpore Tensor of the same dtype (other values unchanged)."""
    if isinstance(value, torch.Tensor):
        import mindspore as ms

        dtype = eval(DTYPES[value.dtype], {"ms": ms})  # noqa: S307 - a fixed table of dtype names
        array = value.detach().cpu()
        return Tensor((array.float() if value.dtype == torch.bfloat16 else array).numpy(), dtype=dtype)
    return value


def torch_outputs(value: Any) -> List[np.ndarray]:
    """The tensor leaves of a torch output structure (ModelOutput, dict, tuple), as float64 arrays."""
    return [leaf.detach().double().numpy() for leaf in pytree.tree_flatten(value)[0] if isinstance(leaf, torch.Tensor)]


def cell_outputs(value: Any) -> List[np.ndarray]:
    """The Cell's outputs (one tensor or a tuple) as float64 arrays."""
    values = value if isinstance(value, (tuple, list)) else (value,)
    return [v.asnumpy().astype(np.float64) for v in values]


def relative_error(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> float:
    """max |got - want| / max |want| over all outputs (per output, then the worst).

    Raises:
        ValueError: different numbers or shapes of outputs.
    """
    if len(got) != len(want):
        raise ValueError(f"{len(got)} outputs against {len(want)} expected")
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape:
            raise ValueError(f"output {i}: shape {g.shape}, expected {w.shape}")
        scale = max(float(np.abs(w).max()) if w.size else 0.0, 1e-30)
        worst = max(worst, float(np.abs(g - w).max()) / scale if w.size else 0.0)
    return worst


def compare_outputs(torch_module: torch.nn.Module, cell: nn.Cell, torch_args: Sequence[Any],
                    torch_kwargs: Dict[str, Any], cell_inputs: Sequence[Any]) -> Dict[str, Any]:
    """Run both on the same inputs (model state restored afterwards on both sides) and compare.

    Returns:
        {"max_relative_error": float} or {"skipped": reason} when torch itself is not
        deterministic on these inputs (dropout in training mode).
    """
    with torch.no_grad(), preserved_buffers(torch_module):
        first = torch_outputs(torch_module(*torch_args, **torch_kwargs))
        second = torch_outputs(torch_module(*torch_args, **torch_kwargs))
    if relative_error(second, first) != 0.0:
        return {"skipped": "torch gives different outputs on two runs (dropout active in training mode)"}
    with preserved_cell_state(cell):
        got = cell_outputs(cell(*[to_mindspore(x) for x in cell_inputs]))
    return {"max_relative_error": relative_error(got, first)}


@contextlib.contextmanager
def preserved_cell_state(cell: nn.Cell) -> Iterator[None]:
    """Run the body, then put every non-trainable parameter of `cell` back (running statistics a forward
    updates), whatever the body raised."""
    state = {name: _snapshot(p) for name, p in cell_parameters(cell).items() if not p.requires_grad}
    try:
        yield
    finally:
        params = cell_parameters(cell)
        for name, value in state.items():
            params[name].set_data(value)


def _snapshot(param: ms.Parameter) -> Tensor:
    """A copy of a parameter's value, for restoring it after a forward that updates it (running statistics).
    bfloat16 goes through float32 (an exact round trip): MindSpore's CPU Identity, which `Parameter.value()` runs,
    has no bfloat16 kernel (RecurrentGemma's bfloat16 `normalizer` buffer)."""
    if param.dtype == ms.bfloat16:
        return param.astype(ms.float32).astype(ms.bfloat16)
    return param.value().copy()


# The forward check's tolerance (the CLI's exit status): 1e-5 relative per output for float32 (float32 rounding,
# eps 1.2e-7, over a few hundred accumulated ops); lower-precision weights get ten of their own eps (float16
# 1e-2, bfloat16 8e-2). Gradients (the same ops' backward, same depth and scales) and the other train/eval mode
# are checked against it too.
FLOAT32_TOLERANCE = 1e-5


def check_tolerance(torch_module) -> float:
    """The relative tolerance of the conversion's checks for `torch_module`'s weight dtypes."""
    eps = [torch.finfo(p.dtype).eps for p in torch_module.parameters() if p.dtype.is_floating_point]
    return max([FLOAT32_TOLERANCE] + [10 * e for e in eps if e > torch.finfo(torch.float32).eps])

