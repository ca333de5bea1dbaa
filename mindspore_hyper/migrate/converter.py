"""`convert(torch_module, example_inputs, out=None)`: a torch model as a MindSpore Cell, in one call."""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional, Tuple

import torch
import mindspore as ms
from mindspore import nn

from mindspore_hyper.migrate.cell_builder import load_generated, plan_cells
from mindspore_hyper.migrate.codegen import generate, root_class_name
from mindspore_hyper.migrate.compare import compare_outputs, to_mindspore
from mindspore_hyper.migrate.complex_pairs import rewrite_complex
from mindspore_hyper.migrate.custom_backward import CUSTOM_BACKWARD, check_custom_backward, find_custom_functions
from mindspore_hyper.migrate.errors import UnsupportedOpError
from mindspore_hyper.migrate.fold import fold_constants
from mindspore_hyper.migrate.inplace import rewrite_inplace
from mindspore_hyper.migrate.lowering import type_name
from mindspore_hyper.migrate.mode_check import check_and_refuse
from mindspore_hyper.migrate.naming import module_file_name
from mindspore_hyper.migrate.report import ConversionReport
from mindspore_hyper.softmax_backward_cache import ensure_softmax_backward
from mindspore_hyper.migrate.state_dict import convert_state_dict
from mindspore_hyper.migrate.trace import TRACERS, trace
from mindspore_hyper.migrate.trace_fx import bind_inputs

__all__ = ["convert", "module_file_name", "STRUCTURES", "write_atomic"]

STRUCTURES = ("flat", "modules")


def _example_args(example_inputs: Any) -> Tuple[Any, ...]:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs)
    raise TypeError(f"example_inputs: expected a torch.Tensor or a tuple of them, got {type(example_inputs).__name__}")


def convert(torch_module: torch.nn.Module, example_inputs: Any, out: Optional[str] = None, *,
            example_kwargs: Optional[Dict[str, Any]] = None, tracer: str = "auto", check: bool = True,
            class_name: Optional[str] = None, structure: str = "modules",
            dynamic: bool = True, custom_backward: str = "check") -> Tuple[nn.Cell, ConversionReport]:
    """Convert a torch model to a MindSpore Cell with the same structure, weights and outputs.

    Args:
        torch_module: the torch model (its train/eval mode carries over to the Cell).
        example_inputs: a tensor or tuple of tensors for its forward (positional).
        out: a directory; when given, writes `<name>.py` (the Cell source, importable, with
            `build(checkpoint)`), `<name>.ckpt` (MindSpore checkpoint) and `<name>.report.json`.
        example_kwargs: keyword inputs of the forward (e.g. {"attention_mask": mask}); they become
            positional inputs of the Cell, after `example_inputs`, in this order.
        tracer: with structure="flat": "auto" (torch.fx, torch.export when fx fails), "fx" or
            "export". structure="modules" always traces with torch.export (another value is an error).
        check: run both models on the example inputs and put the relative error in the report.
        class_name: name of the generated class (default: the torch class name).
        structure: "modules" (the default: the port, one Cell class per torch module class, traced
            by torch.export with symbolic dimensions; `report.symbolic` says which) or "flat" (one
            class whose construct holds every op, traced by `tracer`; only on request).
        dynamic: with structure="modules", make the input dimensions symbolic where the model
            allows (False: specialised to the example shapes).
        custom_backward: what to do when the forward runs a torch.autograd.Function with its own backward
            (the Cell differentiates its forward instead): "check" (default) compares both models' gradients
            and raises CustomBackwardError when they differ; "differentiate" accepts a difference. Either way
            the result is in `report.custom_backward` (the check runs even with check=False).

    Returns:
        (cell, report): the Cell (weights loaded) and the ConversionReport.

    Raises:
        TypeError: `torch_module` is not a torch module, or the inputs do not fit its forward.
        ValueError: MindSpore is not in PyNative mode, `tracer`, `structure` or `custom_backward` is
            unknown, or a tracer is named with structure="modules".
        UnsupportedOpError: ops or modules without a mapping (every one, with its source location).
        TraceFailedError: neither tracer can trace the model, or torch fails on the example inputs.
        CustomBackwardError: a Function's backward is not the gradient of its forward (custom_backward="check").
    """
    if not isinstance(torch_module, torch.nn.Module):
        raise TypeError(f"torch_module: expected a torch.nn.Module, got {type(torch_module).__name__}")
    if ms.get_context("mode") != ms.PYNATIVE_MODE:
        raise ValueError("convert builds and checks the Cell op by op: call "
                         "mindspore.set_context(mode=mindspore.PYNATIVE_MODE) first")
    ensure_softmax_backward()  # the checks below differentiate the Cell
    if structure not in STRUCTURES:
        raise ValueError(f"structure={structure!r}; expected one of {STRUCTURES}")
    if tracer not in TRACERS:
        raise ValueError(f"tracer={tracer!r}; expected one of {TRACERS}")
    if custom_backward not in CUSTOM_BACKWARD:
        raise ValueError(f"custom_backward={custom_backward!r}; expected one of {CUSTOM_BACKWARD}")
    if structure == "modules" and tracer != "auto":
        raise ValueError(f"tracer={tracer!r} chooses the tracer of the flat trace: pass structure='flat' with it "
                         "(structure='modules', the default, always traces with torch.export)")
    start = time.perf_counter()
    args, kwargs = _example_args(example_inputs), dict(example_kwargs or {})
    bound = bind_inputs(torch_module, args, kwargs)
    functions = find_custom_functions(torch_module, bound.args, bound.kwargs)
    if structure == "modules":
        from mindspore_hyper.migrate.convert_modules import convert_modules

        cell, report, source, stem = convert_modules(torch_module, args, kwargs, bound, class_name, check, dynamic,
                                                     start)
        if functions:
            report.custom_backward = check_custom_backward(
                torch_module, cell, bound.args, bound.kwargs, list(bound.args) + list(bound.kwargs.values()),
                report.weights, functions, custom_backward)
        # after the custom-backward check, which may run the Cell in eval mode (before any refusal)
        report.other_mode, source = check_and_refuse(torch_module, cell, source, root_class_name(
            class_name or type(torch_module).__name__), stem, bound.args, bound.kwargs,
            list(bound.args) + list(bound.kwargs.values()), check)
        report.source_lines = source.count("\n") + 1
        if out is not None:
            _write(out, stem, source, cell, report)
        return cell, report
    graph = trace(torch_module, args, kwargs, tracer)
    rewritten, problems = rewrite_inplace(graph)
    complex_notes, complex_problems = rewrite_complex(graph)
    graph.notes += complex_notes
    problems += complex_problems
    folded = fold_constants(graph)
    plan = plan_cells(torch_module, graph)
    name = root_class_name(class_name or type(torch_module).__name__)
    file_stem = module_file_name(name)
    code = generate(graph, plan, name, type_name(type(torch_module)), f"{file_stem}.ckpt")
    report = ConversionReport(model=type_name(type(torch_module)), tracer=graph.tracer, uses=code.uses,
                              notes=list(graph.notes), folded=folded, rewritten=rewritten,
                              outputs=list(graph.output_names))
    report.unsupported = problems + plan.problems + code.problems
    if report.unsupported:
        raise UnsupportedOpError(report.unsupported, report)
    cell = load_generated(code.source, name, file_stem)
    for const_name, value in plan.constants.items():
        getattr(cell.constants, const_name).set_data(to_mindspore(value))
    report.weights = convert_state_dict(torch_module, cell,
                                        ignore_missing=[f"constants.{n}" for n in plan.constants])
    cell.set_train(torch_module.training)
    report.seconds = time.perf_counter() - start
    cell_inputs = [bound.arguments[str(n.target)] for n in graph.inputs]
    for node, value in zip(graph.inputs, cell_inputs):
        if isinstance(value, torch.Tensor):
            arg = str(node.target)
            report.symbolic[arg] = [None if graph.shape_specialized else f"{arg}.shape[{d}]"
                                    for d in range(value.dim())]
            if graph.shape_specialized:
                report.static += [f"{arg} dimension {d} = {size}" for d, size in enumerate(value.shape)]
    if check:
        report.check = compare_outputs(torch_module, cell, bound.args, bound.kwargs, cell_inputs)
    if functions:
        report.custom_backward = check_custom_backward(torch_module, cell, bound.args, bound.kwargs, cell_inputs,
                                                       report.weights, functions, custom_backward)
    report.other_mode, code.source = check_and_refuse(torch_module, cell, code.source, name, file_stem, bound.args,
                                                      bound.kwargs, cell_inputs, check)
    if out is not None:
        _write(out, file_stem, code.source, cell, report)
    return cell, report


def write_atomic(path: str, write) -> None:
    """Write a file through `write(temporary path)` and rename it to `path`: a reader never sees a partial
    file, and on failure nothing is left behind."""
    folder, name = os.path.split(path)
    stem, ext = os.path.splitext(name)
    temporary = os.path.join(folder, f".{stem}.{os.getpid()}.tmp{ext}")  # MindSpore keeps a .ckpt suffix
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def _write_text(text: str):
    def write(path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return write


def _write(out: str, stem: str, source: str, cell: nn.Cell, report: ConversionReport) -> None:
    """The source, checkpoint and report under `out`, each written to a temporary file and renamed; all
    three are prepared before the first rename, so a failure leaves no file (and no new directory)."""
    created = not os.path.isdir(out)
    os.makedirs(out, exist_ok=True)
    paths = {"source": os.path.join(out, f"{stem}.py"), "checkpoint": os.path.join(out, f"{stem}.ckpt"),
             "report": os.path.join(out, f"{stem}.report.json")}
    temporary = {k: os.path.join(out, f".{stem}.{os.getpid()}.tmp{os.path.splitext(v)[1]}") for k, v in paths.items()}
    temporary["report"] = os.path.join(out, f".{stem}.{os.getpid()}.tmp.report.json")
    report.files = dict(paths)
    try:
        _write_text(source)(temporary["source"])
        ms.save_checkpoint(cell, temporary["checkpoint"])
        _write_text(report.to_json())(temporary["report"])
        for kind in ("checkpoint", "report", "source"):
            os.replace(temporary[kind], paths[kind])
    except BaseException:
        report.files = {}
        for path in temporary.values():
            if os.path.exists(path):
                os.remove(path)
        if created and not os.listdir(out):
            os.rmdir(out)
        raise
