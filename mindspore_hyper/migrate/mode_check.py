"""The converted Cell in the train/eval mode torch was NOT traced in: checked, and refused when it differs.

torch.export traces the forward in the mode the torch module is in, so a Python branch on `self.training`
(`F(h) if self.training else h`, a router's jitter) is baked into the generated program; dropout modules
and BatchNorm follow `Cell.set_train`. After the forward check, `check_other_mode` runs both models in the
other mode on the example inputs (state restored on both sides). When they differ, `refuse_mode` puts a
guard at the top of the root class's `construct` (in the source that is written out, and in the Cell in
memory): the Cell raises instead of silently running the traced mode's branch.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Sequence, Tuple

import torch
from mindspore import nn

from mindspore_hyper.migrate.cell_builder import load_source
from mindspore_hyper.migrate.compare import (cell_outputs, check_tolerance, preserved_cell_state, relative_error,
                                             to_mindspore, torch_outputs)
from mindspore_hyper.migrate.errors import MigrationError
from mindspore_hyper.migrate.lowering import preserved_buffers

__all__ = ["mode_name", "check_other_mode", "refusal_message", "refuse_mode", "check_and_refuse"]

# The tolerance is the forward check's (compare.check_tolerance): a traced `self.training` branch changes
# outputs by far more than rounding (tanh against identity: O(1)).


def mode_name(training: bool) -> str:
    """"train" or "eval", as torch's `Module.train()` / `Module.eval()` name the modes."""
    return "train" if training else "eval"


def check_other_mode(torch_module: torch.nn.Module, cell: nn.Cell, torch_args: Sequence[Any],
                     torch_kwargs: Dict[str, Any], cell_inputs: Sequence[Any]) -> Dict[str, Any]:
    """Run torch and the Cell in the mode torch was not traced in, on the example inputs, and compare.

    Both models' modes (per torch submodule) and their buffers / running statistics are restored afterwards.

    Args:
        torch_module: the converted torch model, in the mode it was traced in.
        cell: its Cell, in the same mode.
        torch_args: positional inputs of torch's forward.
        torch_kwargs: keyword inputs of torch's forward.
        cell_inputs: the Cell's inputs (torch tensors), in its order.

    Returns:
        {"mode": "train"|"eval" (the other mode), "status": "equal"|"differs"|"not checked",
        "max_relative_error": float (when both ran and had the same output structure), "tolerance": float,
        "reason": str (for "differs" and "not checked")}.
    """
    other = not torch_module.training
    result: Dict[str, Any] = {"mode": mode_name(other), "tolerance": check_tolerance(torch_module)}
    with _torch_mode(torch_module, other), torch.no_grad(), preserved_buffers(torch_module):
        try:
            want = torch_outputs(torch_module(*torch_args, **torch_kwargs))
            again = torch_outputs(torch_module(*torch_args, **torch_kwargs)) if other else want
        except Exception as exc:  # a model may refuse a mode (e.g. labels needed in training): not ours to judge
            return dict(result, status="not checked", reason=f"torch raises in {mode_name(other)} mode: "
                        f"{type(exc).__name__}: {_first_line(exc)}")
    if relative_error(again, want) != 0.0:
        return dict(result, status="not checked", reason="torch gives different outputs on two runs in train "
                    "mode (dropout active)")
    with _cell_mode(cell, other), preserved_cell_state(cell):
        try:
            got = cell_outputs(cell(*[to_mindspore(x) for x in cell_inputs]))
        except Exception as exc:  # the traced branch cannot run this mode: refused like a wrong result
            return dict(result, status="differs", reason=f"the Cell raises in {mode_name(other)} mode: "
                        f"{type(exc).__name__}: {_first_line(exc)}")
    try:
        error = relative_error(got, want)
    except ValueError as exc:  # a different number or shape of outputs in that mode
        return dict(result, status="differs", reason=f"different outputs: {exc}")
    result["max_relative_error"] = error
    if error <= result["tolerance"]:
        return dict(result, status="equal")
    return dict(result, status="differs", reason=f"max relative error {error:.2g} against torch in "
                f"{mode_name(other)} mode (a branch on self.training was traced in {mode_name(not other)} mode)")


def refusal_message(class_name: str, mode: str) -> str:
    """What the Cell says when run in the `mode` ("train" or "eval") its conversion does not support."""
    traced = "eval" if mode == "train" else "train"
    fix = ("convert the torch model in eval mode for inference: torch_module.eval() before convert"
           if mode == "eval" else
           "convert the torch model in train mode for training: torch_module.train() before convert")
    return (f"{class_name} was converted from torch in {traced} mode and does not support {mode} mode "
            f"(set_train({mode == 'train'})): torch's forward differs between the modes in a way the traced program "
            f"does not follow (a branch on self.training); {fix}")


def refuse_mode(cell: nn.Cell, source: str, class_name: str, stem: str, mode: str) -> str:
    """The generated `source` with a guard at the top of `class_name`'s construct that raises when the Cell
    is in `mode`; `cell` (an instance of that class) becomes an instance of the guarded class, keeping its
    parameters. Returns the new source.

    Raises:
        MigrationError: the root class or its construct is not found in the source (a converter bug).
    """
    header = f"class {class_name}(nn.Cell):\n"
    start = source.find(header)
    construct = source.find("\n    def construct(self", start + 1) if start >= 0 else -1
    if construct < 0:
        raise MigrationError(f"cannot place the {mode}-mode refusal: no construct of class {class_name} in the "
                             "generated source")
    end = source.index("\n", construct + 1) + 1
    condition = "self.training" if mode == "train" else "not self.training"
    guard = (f"        if {condition}:  # the conversion's check found torch's {mode} mode differs\n"
             f"            raise RuntimeError({refusal_message(class_name, mode)!r})\n")
    guarded = source[:end] + guard + source[end:]
    try:
        module = load_source(guarded, stem)
    except Exception as exc:
        raise MigrationError(f"the {mode}-mode refusal of {class_name} does not compile: "
                             f"{type(exc).__name__}: {exc}") from exc
    cell.__class__ = module.__dict__[class_name]  # same __init__, attributes and parameters; construct guarded
    return guarded


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else ""


@contextlib.contextmanager
def _torch_mode(module: torch.nn.Module, training: bool) -> Iterator[None]:
    """`module` (every submodule) in `training` mode for the body, then each submodule's own mode back."""
    saved = [(m, m.training) for m in module.modules()]
    module.train(training)
    try:
        yield
    finally:
        for m, flag in saved:
            m.training = flag


@contextlib.contextmanager
def _cell_mode(cell: nn.Cell, training: bool) -> Iterator[None]:
    """`cell` (every sub-Cell) in `training` mode for the body, then each sub-Cell's own mode back."""
    saved = [(c, c.training) for _, c in cell.cells_and_names()]  # parents before their children
    cell.set_train(training)
    try:
        yield
    finally:
        cell.set_train(saved[0][1])
        for c, flag in saved[1:]:
            if c.training != flag:  # a sub-Cell the user set apart (set_train is recursive: parents first)
                c.set_train(flag)


def check_and_refuse(torch_module: torch.nn.Module, cell: nn.Cell, source: str, class_name: str, stem: str,
                     torch_args: Sequence[Any], torch_kwargs: Dict[str, Any], cell_inputs: Sequence[Any],
                     check: bool) -> Tuple[Dict[str, Any], str]:
    """`check_other_mode` (or why not: check=False), and `refuse_mode` when the other mode differs.

    Returns:
        (the check's result for report.other_mode, with "refused": the Cell's message when it refuses the
        mode; the generated source, guarded when refused).
    """
    if not check:
        return {"mode": mode_name(not torch_module.training), "status": "not checked", "reason": "check=False"}, source
    result = check_other_mode(torch_module, cell, torch_args, torch_kwargs, cell_inputs)
    if result["status"] == "differs":
        source = refuse_mode(cell, source, class_name, stem, result["mode"])
        result["refused"] = refusal_message(class_name, result["mode"])
    return result, source
