"""`convert` subcommand: `convert module:Class --input-shape 2,16 [--input-dtype int64] [--check-shape 5,37] --out DIR`.

`add_parser(subparsers)` adds it to any argparse CLI (the package's `mindspore-hyper`);
`python -m mindspore_hyper.migrate convert ...` runs it alone. torch is imported only when the
command runs.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any, List, Tuple

__all__ = ["add_parser", "run", "DTYPES"]

DTYPES = ("float32", "float16", "bfloat16", "float64", "int64", "int32", "bool")

_EPILOG = """\
examples:
  convert <your_module>:<YourMLP> --input-shape 4,16 --out converted/
  convert <your_module>:<make_llama> --input-shape 2,16 --input-dtype int64 --int-high 100 --check-shape 5,37 --out llama/
  convert <your_module>:<make_gpt2> --input-shape 2,8 --input-dtype int64 --int-high 100 --out gpt2/
  convert <your_module>:<TwoInputs> --input-shape 2,8 --input-shape 2,8 --input-dtype int64 --input-dtype bool --out two/

<your_module>:<...> is a placeholder for your own torch model. The class (or factory function)
is imported from the module (the current directory is on the path), called with --init-args,
and traced on random inputs of the given shapes. The output directory gets <name>.py (the Cell
classes, with build(checkpoint)), <name>.ckpt and <name>.report.json, and the command prints a
summary (each input's symbolic and fixed dimensions, the classes, fallbacks, mappings, the check
against torch, the files); nothing is written when the conversion fails. Exit status: 0
converted, 1 unsupported ops, a failed trace or a failed --check-shape, 2 bad arguments.
"""


def _target(text: str) -> Tuple[str, str]:
    module, sep, attr = text.partition(":")
    if not sep or not module or not attr:
        raise argparse.ArgumentTypeError(f"expected module:Class (e.g. mymodels:MLP), got {text!r}")
    return module, attr


def _shape(text: str) -> Tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.split(","))
    except ValueError:
        dims = ()
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers like 2,16, got {text!r}")
    return dims


def _init_args(text: str) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected JSON (a list of positional or an object of keyword "
                                         f"arguments), got {text!r}: {exc.msg}") from None
    if not isinstance(value, (list, dict)):
        raise argparse.ArgumentTypeError(f"expected a JSON list or object, got {type(value).__name__}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_parser(subparsers: "argparse._SubParsersAction") -> None:
    """Add the `convert` subcommand (its handler is `run`, set as `func`)."""
    parser = subparsers.add_parser(
        "convert", help="convert a PyTorch model to a MindSpore Cell (source + checkpoint)",
        description="Convert a PyTorch nn.Module to a MindSpore nn.Cell: readable source, a MindSpore "
                    "checkpoint of its weights and a report of every op mapping.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", type=_target, metavar="module:Class",
                        help="the torch model class, or a function returning the model")
    parser.add_argument("--input-shape", type=_shape, action="append", required=True, metavar="D1,D2,...",
                        help="shape of one example input; repeat for each positional input of forward()")
    parser.add_argument("--input-dtype", choices=DTYPES, action="append", metavar="DTYPE",
                        help=f"dtype of the inputs, one for all or one per --input-shape ({', '.join(DTYPES)}; "
                             "default float32)")
    parser.add_argument("--int-high", type=_positive, default=2, metavar="N",
                        help="integer inputs are drawn from [0, N) (e.g. the vocabulary size; default 2)")
    parser.add_argument("--init-args", type=_init_args, default=[], metavar="JSON",
                        help='constructor arguments: a JSON list (positional) or object (keywords), e.g. \'{"dim": 64}\'')
    parser.add_argument("--out", required=True, metavar="DIR", help="directory for the source, checkpoint and report")
    parser.add_argument("--structure", choices=("modules", "flat"), default="modules",
                        help="modules: one Cell class per torch module class, symbolic batch/sequence dimensions "
                             "(default); flat: one class whose construct holds every op")
    parser.add_argument("--tracer", choices=("auto", "fx", "export"), default="auto",
                        help="with --structure flat: torch.fx, torch.export if fx cannot trace the model (auto, "
                             "default)")
    parser.add_argument("--check-shape", type=_shape, action="append", metavar="D1,D2,...",
                        help="also run torch and MindSpore on random inputs of this shape (one per --input-shape) "
                             "and report the relative error (exit status 1 above 1e-5)")
    parser.add_argument("--train", action="store_true",
                        help="convert in training mode (BatchNorm batch statistics, active dropout); default eval")
    parser.add_argument("--custom-backward", choices=("check", "differentiate"), default="check",
                        help="a torch.autograd.Function with its own backward: check (default) compares gradients "
                             "and fails when they differ; differentiate accepts the Cell differentiating its forward")
    parser.add_argument("--class-name", metavar="NAME", help="name of the generated Cell class (default: the torch class)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random example inputs and weights (default 0)")
    parser.add_argument("--tensor-plan", action="store_true",
                        help="also write tensor_plan.yaml into --out and print it: the tensor-parallel splits of the "
                             "model's Linear layers on its torch names (tensor_parallel_plan, a tensor axis of 2)")
    parser.set_defaults(func=run, parser=parser)


def _error(message: str, status: int) -> int:
    print(f"convert: error: {message}", file=sys.stderr)
    return status


def _dtypes(args: argparse.Namespace) -> List[str]:
    given = args.input_dtype or ["float32"]
    if len(given) == 1:
        return given * len(args.input_shape)
    if len(given) != len(args.input_shape):
        raise ValueError(f"--input-dtype: {len(given)} given for {len(args.input_shape)} --input-shape; give one "
                         "for all inputs or one per input")
    return given


def run(args: argparse.Namespace) -> int:
    """Run `convert`; returns the exit status (0 converted, 1 conversion failed, 2 bad arguments)."""
    try:
        dtypes = _dtypes(args)
    except ValueError as exc:
        return _error(str(exc), 2)
    if args.tracer != "auto" and args.structure != "flat":
        return _error(f"--tracer {args.tracer} applies to --structure flat only (--structure modules, the default, "
                      "always traces with torch.export)", 2)
    module_name, attr = args.target
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may raise anything on import
        return _error(f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}", 2)
    factory = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            return _error(f"module {module_name!r} has no attribute {attr!r}", 2)
        factory = getattr(factory, part)
    if not callable(factory):
        return _error(f"{module_name}:{attr} is not a class or function", 2)

    import torch
    import mindspore as ms

    from mindspore_hyper.migrate.errors import MigrationError
    from mindspore_hyper.migrate.converter import convert

    torch.manual_seed(args.seed)
    init = args.init_args
    try:
        model = factory(*init) if isinstance(init, list) else factory(**init)
    except Exception as exc:
        return _error(f"{module_name}:{attr}({json.dumps(init)}) failed: {type(exc).__name__}: {exc}", 2)
    if not isinstance(model, torch.nn.Module):
        return _error(f"{module_name}:{attr} returned {type(model).__name__}, not a torch.nn.Module", 2)
    model.train(args.train)
    if args.check_shape and len(args.check_shape) != len(args.input_shape):
        return _error(f"--check-shape: {len(args.check_shape)} given for {len(args.input_shape)} --input-shape; "
                      "give one per input", 2)
    inputs = _random_inputs(torch, args.input_shape, dtypes, args.int_high)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        cell, report = convert(model, tuple(inputs), out=args.out, tracer=args.tracer, class_name=args.class_name,
                               structure=args.structure, custom_backward=args.custom_backward)
    except (MigrationError, TypeError) as exc:
        return _error(str(exc), 1)
    status = 0
    if args.check_shape:
        from mindspore_hyper.migrate.compare import compare_outputs

        second = _random_inputs(torch, args.check_shape, dtypes, args.int_high)
        try:
            result = compare_outputs(model, cell, second, {}, second)
        except Exception as exc:  # the Cell or torch may reject the shape (a dimension kept static)
            result = {"failed": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"}
        result["shapes"] = [list(s) for s in args.check_shape]
        report.check["second_shape"] = result
        from mindspore_hyper.migrate.converter import write_atomic

        text = report.to_json()

        def write(path):
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        write_atomic(report.files["report"], write)
        if "failed" in result or result.get("max_relative_error", 0.0) > 1e-5:
            status = 1
    print(report)
    if args.tensor_plan:
        from mindspore_hyper.migrate.tensor_plan import tensor_parallel_plan

        text = tensor_parallel_plan(model).to_yaml()
        with open(os.path.join(args.out, "tensor_plan.yaml"), "w", encoding="utf-8") as f:
            f.write(text)
        print(text, end="")
    if status:
        print(f"convert: error: the check at {args.check_shape} failed: {report.check['second_shape']}",
              file=sys.stderr)
    return status


def _random_inputs(torch, shapes, dtypes, int_high: int) -> list:
    inputs = []
    for shape, dtype in zip(shapes, dtypes):
        torch_dtype = getattr(torch, dtype)
        if torch_dtype.is_floating_point:
            inputs.append(torch.randn(shape, dtype=torch_dtype))
        else:
            inputs.append(torch.randint(0, int_high if dtype != "bool" else 2, shape).to(torch_dtype))
    return inputs
