"""torch state_dict -> MindSpore Cell parameters, for converted and hand-written Cells alike.

Name rules (tried after the exact name, for the last component of each torch name):
  weight -> gamma (LayerNorm/BatchNorm/GroupNorm) or embedding_table (Embedding)
  bias -> beta; running_mean -> moving_mean; running_var -> moving_variance
  num_batches_tracked -> dropped (MindSpore's BatchNorm has no counter)
Layout rules: Linear (out, in) and Conv2d (out, in, kh, kw) weights copy unchanged; a tensor that
differs from the Cell's parameter only by size-1 dimensions (Conv1d (out, in, k) -> MindSpore's
(out, in, 1, k)) is reshaped. Anything else (a transposed Linear weight, say) is a mismatch: a
guessed transpose would be silently wrong for square weights.
Hyper-parameters (when the torch module is given): BatchNorm momentum (torch m weighs the new
batch statistic; MindSpore's Cell stores the same m, its constructor takes 1 - m) and eps,
LayerNorm/GroupNorm epsilon (MindSpore's nn.LayerNorm defaults to 1e-7, torch to 1e-5) are
compared with the Cell's and, unless told otherwise, set on it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mindspore_hyper.migrate.errors import StateDictMismatchError

__all__ = ["NAME_RULES", "DROPPED", "Placement", "HyperParameter", "StateDictReport", "convert_state_dict",
           "cell_parameters", "match_requires_grad"]

NAME_RULES: Dict[str, Tuple[str, ...]] = {
    "weight": ("gamma", "embedding_table"),
    "bias": ("beta",),
    "running_mean": ("moving_mean",),
    "running_var": ("moving_variance",),
}
DROPPED = ("num_batches_tracked",)


@dataclass(frozen=True)
class Placement:
    """Where one torch entry went: Cell parameter name and the layout change applied ("" = none)."""

    torch_name: str
    cell_name: str
    transform: str = ""


@dataclass(frozen=True)
class HyperParameter:
    """A torch/MindSpore hyper-parameter difference found on one layer."""

    path: str
    name: str
    torch_value: float
    cell_value: float
    applied: bool

    def __str__(self) -> str:
        action = "set on the Cell" if self.applied else "NOT applied"
        return f"{self.path}: {self.name} torch={self.torch_value!r} cell={self.cell_value!r} ({action})"


@dataclass
class StateDictReport:
    """What convert_state_dict did."""

    placed: List[Placement] = field(default_factory=list)
    dropped: List[str] = field(default_factory=list)
    hyperparameters: List[HyperParameter] = field(default_factory=list)
    frozen: List[str] = field(default_factory=list)  # Cell parameters made non-trainable as in torch

    def to_dict(self) -> dict:
        return {"placed": [vars(p) for p in self.placed], "dropped": list(self.dropped),
                "hyperparameters": [vars(h) for h in self.hyperparameters], "frozen": list(self.frozen)}

    def __str__(self) -> str:
        lines = [f"{len(self.placed)} tensors placed, {len(self.dropped)} dropped"]
        lines += [f"  {p.torch_name} -> {p.cell_name}" + (f" ({p.transform})" if p.transform else "")
                  for p in self.placed if p.torch_name != p.cell_name or p.transform]
        lines += [f"  dropped {d}" for d in self.dropped]
        lines += [f"  {h}" for h in self.hyperparameters]
        return "\n".join(lines)


def cell_parameters(cell: nn.Cell) -> Dict[str, Parameter]:
    """Every attribute path of every Parameter in `cell` (tied parameters appear under each path)."""
    found = {}
    for prefix, sub in cell.cells_and_names():
        for name, p in sub._params.items():  # pylint: disable=protected-access
            if p is not None:
                found[f"{prefix}.{name}" if prefix else name] = p
    return found


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # torch.Tensor (bfloat16 has no NumPy dtype: go through float32)
        import torch

        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            value = value.float()
        return value.numpy()
    return np.asarray(value)


def _fit(array: np.ndarray, shape: Tuple[int, ...]) -> Optional[Tuple[np.ndarray, str]]:
    """`array` in `shape` by the layout rules, with the change made, or None."""
    if array.shape == shape:
        return array, ""
    if [d for d in array.shape if d != 1] == [d for d in shape if d != 1]:
        return array.reshape(shape), f"reshape {array.shape} -> {shape}"
    return None


def _candidates(torch_name: str) -> List[str]:
    prefix, _, leaf = torch_name.rpartition(".")
    names = [leaf] + list(NAME_RULES.get(leaf, ()))
    return [f"{prefix}.{n}" if prefix else n for n in names]


def _hyperparameters(torch_module, cell: nn.Cell, apply: bool) -> List[HyperParameter]:
    import torch

    torch_batch_norms = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)
    cells = dict(cell.cells_and_names())
    found = []
    for path, m in torch_module.named_modules():
        target = cells.get(path)
        if target is None:
            continue
        if isinstance(m, torch_batch_norms) and isinstance(target, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
            if m.momentum is not None and not np.isclose(target.momentum, m.momentum):
                found.append(HyperParameter(path, "momentum (weight of the new batch statistic)", m.momentum,
                                            float(target.momentum), apply))
                if apply:
                    target.momentum = m.momentum
            if not np.isclose(target.eps, m.eps, rtol=0, atol=1e-12):
                found.append(HyperParameter(path, "eps", m.eps, float(target.eps), apply))
                if apply:
                    target.eps = m.eps
            if apply:
                target.bn_train = ops.BatchNorm(is_training=True, epsilon=target.eps, momentum=target.momentum,
                                                data_format=target.format)
                target.bn_infer = ops.BatchNorm(is_training=False, epsilon=target.eps, data_format=target.format)
        elif isinstance(m, torch.nn.LayerNorm) and isinstance(target, nn.LayerNorm):
            if not np.isclose(target.epsilon, m.eps, rtol=0, atol=1e-12):
                found.append(HyperParameter(path, "epsilon", m.eps, float(target.epsilon), apply))
                if apply:
                    target.epsilon = m.eps
                    target.layer_norm = ops.LayerNorm(begin_norm_axis=target.begin_norm_axis,
                                                      begin_params_axis=target.begin_params_axis, epsilon=m.eps)
        elif isinstance(m, torch.nn.GroupNorm) and isinstance(target, nn.GroupNorm):
            if not np.isclose(target.eps, m.eps, rtol=0, atol=1e-12):
                found.append(HyperParameter(path, "eps", m.eps, float(target.eps), apply))
                if apply:
                    target.eps = m.eps
    return found


def convert_state_dict(state_dict: Union[Mapping[str, Any], Any], cell: nn.Cell, *, apply_hyperparameters: bool = True,
                       ignore_missing: Iterable[str] = ()) -> StateDictReport:
    """Load a torch state_dict into a MindSpore Cell by the name, layout and hyper-parameter rules above.

    Args:
        state_dict: a torch state_dict (name -> tensor), or the torch nn.Module itself (then its
            BatchNorm/LayerNorm/GroupNorm hyper-parameters are compared with the Cell's layers at the same path).
        cell: the MindSpore Cell (converted or hand-written).
        apply_hyperparameters: set differing hyper-parameters on the Cell (else only report them).
        ignore_missing: Cell parameter names that need no torch entry (filled elsewhere).

    Returns:
        The StateDictReport (placements, dropped entries, hyper-parameter differences).

    Raises:
        StateDictMismatchError: naming every torch entry with no Cell parameter, every shape
            mismatch and every Cell parameter left unfilled; nothing is loaded then.
        TypeError: `state_dict` is neither a mapping nor a torch module.
    """
    torch_module = None
    if hasattr(state_dict, "state_dict") and hasattr(state_dict, "named_modules"):
        torch_module, state_dict = state_dict, state_dict.state_dict()
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict: expected a mapping of names to tensors or a torch nn.Module, got "
                        f"{type(state_dict).__name__}")
    params = cell_parameters(cell)
    report = StateDictReport()
    unplaced, mismatched, values = [], [], {}
    filled = set()
    for torch_name, value in state_dict.items():
        if torch_name.rpartition(".")[2] in DROPPED:
            report.dropped.append(torch_name)
            continue
        tried = _candidates(torch_name)
        present = [n for n in tried if n in params]
        if not present:
            unplaced.append(f"{torch_name} (tried {', '.join(tried)})")
            continue
        if len(present) > 1 and tried[0] not in params:
            unplaced.append(f"{torch_name}: ambiguous, the Cell has {', '.join(present)}")
            continue
        name = present[0]
        array = _numpy(value)
        target = params[name]
        fitted = _fit(array, tuple(target.shape))
        if fitted is None:
            hint = " (transposed it would fit: the Cell keeps this weight in another layout)" if (
                array.ndim == 2 and array.T.shape == tuple(target.shape)) else ""
            mismatched.append(f"{torch_name} {tuple(array.shape)} -> {name} {tuple(target.shape)}{hint}")
            continue
        values[name] = (target, fitted[0])
        filled.add(id(target))
        report.placed.append(Placement(torch_name, name, fitted[1]))
    skipped = {id(params[n]) for n in ignore_missing if n in params}
    missing = sorted({n for n, p in params.items() if id(p) not in filled and id(p) not in skipped})
    if unplaced or mismatched or missing:
        raise StateDictMismatchError(unplaced, mismatched, missing)
    for target, array in values.values():
        target.set_data(Tensor(array, dtype=target.dtype))
    if torch_module is not None:
        report.hyperparameters = _hyperparameters(torch_module, cell, apply_hyperparameters)
        report.frozen = match_requires_grad(torch_module, cell, report.placed)
    return report


def match_requires_grad(torch_module, cell: nn.Cell, placed: Iterable[Placement]) -> List[str]:
    """Cell parameters filled from torch parameters with requires_grad=False are frozen too (a MindSpore
    layer's table is trainable by default: Whisper's sinusoidal position embedding would train); returns
    their names."""
    frozen = {n for n, p in torch_module.named_parameters(remove_duplicate=False) if not p.requires_grad}
    params = cell_parameters(cell)
    done = []
    for p in placed:
        if p.torch_name in frozen and p.cell_name in params and params[p.cell_name].requires_grad:
            params[p.cell_name].requires_grad = False
            done.append(p.cell_name)
    return done
