"""The op dispatcher: every MindSpore op on a DTensor arrives here (via `DTensor.__fallback__`).

For an op it (1) normalises the call into its tensor inputs, (2) asks the op's sharding rule
for the input layouts it needs and the output layouts it produces, (3) redistributes the
inputs (simulated collectives, recorded), and (4) runs the real op once per distinct shard.
An op without a rule runs on replicated inputs and is recorded as a replication fallback.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from mindspore import Parameter, Tensor
from mindspore._c_expression import NoFallbackGuard
from mindspore.ops.primitive import Primitive

from mindspore_hyper.shard.tensor_layout import TensorLayout
from mindspore_hyper.sim.accounting import Accounting, active_accounting, use_accounting
from mindspore_hyper.sim.dtensor import DTensor, _is_float, distribute_tensor, key_of, significant_axes
from mindspore_hyper.sim.rules.registry import RULES, Decision
from mindspore_hyper.sim import shard_hints

__all__ = ["OpCall", "dispatch", "dispatch_getitem", "parameter_layouts", "parameter_dtensors", "running_ranks"]

# Parameter identity -> (Parameter, layout) for the current forward (set by the simulated model),
# and the DTensors made from them, lazily at first use: a Parameter is sliced when an op first
# reads it, so hooks that bring its data in just before its Cell runs (HyperOffload) compose.
parameter_layouts: Dict[int, tuple] = {}
parameter_dtensors: Dict[int, DTensor] = {}
_running: Optional[Tuple[Any, Dict[int, int]]] = None  # (mesh, coords) of the shard an op runs on

# Ops that inspect type only (same answer on every shard): run once on one shard, return as is.
TYPE_QUERIES = ("typeof",)


@dataclass
class OpCall:
    """A normalised op call: `inputs` are the op's operands (tensors replaced by DTensors;
    a list operand such as Concat's stays a list); `tensors` lists the DTensors in order."""

    name: str
    func: Callable
    inputs: List[Any]
    kwargs: Dict[str, Any]
    prim: Optional[Primitive] = None
    prim_name: Optional[str] = None
    tensors: List[DTensor] = field(default_factory=list)

    def run(self, local_inputs: Sequence[Any], local_kwargs: Optional[Dict[str, Any]] = None):
        """Run the real op on plain local tensors (keyword tensors localised in `local_kwargs`)."""
        with NoFallbackGuard():
            if self.prim is not None:
                return self.func(self.prim, self.prim_name, tuple(local_inputs))
            return self.func(*local_inputs, **(self.kwargs if local_kwargs is None else local_kwargs))

    @property
    def attrs(self) -> Dict[str, Any]:
        return dict(self.prim.attrs) if self.prim is not None else {}


def _mesh_of(values) -> Optional[Any]:
    for v in values:
        if isinstance(v, DTensor):
            return v.layout.mesh
        if isinstance(v, (list, tuple)):
            mesh = _mesh_of(v)
            if mesh is not None:
                return mesh
    return None


def _as_dtensor(value, mesh):
    if isinstance(value, DTensor):
        if value.layout.mesh != mesh:
            raise ValueError(f"an op mixes DTensors of different meshes: {value.layout.mesh} vs {mesh}")
        return value
    if isinstance(value, Parameter) and id(value) in parameter_layouts:
        if id(value) not in parameter_dtensors:
            param, layout = parameter_layouts[id(value)]
            with use_accounting(Accounting(layout.mesh.size)):  # parameter shards are not activations
                dt = distribute_tensor(param, layout)
                dt._parameter_id = id(param)
                parameter_dtensors[id(value)] = dt
        return parameter_dtensors[id(value)]
    if isinstance(value, Tensor):
        return DTensor._create(TensorLayout.replicated(mesh, value.ndim), {(): value}, value.shape, value.dtype)
    return value


def _normalise(func, args, kwargs) -> OpCall:
    name = getattr(func, "name", type(func).__name__)
    prim = prim_name = None
    if len(args) == 3 and isinstance(args[0], Primitive) and isinstance(args[1], str) and isinstance(args[2], tuple):
        prim, prim_name, inputs = args[0], args[1], list(args[2])
    else:
        inputs = list(args)
    mesh = _mesh_of(list(inputs) + list(kwargs.values()))
    call = OpCall(name, func, [], dict(kwargs), prim, prim_name)
    for value in inputs:
        if isinstance(value, (list, tuple)) and any(isinstance(v, Tensor) for v in value):
            converted = type(value)(_as_dtensor(v, mesh) for v in value)
            call.tensors.extend(v for v in converted if isinstance(v, DTensor))
        else:
            converted = _as_dtensor(value, mesh)
            if isinstance(converted, DTensor):
                call.tensors.append(converted)
        call.inputs.append(converted)
    for key, value in kwargs.items():  # tensors passed by keyword: laid out and localised too
        converted = _as_dtensor(value, mesh)
        if isinstance(converted, DTensor):
            call.tensors.append(converted)
        call.kwargs[key] = converted
    return call


def dispatch(func, args, kwargs):
    """Entry point from `DTensor.__fallback__`."""
    call = _normalise(func, args, kwargs)
    if not call.tensors:
        with NoFallbackGuard():
            return func(*args, **kwargs)
    if call.name in TYPE_QUERIES:
        first_key = {a: 0 for t in call.tensors for a in significant_axes(t.layout)}
        return call.run(_localise(call.inputs, first_key))
    hint = shard_hints.take(call.name, len(call.tensors))
    if hint is not None:
        _apply_hint(call, hint)
    tensor_kwargs = any(isinstance(v, DTensor) for v in call.kwargs.values())
    rule = RULES.get(call.name) if not tensor_kwargs else None  # rules read positional tensors only
    decision = rule(call) if rule is not None else None
    if decision is None:
        active_accounting().record_fallback(call.name)
        decision = replicated_decision(call)
    return execute(call, decision)


def _apply_hint(call: OpCall, layouts: Sequence[Optional[TensorLayout]]) -> None:
    """Redistribute the inputs to a primitive's `.shard()` layouts before its rule runs."""
    mapping = {}
    for t, layout in zip(call.tensors, layouts):
        if layout is not None:
            mapping[id(t)] = t.redistribute(layout)
    _substitute(call, mapping)


def _substitute(call: OpCall, mapping: Dict[int, DTensor]) -> None:
    def swap(v):
        if isinstance(v, DTensor):
            return mapping.get(id(v), v)
        if isinstance(v, (list, tuple)):
            return type(v)(swap(x) for x in v)
        return v

    call.inputs = [swap(v) for v in call.inputs]
    call.kwargs = {k: swap(v) for k, v in call.kwargs.items()}
    call.tensors = [mapping.get(id(t), t) for t in call.tensors]


def replicated_decision(call: OpCall) -> Decision:
    """Gather every input to a full replica, run once, return replicated outputs."""
    mesh = call.tensors[0].layout.mesh
    return Decision(inputs=[TensorLayout.replicated(mesh, t.ndim) for t in call.tensors], outputs=None)


def execute(call: OpCall, decision: Decision):
    """Redistribute inputs per `decision` and run the op once per distinct output shard."""
    mapping = {}
    ready = []
    for t, layout in zip(call.tensors, decision.inputs):
        r = t.redistribute(layout)
        mapping[id(t)] = r
        ready.append(r)
    _substitute(call, mapping)
    mesh = ready[0].layout.mesh
    axes = sorted(set().union(*[significant_axes(t.layout) for t in ready]))
    _record_gradient_fanout(ready, axes)
    sizes = [mesh.device_matrix[a] for a in axes]
    results = {}
    global _running
    try:
        for key in itertools.product(*[range(n) for n in sizes]):
            coords = dict(zip(axes, key))
            _running = (mesh, coords)
            local_inputs = _localise(call.inputs, coords)
            if decision.local_fn is not None:
                results[key] = decision.local_fn(call, local_inputs, coords)
            else:
                if decision.local_args is not None:
                    local_inputs = decision.local_args(local_inputs, coords)
                local_kwargs = dict(zip(call.kwargs, _localise(list(call.kwargs.values()), coords)))
                results[key] = call.run(local_inputs, local_kwargs)
    finally:
        _running = None
    return _assemble(results, axes, decision, mesh)


def running_ranks() -> Optional[List[int]]:
    """While an op runs on one distinct shard: the ranks that run it (the others along the axes
    it is not split over hold replicas); None outside."""
    if _running is None:
        return None
    mesh, coords = _running
    return [r for r in mesh.ranks if all(mesh.coords(r)[a] == c for a, c in coords.items())]


def _record_gradient_fanout(ready: List[DTensor], axes: List[int]) -> None:
    """An input replicated along axes the op runs sharded over gets its gradient summed over
    them in backward: an AllReduce per activation, once per step for a parameter."""
    accounting = active_accounting()
    for t in ready:
        fanout = set(axes) - set(significant_axes(t.layout))
        if not fanout or not _is_float(t.dtype):
            continue
        if t._parameter_id is not None:
            accounting.param_fanout.setdefault(t._parameter_id, set()).update(fanout)
            continue
        mesh = t.layout.mesh
        n = math.prod(mesh.device_matrix[a] for a in fanout)
        nbytes = t.local_nbytes
        name = "+".join(mesh.alias_names[a] for a in sorted(fanout))
        accounting.record_comm("AllReduce", name, 2 * nbytes * (n - 1) // n, nbytes, backward=True)


def _localise(values, coords):
    out = []
    for v in values:
        if isinstance(v, DTensor):
            out.append(v.shards[tuple(coords[a] for a in significant_axes(v.layout))])
        elif isinstance(v, (list, tuple)) and any(isinstance(x, DTensor) for x in v):
            out.append(type(v)(_localise(v, coords)))
        else:
            out.append(v)
    return out


def _assemble(results: Dict[tuple, Any], axes: List[int], decision: Decision, mesh):
    first = next(iter(results.values()))
    flat_first = first if isinstance(first, (tuple, list)) else [first]
    layouts = decision.outputs
    outputs = []
    for i, sample in enumerate(flat_first):
        if not isinstance(sample, Tensor):
            outputs.append(sample)
            continue
        if layouts is None:
            layout = TensorLayout.replicated(mesh, sample.ndim)
        else:
            layout = layouts[i] if isinstance(layouts, (list, tuple)) else layouts
        out_axes = significant_axes(layout)
        if not set(out_axes) <= set(axes):
            raise AssertionError(f"sharding rule bug: output axes {out_axes} not among input axes {axes}")
        shards = {}
        for key, value in results.items():
            value = value[i] if isinstance(first, (tuple, list)) else value
            shards.setdefault(key_of(dict(zip(axes, key)), out_axes), value)
        global_shape = tuple(n * layout.shard_count(d) for d, n in enumerate(sample.shape))
        outputs.append(DTensor._create(layout, shards, global_shape, sample.dtype))
    if isinstance(first, (tuple, list)):
        return type(first)(outputs)
    return outputs[0]


def dispatch_getitem(dt: DTensor, index):
    """`dt[index]` for basic indexing (ints, slices, None, Ellipsis); tensor indices fall back."""
    from mindspore_hyper.sim.rules.indexing import getitem_decision

    call = OpCall("getitem", lambda x, idx: x[idx], [dt, index], {}, tensors=[dt])
    decision = getitem_decision(call)
    if decision is None:
        active_accounting().record_fallback("getitem")
        decision = replicated_decision(call)
    return execute(call, decision)
