"""Mixed precision with the package: MindSpore's own amp on the unmodified model, in every mode.

The package has no precision option of its own: a model made mixed precision by MindSpore
(`mindspore.amp.auto_mixed_precision(net, "O1" | "O2" | "O3", dtype=...)`,
`amp.custom_mixed_precision`, `Cell.to_float`) keeps float32 Parameters (the master weights, what
the optimizer updates and the checkpoint saves) and casts them and the activations to the compute
dtype inside the forward. Those casts are ordinary ops: the simulation and msrun run them per
shard like every other op, so a parallel run computes what one device computes, and gradients
come back float32 through the casts' backward. Loss scaling is MindSpore's too
(`amp.StaticLossScaler` / `DynamicLossScaler` around the parallel model's forward: the loss and
the gradients are global tensors). See docs/training.md, "Mixed precision". MindSpore's CPU
kernels lack bfloat16 for most ops: the flag `cpu_bfloat16="emulate"` runs those on float32 copies
(`mindspore_hyper/bfloat16_emulation.py`).

This module reads what MindSpore set, for the memory report (`working_weight_bytes`) and for the
native translation (`compute_dtypes`).
"""
from __future__ import annotations

from typing import Dict, Optional

from mindspore import nn

__all__ = ["compute_dtypes", "working_weight_bytes", "memory_by_dtype", "dtype_name"]

# MindSpore's MixedPrecisionType names -> the dtype a Cell's float inputs and parameters are cast to
_FLAG_DTYPES = {"FP16": "float16", "BF16": "bfloat16", "FP32": "float32"}
_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


def dtype_name(dtype) -> str:
    """A dtype's lower-case name ("float32", "bfloat16"), from a MindSpore dtype or its name."""
    return str(dtype).lower()


def compute_dtypes(network: nn.Cell) -> Dict[str, str]:
    """Parameter path (as `parameters_and_names` and the StrategyTable name it) -> the dtype
    MindSpore's mixed precision casts it to in the forward, for the
    parameters of Cells that carry a mixed-precision type (amp levels O2 and O3, `to_float`): the
    type of the nearest such Cell on the way from the model to the Cell that owns the parameter.
    Parameters used in their own dtype are left out. O1 and `custom_mixed_precision` rewrite the
    model's code with explicit casts and set no type: their casts are not seen here.

    Args:
        network: the model (before or after `auto_parallelize` wrapped it).

    Returns:
        A dict, empty for a model without mixed-precision types.
    """
    out: Dict[str, str] = {}
    # the names `parameters_and_names` gives (a pipeline's stage Cell names its parameters as the
    # whole model does, not by its own Cell tree's paths)
    names = {id(param): name for name, param in network.parameters_and_names()}

    def visit(cell: nn.Cell, path: str, inherited: Optional[str]) -> None:
        flag = getattr(cell, "mixed_precision_type", None)
        here = _FLAG_DTYPES.get(getattr(flag, "name", ""), inherited) if flag is not None else inherited
        for key, param in cell._params.items():
            if param is not None and here is not None and dtype_name(param.dtype) != here:
                out.setdefault(names.get(id(param), f"{path}.{key}" if path else key), here)
        for key, child in cell._cells.items():
            if child is not None:
                visit(child, f"{path}.{key}" if path else key, here)

    visit(network, "", None)
    return out


def working_weight_bytes(network: nn.Cell, table, ranks) -> Dict[int, Dict[str, int]]:
    """rank -> {compute dtype: bytes} of the parameters' working copies: each parameter cast by
    `compute_dtypes` holds its shard once more in the compute dtype while the step runs (they are
    forward tensors, so the activation peak includes them too).

    Args:
        network: the model.
        table: its StrategyTable (per-parameter shard bytes and devices).
        ranks: the ranks to report.
    """
    dtypes = compute_dtypes(network)
    out = {rank: {} for rank in ranks}
    for row in table:
        target = dtypes.get(row.name)
        if target is None:
            continue
        nbytes = row.param_bytes * _ITEMSIZE[target] // _ITEMSIZE.get(dtype_name(row.dtype), 4)
        for rank in ranks:
            if rank in row.devices:
                out[rank][target] = out[rank].get(target, 0) + nbytes
    return out


def memory_by_dtype(table, ranks, optimizer_by_dtype: Optional[Dict[int, Dict[str, int]]],
                    network: nn.Cell) -> Dict[int, Dict[str, Dict[str, int]]]:
    """rank -> kind -> dtype -> bytes: "parameters" (the master copy, in the Parameters' dtype),
    "gradients" (the parameters' dtype: MindSpore's cast backward returns them so),
    "optimizer_states" (the optimizer's state Parameters by their dtype; without an optimizer
    `optimizer_states` per parameter in its dtype) and "working_weights" (`working_weight_bytes`).

    Args:
        table: the StrategyTable.
        ranks: the ranks to report.
        optimizer_by_dtype: rank -> dtype -> bytes of the optimizer's states, or None.
        network: the model.
    """
    out = {rank: {"parameters": {}, "gradients": {}, "optimizer_states": {}} for rank in ranks}
    for row in table:
        name = dtype_name(row.dtype)
        for rank in ranks:
            if rank not in row.devices:
                continue
            for kind, nbytes in (("parameters", row.param_bytes), ("gradients", row.param_bytes),
                                 ("optimizer_states", row.optimizer_bytes)):
                if kind == "optimizer_states" and optimizer_by_dtype is not None:
                    continue
                out[rank][kind][name] = out[rank][kind].get(name, 0) + nbytes
    if optimizer_by_dtype is not None:
        for rank in ranks:
            out[rank]["optimizer_states"] = {k: v for k, v in optimizer_by_dtype[rank].items() if v}
    working = working_weight_bytes(network, table, ranks)
    for rank in ranks:
        out[rank]["working_weights"] = working[rank]
    return out
