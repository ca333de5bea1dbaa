"""The module-structured conversion behind `convert(..., structure="modules")`."""
from __future__ import annotations

import inspect
import time
from typing import Any, Dict, Optional, Tuple

import torch
from mindspore import Tensor, nn

from mindspore_hyper.migrate.codegen import root_class_name
from mindspore_hyper.migrate.codegen_modules import generate_modules
from mindspore_hyper.migrate.compare import compare_outputs, to_mindspore
from mindspore_hyper.migrate.errors import TraceFailedError, UnsupportedOpError
from mindspore_hyper.migrate.lowering import type_name
from mindspore_hyper.migrate.naming import module_file_name
from mindspore_hyper.migrate.report import ConversionReport
from mindspore_hyper.migrate.moe_blocks import moe_weights
from mindspore_hyper.migrate.state_dict import Placement, cell_parameters, convert_state_dict, match_requires_grad
from mindspore_hyper.migrate.trace_modules import trace_modules

__all__ = ["convert_modules"]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    if type(exc).__name__ == "GuardOnDataDependentSymNode":  # torch's own words name neither the cause nor a fix
        return ("control flow on a tensor value (`if`/`assert`/bool() of a value the model computes: data-dependent; "
                f"torch.export: {text[0].split(' (unhinted')[0] if text else ''})")
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def convert_modules(torch_module: torch.nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any],
                    bound: inspect.BoundArguments, class_name: Optional[str], check: bool, dynamic: bool,
                    start: float) -> Tuple[nn.Cell, ConversionReport, str, str]:
    """(cell, report, source, file stem) of `torch_module`, one Cell class per torch module class.

    Raises:
        TraceFailedError: torch.export cannot trace the model (its first error line, and the module).
        UnsupportedOpError: ops or modules without a mapping (every one, with its module path).
    """
    _check_layers(torch_module)
    try:
        traced = trace_modules(torch_module, args, kwargs, dynamic)
    except UnsupportedOpError:
        raise
    except Exception as exc:  # torch.export raises many kinds (UserError, GuardOnDataDependent, ...)
        raise TraceFailedError(f"torch.export cannot trace {type_name(type(torch_module))}: {_first_line(exc)}"
                               f"{_where(exc)}") from exc
    name = root_class_name(class_name or type(torch_module).__name__)
    stem = module_file_name(name)
    code = generate_modules(traced, torch_module, name, f"{stem}.ckpt")
    report = ConversionReport(model=type_name(type(torch_module)), tracer="torch.export (module-structured)",
                              uses=code.uses, notes=list(traced.notes), outputs=list(traced.output_names),
                              rewritten=list(traced.rewritten))
    report.classes = [{"class": c.name, "torch": c.torch_type, "modules": len(c.paths), "first": c.paths[0],
                       "hyperparameters": c.hyperparameters, "lines": c.lines} for c in code.classes]
    report.layers = dict(code.layers)
    report.loops = list(code.loops)
    report.symbolic = {k: list(v) for k, v in traced.symbolic.items()}
    # named as the exported program names its inputs (`inputs_0` for a forward(*inputs)), as `symbolic` is
    report.static = [f"{name} dimension {d} = {size}" for name, d, size in traced.static]
    report.fallbacks = list(code.fallbacks)
    report.unsupported = list(code.problems)
    if report.unsupported:
        raise UnsupportedOpError(report.unsupported, report)
    from mindspore_hyper.migrate.cell_builder import load_generated

    cell = load_generated(code.source, name, stem)
    params = cell_parameters(cell)
    for cell_name, value in code.buffers.items():
        params[cell_name].set_data(to_mindspore(value))
    moe = {}
    for path in code.moe_blocks:
        moe.update(moe_weights(torch_module.get_submodule(path), path))
    for cell_name, (value, _, _) in moe.items():
        params[cell_name].set_data(Tensor(value))
    if code.moe_blocks:  # their entries are placed above (relaid); the rest by the name rules
        state = {k: v for k, v in torch_module.state_dict().items()
                 if not any(k.startswith(f"{p}.") for p in code.moe_blocks)}
        report.weights = convert_state_dict(state, cell, ignore_missing=list(code.buffers) + list(moe))
        report.weights.placed += [Placement(t, c, how) for c, (_, t, how) in moe.items()]
        report.weights.frozen = match_requires_grad(torch_module, cell, report.weights.placed)
    else:
        report.weights = convert_state_dict(torch_module, cell, ignore_missing=list(code.buffers))
    cell.set_train(torch_module.training)
    report.seconds = time.perf_counter() - start
    report.source_lines = code.source.count("\n") + 1
    if check:
        cell_inputs = list(bound.args) + list(bound.kwargs.values())
        report.check = compare_outputs(torch_module, cell, bound.args, bound.kwargs, cell_inputs)
    return cell, report, code.source, stem


def _check_layers(torch_module: torch.nn.Module) -> None:
    """Refuse, before tracing, mapped layers whose configuration MindSpore cannot express (torch.export may
    fail on them first, with a less useful message: BatchNorm(momentum=None) reads its counter)."""
    from mindspore_hyper.migrate.mappings import lookup_module
    from mindspore_hyper.migrate.mappings.registry import Unsupported

    problems = []
    for path, module in torch_module.named_modules():
        mapping = lookup_module(module) if path else None
        if mapping is not None:
            try:
                mapping.build(module)
            except Unsupported as exc:
                problems.append(f"{type_name(type(module))} at {path!r}: {exc}")
    if problems:
        raise UnsupportedOpError(problems)


def _where(exc: BaseException) -> str:
    """` (at file:line)` of the innermost model frame of a torch.export failure, when there is one."""
    import traceback

    torch_dir = torch.__file__.rsplit("/", 1)[0]
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(torch_dir)
              and "mindspore_hyper" not in f.filename]
    if not frames:
        return ""
    where = frames[-1].filename.rsplit("site-packages/", 1)[-1]  # transformers/models/...: the installed package
    return f" (at {where}:{frames[-1].lineno} `{frames[-1].line}`)"
