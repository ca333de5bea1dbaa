"""The registry of torch -> MindSpore mappings, and the value types the per-family modules use.

A function mapping turns one torch call (a torch function, a Tensor method, an aten op of a
torch.export graph) into a MindSpore expression of generated code; a module mapping turns one
torch leaf module into a MindSpore Cell constructor. The per-family modules (linear, norm, ...)
register themselves on import.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Union

__all__ = [
    "NOT_CONSTANT", "NO_VALUE", "Arg", "Alias", "Unsupported", "FunctionMapping", "ModuleMapping",
    "method", "function", "module", "lookup_function", "lookup_module", "function_mappings",
    "module_mappings", "torch_name",
]

NOT_CONSTANT = object()


class _NoValue:
    """An op kept for its check only (assertions): it produces nothing."""

    def __repr__(self) -> str:
        return "NO_VALUE"


NO_VALUE = _NoValue()


class Unsupported(Exception):
    """Raised by a mapping for a call it cannot express (the message says why)."""


class Arg:
    """One argument of a traced call as the generated code sees it.

    Attributes:
        code: the Python expression in generated code (`str(arg)`).
        value: the literal value when known at conversion time, else NOT_CONSTANT.
        example: the value on the example inputs (torch tensor or Python value), or None.
        items: the elements when the argument is a list, tuple or slice built from run-time
            values (a slice has three: start, stop, step), else None.
        kind: "list", "tuple" or "slice" when `items` is set, else "".
    """

    def __init__(self, code: str, value: Any = NOT_CONSTANT, example: Any = None,
                 items: Optional[List["Arg"]] = None, kind: str = ""):
        self.code, self.value, self.example, self.items, self.kind = code, value, example, items, kind

    def __str__(self) -> str:
        return self.code

    def __repr__(self) -> str:
        return f"Arg({self.code})"

    @property
    def is_constant(self) -> bool:
        return self.value is not NOT_CONSTANT

    def const(self, what: str) -> Any:
        """The literal value; raises Unsupported naming `what` when it is only known at run time."""
        if self.value is NOT_CONSTANT:
            raise Unsupported(f"{what} must be known at conversion time, got the run-time value `{self.code}`")
        return self.value

    @property
    def is_tensor(self) -> bool:
        import torch

        return isinstance(self.example, torch.Tensor)

    @property
    def shape(self) -> tuple:
        return tuple(self.example.shape) if self.is_tensor else ()

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self):
        return self.example.dtype if self.is_tensor else None


@dataclass(frozen=True)
class Alias:
    """The call's value is `arg` itself (a no-op such as `contiguous()`): no code is emitted."""

    arg: Arg


Emitted = Union[str, Alias, _NoValue]


@dataclass(frozen=True)
class FunctionMapping:
    """A torch callable -> a MindSpore expression.

    Attributes:
        key: the registry key (function object, ("method", name), or aten OpOverloadPacket).
        torch_name: how reports name the torch op.
        ms_name: the MindSpore API it becomes (for reports and docs).
        emit: (*Arg, **Arg) -> generated expression / Alias / NO_VALUE; raises Unsupported.
        foldable: whether a call with only constant inputs may be computed at conversion time.
    """

    key: Hashable
    torch_name: str
    ms_name: str
    emit: Callable[..., Emitted]
    foldable: bool = True


@dataclass(frozen=True)
class ModuleMapping:
    """A torch leaf module type -> a MindSpore Cell.

    Attributes:
        torch_type: the torch.nn class (exact; subclasses only if they keep its forward).
        ms_name: the MindSpore Cell it becomes.
        build: torch module -> constructor code (e.g. `nn.Dense(16, 32, has_bias=True)`);
            raises Unsupported for configurations MindSpore cannot express.
        params: torch parameter/buffer name -> the Cell's attribute name (absent: not kept).
        relaid: parameters whose MindSpore layout differs from torch's (Conv1d weight): the
            generated code cannot read them as torch tensors.
        accepts: torch module -> whether this instance maps (None: every instance); one that does not
            (a LayerNorm without bias, whose MindSpore layer would train a beta torch lacks) is
            converted from its traced program instead.
    """

    torch_type: type
    ms_name: str
    build: Callable[[Any], str]
    params: Dict[str, str] = field(default_factory=dict)
    relaid: tuple = ()
    accepts: Optional[Callable[[Any], bool]] = None


_FUNCTIONS: Dict[Hashable, FunctionMapping] = {}
_MODULES: Dict[type, ModuleMapping] = {}


def method(name: str) -> tuple:
    """Registry key of the Tensor method `name` (fx `call_method`)."""
    return ("method", name)


def torch_name(key: Hashable) -> str:
    """How reports name a torch op key."""
    if isinstance(key, tuple) and len(key) == 2 and key[0] == "method":
        return f"Tensor.{key[1]}"
    qualified = getattr(key, "_qualified_op_name", None)  # aten OpOverloadPacket
    if qualified:
        return qualified.replace("::", ".")
    module = getattr(key, "__module__", None) or ""
    name = getattr(key, "__name__", None) or repr(key)
    module = {"_operator": "operator", "torch._C._nn": "torch.nn.functional",
              "torch._C._VariableFunctions": "torch", "torch.functional": "torch"}.get(module, module)
    if module == "builtins":
        return name
    return f"{module}.{name}" if module else name


def function(ms_name: str, *keys: Hashable, foldable: bool = True,
             names: Optional[Sequence[str]] = None) -> Callable:
    """Register the decorated emitter for every key (torch function, method(...), aten packet).

    Args:
        ms_name: the MindSpore API the emitter produces.
        *keys: torch callables the emitter maps (their argument names must bind to its signature).
        foldable: False for ops whose value changes between calls (random ops).
        names: report names for the keys (default: derived from each key).
    """

    def register(emit: Callable) -> Callable:
        inspect.signature(emit)  # the emitter's signature is the binding contract
        for i, key in enumerate(keys):
            if key in _FUNCTIONS:
                raise ValueError(f"torch op {torch_name(key)} is mapped twice")
            name = names[i] if names else torch_name(key)
            _FUNCTIONS[key] = FunctionMapping(key, name, ms_name, emit, foldable)
        return emit

    return register


def module(torch_type: type, ms_name: str, params: Optional[Dict[str, str]] = None, relaid: tuple = (),
           accepts: Optional[Callable[[Any], bool]] = None) -> Callable:
    """Register the decorated constructor-code builder for `torch_type` (see ModuleMapping)."""

    def register(build: Callable) -> Callable:
        if torch_type in _MODULES:
            raise ValueError(f"torch module {torch_type.__name__} is mapped twice")
        _MODULES[torch_type] = ModuleMapping(torch_type, ms_name, build, dict(params or {}), tuple(relaid), accepts)
        return build

    return register


def lookup_function(key: Hashable) -> Optional[FunctionMapping]:
    """The mapping of a torch op key, or None."""
    try:
        return _FUNCTIONS.get(key)
    except TypeError:  # unhashable key
        return None


def lookup_module(torch_module: Any) -> Optional[ModuleMapping]:
    """The mapping of a torch module: its exact type, or a mapped base class whose forward it keeps.

    A module with `torch.nn.utils.parametrize` parametrizations (weight norm: `weight = g * v / ||v||`, computed
    from `parametrizations.weight.original0/1` at each access) is never mapped: the MindSpore layer would store and
    train the computed weight instead of its originals. Its traced program (the parametrization's ops and the
    functional call) is converted instead."""
    if _parametrized(torch_module):
        return None
    cls = type(torch_module)
    found = _MODULES.get(cls)
    if found is None:
        base = next((b for b in cls.__mro__[1:] if b in _MODULES), None)
        found = _MODULES[base] if base is not None and cls.forward is base.forward else None
    if found is not None and found.accepts is not None and not found.accepts(torch_module):
        return None
    return found


def _parametrized(torch_module: Any) -> bool:
    """Whether `torch_module` has torch.nn.utils.parametrize parametrizations."""
    from torch.nn.utils import parametrize

    return parametrize.is_parametrized(torch_module)


def function_mappings() -> List[FunctionMapping]:
    """Every registered function mapping (for docs and coverage tests)."""
    return list(_FUNCTIONS.values())


def module_mappings() -> List[ModuleMapping]:
    """Every registered module mapping."""
    return list(_MODULES.values())
