"""torch -> MindSpore mappings, one module per op family; importing this package registers them all."""
from mindspore_hyper.migrate.mappings import (  # noqa: F401  (registration on import)
    activation, attention, conv, creation, dropout, elementwise, embedding, linear, norm, pooling, reduction,
    tensor_ops)
from mindspore_hyper.migrate.mappings.registry import (
    FunctionMapping, ModuleMapping, function_mappings, lookup_function, lookup_module, module_mappings)

__all__ = ["FunctionMapping", "ModuleMapping", "function_mappings", "lookup_function", "lookup_module",
           "module_mappings"]
