"""PyTorch -> MindSpore migration: `convert(torch_module, example_inputs, out=None)` and
`convert_state_dict(state_dict, cell)`; `tensor_parallel_plan(model)`: the tensor-parallel splits of the
converted Cell on the torch names.

Needs torch (and transformers for transformers models); imported lazily so that the package and
its CLI load without them. (The function lives in converter.py: a submodule named `convert` would
replace the function of the same name on this package when first imported.)
"""
from typing import Any

__all__ = ["convert", "convert_state_dict", "ConversionReport", "StateDictReport", "MigrationError",
           "UnsupportedOpError", "StateDictMismatchError", "TraceFailedError", "CustomBackwardError",
           "tensor_parallel_plan", "TensorPlan"]

_WHERE = {"convert": "converter", "convert_state_dict": "state_dict", "StateDictReport": "state_dict",
          "ConversionReport": "report", "MigrationError": "errors", "UnsupportedOpError": "errors",
          "StateDictMismatchError": "errors", "TraceFailedError": "errors",
          "CustomBackwardError": "errors", "tensor_parallel_plan": "tensor_plan", "TensorPlan": "tensor_plan"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'mindspore_hyper.migrate' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"mindspore_hyper.migrate.{_WHERE[name]}"), name)
