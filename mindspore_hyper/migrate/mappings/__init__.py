"""torch -> MindSpore mappings, one module per op family; importing this package registers them all."""
from mindspore_hyper.migrate.mappings import (  # noqa: F401  (registration on import)
    activation, attention, conv, creation, dropout, einsum, elementwise, embedding, fft, linear, norm, pooling,
    reduction, resize, selective_scan, tensor_ops)
from mindspore_hyper.migrate.mappings.registry import (
    FunctionMapping, ModuleMapping, function_mappings, lookup_function, lookup_module, module_mappings)

__all__ = ["FunctionMapping", "ModuleMapping", "function_mappings", "lookup_function", "lookup_module",
           "module_mappings"]
