"""Complex tensors of a traced program as real (real, imaginary) pairs in a last dimension of 2.

Llama 4's rotary embedding builds `freqs_cis = torch.polar(ones, angles)`, views the queries as complex
(`view_as_complex(q.reshape(..., -1, 2))`), multiplies and views the product back as real (`view_as_real`).
The generated Cell computes the same values in real arithmetic: every complex value is held as the real tensor
`torch.view_as_real` would give (its last dimension of 2 holds the real and imaginary parts), so
`view_as_complex` and `view_as_real` become the identity, `polar(r, t)` becomes `stack([r cos t, r sin t], -1)`
and a complex product `(a + bi)(c + di)` becomes `stack([ac - bd, ad + bc], -1)`. Shape ops on complex values
keep their meaning with the dimension arguments renumbered (a negative dimension counts one further from the
end; a shape gets the trailing 2). An op on a complex value outside this list is refused with its name.

Complex values made by a mapped op other than these (`fftn`, whose result FNet reads through `real`), and model
inputs, stay MindSpore complex tensors, as their mappings compute them; such a value may not cross a module
boundary (modules pass complex values as pairs), and an op mixing it with pairs is refused.

Each rewritten op is computed on the example inputs by the real ops and compared with `view_as_real` of torch's
complex op on the same inputs (the pairs viewed as complex again), so a rewrite that moved the wrong dimension
cannot pass silently.
Allowed difference (u: unit roundoff of the dtype): views and moves are exact; a real part of a complex
product, `ac - bd`, is within 2u (|ac| + |bd|) of exact on each side (two rounded products and a rounded
difference, Higham 3.1), so the two sides differ by at most 4u (|ac| + |bd|) <= 8u A B (A, B: the largest part of either factor); `r cos t`
is within (1 + 2)u |r| on each side (the product, and cos/sin within 1 ulp = 2u of |cos t| <= 1, glibc and
SLEEF u10 alike): 6u max|r| <= 8u max|r|. A product by a real tensor or number rounds once, the same
product on both sides: 2u max|z| max|r|.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch

from mindspore_hyper.migrate.graph import Graph, Node, map_args, node_refs
from mindspore_hyper.migrate.mappings import lookup_function

__all__ = ["rewrite_complex", "PAIR_OPS"]

aten = torch.ops.aten
_REAL = {torch.complex64: torch.float32, torch.complex128: torch.float64, torch.complex32: torch.float16}
# ops whose value on (real, imaginary) pairs is the same op (elementwise on both parts, or a copy)
_SAME = {"clone", "contiguous", "alias", "detach", "lift_fresh_copy", "neg", "resolve_conj", "resolve_neg",
         "index"}
# op name -> names of its dimension arguments (renumbered when negative) among the schema's
_DIMS = {"slice": ("dim",), "select": ("dim",), "unsqueeze": ("dim",), "transpose": ("dim0", "dim1"),
         "flatten": ("start_dim", "end_dim"), "cat": ("dim",), "stack": ("dim",), "split": ("dim",),
         "split_with_sizes": ("dim",), "chunk": ("dim",), "unbind": ("dim",), "sym_size": ("dim",),
         "narrow": ("dim",), "squeeze": ("dim",), "movedim": ("source", "destination")}
_SHAPES = {"view": "size", "reshape": "shape", "_unsafe_view": "size", "expand": "size"}
PAIR_OPS = sorted({"view_as_complex", "view_as_real", "polar", "mul", "div", "add", "sub", "real", "imag",
                   "conj", "_conj", "conj_physical", "permute", "to", "_to_copy", "_assert_tensor_metadata",
                   "getitem"} | _SAME | set(_DIMS) | set(_SHAPES))


class _Refused(Exception):
    """A complex op the pair form does not express (the message says which and why)."""


def _is_complex(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_complex()
    if isinstance(value, (list, tuple)):
        return any(_is_complex(v) for v in value)
    return False


def _as_pairs(value: Any) -> Any:
    """`value` with every complex tensor replaced by its (real, imaginary) pairs."""
    if isinstance(value, torch.Tensor):
        return torch.view_as_real(value.resolve_conj()).clone() if value.is_complex() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_as_pairs(v) for v in value)
    return value


def _example(value: Any) -> Any:
    return map_args(value, lambda n: n.example)


def _name(node: Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target.__name__
    return getattr(target, "__name__", str(target))


class _Rewriter:
    """Rewrites one graph in place; `pair` holds the nodes whose value is now a pair tensor."""

    def __init__(self, graph: Graph, layer: Callable[[str], bool]):
        self.graph, self.layer = graph, layer
        self.pair: Set[Node] = set()
        self.native: Set[Node] = set()  # complex values left to MindSpore's complex type (native_op)
        self.taken = {n.name for n in graph.nodes}
        self.inserted: List[Node] = []

    # -- helpers --------------------------------------------------------------------------------------
    def fresh(self, stem: str) -> str:
        name, k = stem, 1
        while name in self.taken:
            k += 1
            name = f"{stem}_{k}"
        self.taken.add(name)
        return name

    def op(self, at: Node, stem: str, target: Any, /, **kwargs: Any) -> Node:
        """A new node `target(**kwargs)` before `at`, its example computed by torch."""
        node = Node(name=self.fresh(f"{at.name}_{stem}"), op="function", target=target, kwargs=kwargs,
                    scope=at.scope, scope_type=at.scope_type, location=at.location,
                    example=target(**_example(kwargs)), display=f"aten.{target.__name__}")
        self.inserted.append(node)
        return node

    def part(self, at: Node, z: Node, index: int) -> Node:
        return self.op(at, "re" if index == 0 else "im", aten.select, self=z, dim=-1, index=index)

    def is_pair(self, value: Any) -> bool:
        return isinstance(value, Node) and value in self.pair

    def set(self, node: Node, target: Any, /, **kwargs: Any) -> None:
        node.target, node.args, node.kwargs = target, (), kwargs
        node.display = f"{node.display} (as real pairs: aten.{target.__name__})"

    # -- the pass -------------------------------------------------------------------------------------
    def run(self, root: bool) -> List[str]:
        problems: List[str] = []
        for node in list(self.graph.nodes):
            refs = list(node_refs((node.args, node.kwargs)))
            inputs = [r for r in refs if r in self.pair]
            if node.op == "module" and any(r in self.native for r in refs):
                problems.append(f"{node.display}: a complex value of MindSpore's own complex type is passed to a "
                                f"module (modules take complex values as (real, imaginary) pairs) ({node.where()})")
                continue
            if not inputs and not _is_complex(node.example):
                continue
            if not inputs and self.native_op(node, root):
                self.native.add(node)
                continue
            self.inserted = []
            try:
                self.rewrite(node)
            except _Refused as exc:
                problems.append(f"{node.display}: {exc} ({node.where()})")
                continue
            index = self.graph.nodes.index(node)
            self.graph.nodes[index:index] = self.inserted
        if root:
            outputs = [n for n in self.graph.output_nodes() if n in self.pair]
            problems += [f"output `{n.name}`: the model returns a complex tensor (complex values are converted as "
                         f"(real, imaginary) pairs inside the model only) ({n.where()})" for n in outputs]
        else:
            outputs = [n for n in self.graph.output_nodes() if n in self.native]
            problems += [f"output `{n.name}`: a module returns a complex value of MindSpore's own complex type "
                         f"(modules return complex values as (real, imaginary) pairs) ({n.where()})" for n in outputs]
        return problems

    def native_op(self, node: Node, root: bool) -> bool:
        """Whether `node` (no pair among its inputs, a complex value) stays a MindSpore complex tensor, as its
        mapping computes it: a model input, and mapped ops other than the pair makers (`fftn`, whose result
        FNet reads through `real`); an item of such a value's list."""
        if node.op == "input":
            return root
        if node.op != "function":
            return False
        if node.target is operator.getitem:
            return isinstance(node.args[0], Node) and node.args[0] in self.native
        return _name(node) not in ("view_as_complex", "polar") and lookup_function(node.target) is not None

    def rewrite(self, node: Node) -> None:
        before = node.example
        if node.op == "input":  # of a module program: its callers pass pairs
            self.mark(node, before)
            return
        if node.op == "attr":
            raise _Refused("a complex parameter or buffer is not supported (its checkpoint entry would need the "
                           "(real, imaginary) layout)")
        if node.op == "constant":
            self.mark(node, before)
            return
        if node.op == "module":
            if self.layer(str(node.target)):
                raise _Refused(f"the MindSpore layer {node.target!r} would receive or return a complex value")
            self.mark(node, before)  # a generated module: its own program takes pairs (rewritten alike)
            return
        if node.op == "function" and node.target is operator.getitem:
            if not isinstance(node.args[0], Node) or not isinstance(node.args[0].example, (list, tuple)):
                raise _Refused("indexing a complex tensor with Python's [] is not converted")
            self.mark(node, before)  # an item of a list of tensors: torch's item, as pairs
            return
        if node.op != "function" or not isinstance(node.target, torch._ops.OpOverloadPacket) or node.args:
            raise _Refused("complex values are converted in torch.export programs only (aten ops by name)")
        name = _name(node)
        handler: Optional[Callable[[Node, Dict[str, Any]], float]] = getattr(self, f"op_{name}", None)
        if handler is None:
            if name in _SAME or name in _DIMS or name in _SHAPES:
                handler = self.op_shape
            else:
                raise _Refused(f"aten.{name} on a complex value is not converted (complex values become (real, "
                               f"imaginary) pairs for: {', '.join(PAIR_OPS)})")
        # torch's op on the inputs as they now are (pairs viewed as complex again): each rewrite is checked alone
        want = _as_pairs(node.target(**map_args(node.kwargs, self.torch_value)))
        allowed = handler(node, dict(node.kwargs))
        self.check(node, want, allowed)
        if _is_complex(before):
            self.pair.add(node)

    def mark(self, node: Node, before: Any) -> None:
        node.example = _as_pairs(before)
        if _is_complex(before):
            self.pair.add(node)

    def torch_value(self, node: Node) -> Any:
        """The value torch's complex op reads for `node` (a pair tensor viewed as complex again)."""
        if node in self.pair and isinstance(node.example, torch.Tensor):
            return torch.view_as_complex(node.example.contiguous())
        return node.example

    def check(self, node: Node, want: Any, allowed: float) -> None:
        """Compute `node` again on the examples; its value must be `want` (torch's, as pairs) within `allowed`."""
        node.example = node.target(**_example(node.kwargs))
        got = node.example
        if isinstance(want, torch.Tensor):
            ok = isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype and (
                float((got - want).abs().max()) <= allowed if got.numel() else True)
        elif isinstance(want, (list, tuple)):
            ok = isinstance(got, (list, tuple)) and len(got) == len(want) and all(
                g.shape == w.shape and torch.equal(g, w) for g, w in zip(got, want))
        else:
            ok = got == want
        if not ok:
            raise _Refused("its (real, imaginary) form does not reproduce torch's complex value on the example "
                           "inputs (an internal error of the complex rewrite)")

    # -- ops (each returns the allowed difference from torch, see the module docstring) -------------
    def op_view_as_complex(self, node: Node, k: Dict[str, Any]) -> float:
        self.set(node, aten.alias, self=k["self"])  # x.reshape(..., -1, 2) already is the pairs
        return 0.0

    def op_view_as_real(self, node: Node, k: Dict[str, Any]) -> float:
        self.set(node, aten.alias, self=k["self"])
        return 0.0

    def op_real(self, node: Node, k: Dict[str, Any]) -> float:
        self.set(node, aten.select, self=k["self"], dim=-1, index=0)
        return 0.0

    def op_imag(self, node: Node, k: Dict[str, Any]) -> float:
        self.set(node, aten.select, self=k["self"], dim=-1, index=1)
        return 0.0

    def op_conj(self, node: Node, k: Dict[str, Any]) -> float:
        z = k["self"]
        im = self.op(node, "neg", aten.neg, self=self.part(node, z, 1))
        self.set(node, aten.stack, tensors=[self.part(node, z, 0), im], dim=-1)
        return 0.0

    op__conj = op_conj_physical = op_conj

    def op_polar(self, node: Node, k: Dict[str, Any]) -> float:
        r, t = k["abs"], k["angle"]
        if self.is_pair(r) or self.is_pair(t):
            raise _Refused("polar of complex magnitudes or angles")
        re = self.op(node, "re", aten.mul, self=r, other=self.op(node, "cos", aten.cos, self=t))
        im = self.op(node, "im", aten.mul, self=r, other=self.op(node, "sin", aten.sin, self=t))
        self.set(node, aten.stack, tensors=[re, im], dim=-1)
        return 8 * _unit(node) * _largest(r)

    def op_mul(self, node: Node, k: Dict[str, Any]) -> float:
        a, b = k["self"], k["other"]
        if not self.is_pair(a):
            a, b = b, a
        if self.is_pair(b):
            a0, a1, b0, b1 = self.part(node, a, 0), self.part(node, a, 1), self.part(node, b, 0), self.part(node, b, 1)
            re = self.op(node, "re", aten.sub, self=self.op(node, "ac", aten.mul, self=a0, other=b0),
                         other=self.op(node, "bd", aten.mul, self=a1, other=b1))
            im = self.op(node, "im", aten.add, self=self.op(node, "ad", aten.mul, self=a0, other=b1),
                         other=self.op(node, "bc", aten.mul, self=a1, other=b0))
            self.set(node, aten.stack, tensors=[re, im], dim=-1)
            return 8 * _unit(node) * _largest(a) * _largest(b)
        self.set(node, aten.mul, self=a, other=self.real_operand(node, b))
        return 2 * _unit(node) * _largest(a) * _largest(b)

    def op_div(self, node: Node, k: Dict[str, Any]) -> float:
        if self.is_pair(k["other"]) or set(k) - {"self", "other"}:
            raise _Refused("division by a complex value (or with a rounding mode) is not converted")
        self.set(node, aten.div, self=k["self"], other=self.real_operand(node, k["other"]))
        return 0.0  # one rounded quotient per part, the same on both sides

    def real_operand(self, node: Node, value: Any) -> Any:
        """A real factor of a pair tensor: a tensor gets a last dimension of 1 (it scales both parts)."""
        example = value.example if isinstance(value, Node) else value
        if isinstance(example, torch.Tensor):
            if example.is_complex():
                raise _Refused("an operand is a complex tensor the rewrite did not produce")
            return self.op(node, "b", aten.unsqueeze, self=value, dim=-1)
        if isinstance(example, complex):
            raise _Refused("a Python complex number operand is not converted")
        return value

    def op_add(self, node: Node, k: Dict[str, Any]) -> float:
        if not (self.is_pair(k["self"]) and self.is_pair(k["other"])):
            raise _Refused("adding a real value to a complex one is not converted (only complex + complex)")
        self.set(node, aten.add, **k)
        return 0.0

    op_sub = op_add

    def op_permute(self, node: Node, k: Dict[str, Any]) -> float:
        dims = list(k["dims"])
        rank = len(dims)
        self.set(node, aten.permute, self=k["self"], dims=[_const(d, "dims") % rank for d in dims] + [rank])
        return 0.0

    def op_to(self, node: Node, k: Dict[str, Any]) -> float:
        dtype = k.get("dtype")
        source = k.get("self")
        if dtype is not None:
            if dtype in _REAL:
                k["dtype"] = _REAL[dtype]
            elif self.is_pair(source):
                raise _Refused(f"casting a complex value to {dtype} (dropping its imaginary part) is not converted")
        if "other" in k and self.is_pair(source) != self.is_pair(k["other"]):
            raise _Refused("casting between complex and real values is not converted")
        self.set(node, node.target, **k)
        return 0.0

    op__to_copy = op_to

    def op__assert_tensor_metadata(self, node: Node, k: Dict[str, Any]) -> float:
        if k.get("dtype") in _REAL:
            k["dtype"] = _REAL[k["dtype"]]
        if k.get("size") is not None:
            k["size"] = list(k["size"]) + [2]
        k.pop("stride", None)
        self.set(node, node.target, **k)
        return 0.0

    def op_shape(self, node: Node, k: Dict[str, Any]) -> float:
        """Shape ops: dimension arguments renumbered (negative ones count past the pairs), shapes get the 2."""
        name = _name(node)
        if name == "flatten":  # its default end_dim, -1, would flatten the pairs too
            k.setdefault("end_dim", -1)
        for key in _DIMS.get(name, ()):
            if key in k and k[key] is not None:
                k[key] = _renumber(k[key], key)
        if name in _SHAPES:
            key = _SHAPES[name]
            k[key] = list(k[key]) + [2]
        if name in ("cat", "stack") and not all(self.is_pair(t) for t in k["tensors"]):
            raise _Refused(f"{name} of complex and real tensors together is not converted")
        self.set(node, node.target, **k)
        return 0.0


def _renumber(value: Any, what: str) -> Any:
    """A dimension of a complex tensor as a dimension of its pairs (negative ones count one further)."""
    if isinstance(value, (list, tuple)):
        return type(value)(_renumber(v, what) for v in value)
    d = _const(value, what)
    return d - 1 if d < 0 else d


def _const(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Refused(f"its {what} must be known at conversion time on a complex value, got {value!r}")
    return value


def _unit(node: Node) -> float:
    """The unit roundoff of the node's (real) dtype: half the distance from 1 to the next number."""
    dtype = _REAL.get(node.example.dtype, node.example.dtype) if isinstance(node.example, torch.Tensor) else \
        torch.float32
    return torch.finfo(dtype).eps / 2


def _largest(value: Any) -> float:
    """max |value| (a pair tensor: of its parts; a number: itself)."""
    example = value.example if isinstance(value, Node) else value
    if isinstance(example, torch.Tensor):
        return float(example.abs().max()) if example.numel() else 0.0
    return abs(float(example))


def rewrite_complex(graph: Graph, root: bool = True,
                    layer: Callable[[str], bool] = lambda target: True) -> Tuple[List[str], List[str]]:
    """Rewrite every complex value of `graph` (in place) as (real, imaginary) pairs (see the module docstring).

    Args:
        graph: a traced program (torch.export's aten ops by argument name).
        root: the model's own program (its inputs and outputs are the Cell's: a complex input stays a MindSpore
            complex tensor, a complex output made as pairs is refused); False for a module program of the
            module-structured conversion, whose callers pass and receive pairs.
        layer: whether a module call's target (a "module" node's) is a MindSpore layer rather than a generated
            module (a layer cannot take or return pairs: such a call is refused). Default: every call is a layer
            (the flat trace's module calls are mapped layers only).

    Returns:
        (notes, problems): a note naming the complex ops rewritten (none if there were none), one problem per
        complex op not converted.
    """
    rewriter = _Rewriter(graph, layer)
    problems = rewriter.run(root)
    rewritten = [n for n in graph.nodes if "(as real pairs:" in n.display]
    ops = sorted({n.display.split(" (as real pairs")[0] for n in rewritten})
    scopes = sorted({f"{n.scope} ({n.scope_type})" if n.scope else "the root module" for n in rewritten})
    notes = [f"{', '.join(scopes)}: complex values computed as (real, imaginary) pairs in a last dimension of 2 "
             f"({', '.join(ops)})"] if ops else []
    return notes, problems
