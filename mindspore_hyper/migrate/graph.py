"""The traced torch program in a tracer-neutral form: op nodes with their torch source locations.

Both tracers (torch.fx and torch.export) are lowered to this form; the passes (in-place rewriting,
constant folding), the mapping lookup and the code generator only see it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

__all__ = ["SourceLocation", "Node", "Graph", "map_args", "node_refs"]

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>[^\n]+)\n(?P<code>[^\n]*)')


@dataclass(frozen=True)
class SourceLocation:
    """A line of the torch model's source (file, line number, code)."""

    file: str
    line: int
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} `{self.code}`"

    @property
    def short(self) -> str:
        """`file.py:line`, for comments in generated code."""
        return f"{os.path.basename(self.file)}:{self.line}"

    @staticmethod
    def from_stack_trace(text: Optional[str], skip_dirs: tuple) -> Optional["SourceLocation"]:
        """The innermost frame of a torch-recorded stack trace outside `skip_dirs` (torch itself)."""
        if not text:
            return None
        best = None
        for m in _FRAME.finditer(text):
            path = m.group("file")
            if any(path.startswith(d) for d in skip_dirs):
                continue
            best = SourceLocation(path, int(m.group("line")), m.group("code").strip())
        return best


@dataclass(eq=False)
class Node:
    """One value of the program.

    Attributes:
        name: a Python identifier, unique in the graph (the variable in generated code).
        op: "input" (a model input), "attr" (a torch parameter/buffer, target = its qualified
            name), "constant" (a value known at conversion time, in `example`), "module" (a call
            of a mapped leaf module, target = its path), "function" (a function/method/aten call,
            target = the registry key).
        target: see `op`.
        args, kwargs: nested tuples/lists/dicts of Nodes and Python literals.
        scope: path of the torch module whose forward ran the op ("" = the root).
        scope_type: that module's class name.
        location: where in the torch source the op was called.
        example: the value on the example inputs (a torch.Tensor or Python value).
        display: the torch op as reports print it ("aten.view", "torch.nn.Linear", "Tensor.view").
    """

    name: str
    op: str
    target: Any = None
    args: tuple = ()
    kwargs: Dict[str, Any] = field(default_factory=dict)
    scope: str = ""
    scope_type: str = ""
    location: Optional[SourceLocation] = None
    example: Any = None
    display: str = ""

    def where(self) -> str:
        """Human-readable location: source line and module scope."""
        scope = f"in module {self.scope!r} ({self.scope_type})" if self.scope else "in the root module"
        return f"{self.location} {scope}" if self.location else scope

    def __repr__(self) -> str:
        return f"Node({self.name}: {self.op} {self.display or self.target})"


def map_args(value: Any, fn: Callable[[Node], Any]) -> Any:
    """Rebuild a nested args structure with every Node replaced by `fn(node)`."""
    if isinstance(value, Node):
        return fn(value)
    if isinstance(value, tuple):
        return tuple(map_args(v, fn) for v in value)
    if isinstance(value, list):
        return [map_args(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: map_args(v, fn) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(map_args(value.start, fn), map_args(value.stop, fn), map_args(value.step, fn))
    return value


def node_refs(value: Any) -> Iterator[Node]:
    """Every Node inside a nested args structure."""
    found: List[Node] = []
    map_args(value, lambda n: found.append(n) or n)
    return iter(found)


@dataclass
class Graph:
    """A traced program.

    Attributes:
        nodes: every Node in execution order (inputs first).
        inputs: the model-input Nodes in construct() order.
        outputs: the flat list of output values (Nodes or literals), pytree leaves of torch's output.
        output_names: a readable name per output ("logits", "0", ...).
        tracer: "torch.fx" or "torch.export".
        notes: facts about the trace a user should know (why fx was not used, specialisation).
        shape_specialized: the program is valid for the example input shapes only.
    """

    nodes: List[Node]
    inputs: List[Node]
    outputs: List[Any]
    output_names: List[str]
    tracer: str
    notes: List[str] = field(default_factory=list)
    shape_specialized: bool = False

    def users(self) -> Dict[Node, List[Node]]:
        """Node -> the nodes reading it, in execution order (outputs not included)."""
        result: Dict[Node, List[Node]] = {n: [] for n in self.nodes}
        for n in self.nodes:
            for ref in node_refs((n.args, n.kwargs)):
                result.setdefault(ref, []).append(n)
        return result

    def output_nodes(self) -> List[Node]:
        return list(node_refs(self.outputs))

    def replace_uses(self, old: Node, new: Any, after: Optional[Node] = None) -> None:
        """Make every reader of `old` (only those after `after`, if given) and the outputs read `new`."""
        start = 0 if after is None else self.nodes.index(after) + 1
        swap = (lambda n: new if n is old else n)
        for n in self.nodes[start:]:
            n.args = map_args(n.args, swap)
            n.kwargs = map_args(n.kwargs, swap)
        self.outputs = map_args(self.outputs, swap)
