"""The op dispatcher: every MindSpore op on a DTensor arrives here (via `DTensor.__fallback__`).

For an op it (1) normalises the call into its tensor inputs, (2) asks the op's sharding rule
for the input layouts it needs and the output layouts it produces, (3) redistributes the
inputs through the run's collectives (recorded), (4) fans out inputs that are replicated along
mesh axes the op runs sharded over (their gradients are summed over those axes in backward),
and (5) runs the real op once per distinct shard this process holds, or once over all of them
stacked when the op batches (`batched`). An op without a rule runs
on replicated inputs and is recorded as a replication fallback. Ops that write into operands
(in-place ops, Assign, BatchNorm's moving statistics) run by their out-of-place rule and the
written values go back to what the caller passed (`mutation`). A failing op raises
`DTensorOpError` naming it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from mindspore import Parameter, Tensor, ops
from mindspore._c_expression import NoFallbackGuard
from mindspore.graph.api import _pynative_executor
from mindspore.ops.primitive import Primitive

from mindspore_hyper import bfloat16_emulation
from mindspore_hyper.comm.collective_cause import grad_sync_cause, op_cause, set_cause
from mindspore_hyper.comm.gradient_identity import cast_with_gradient_to
from mindspore_hyper.dtensor import mutation, shard_hints
from mindspore_hyper.dtensor import random as random_ops
from mindspore_hyper.dtensor.batched import run_batched
from mindspore_hyper.dtensor.dtensor import DTensor, Key, is_float, key_of, significant_axes
from mindspore_hyper.dtensor.meta import MetaTensor, meta
from mindspore_hyper.dtensor.op_cost import op_flops
from mindspore_hyper.dtensor.padded_storage import stored_piece
from mindspore_hyper.dtensor.rank_local import rank_local_decision
from mindspore_hyper.dtensor.rules.registry import RULES, UNEVEN, Decision
from mindspore_hyper.dtensor.shape_registry import infer as infer_shapes
from mindspore_hyper.shard.tensor_layout import TensorLayout
from mindspore_hyper.units import itemsize

__all__ = ["DTensorOpError", "OpCall", "dispatch", "dispatch_getitem", "dispatch_setitem", "execute",
           "replicated_decision", "replicated_dtensor", "distribute"]

# Ops that inspect type only (same answer on every shard): run once on one shard, return as is.
TYPE_QUERIES = ("typeof",)
# Dtype casts (`ops.cast`, `Tensor.astype`/`.to`): a parameter's cast is named after it in collective causes.
CASTS = ("Cast", "ToDtype")


class DTensorOpError(RuntimeError):
    """An op on DTensors failed or is refused; the message starts with the MindSpore op name."""

    def __init__(self, op_name: str, message: str):
        super().__init__(f"{op_name}: {message}")
        self.op_name = op_name


@dataclass
class OpCall:
    """A normalised op call: `inputs` are the op's operands (tensors replaced by DTensors;
    a list operand such as Concat's stays a list); `tensors` lists the DTensors in order and
    `sources` what the caller passed for each (a DTensor, Parameter or plain Tensor)."""

    name: str
    func: Callable
    inputs: List[Any]
    kwargs: Dict[str, Any]
    prim: Optional[Primitive] = None
    prim_name: Optional[str] = None
    tensors: List[DTensor] = field(default_factory=list)
    sources: List[Any] = field(default_factory=list)
    # whether the shards may be MetaTensors (a dry run's shape-only execution); False skips the
    # check on every shard's run; None (an OpCall made outside `dispatch`): checked
    shape_only: Optional[bool] = None

    def run(self, local_inputs: Sequence[Any], local_kwargs: Optional[Dict[str, Any]] = None):
        """Run the real op on plain local tensors (keyword tensors localised in `local_kwargs`);
        on shape-only shards (a dry run's MetaTensors) infer its outputs by its shape rule."""
        kwargs = self.kwargs if local_kwargs is None else local_kwargs
        if self.shape_only is not False and (_holds_meta(local_inputs) or _holds_meta(kwargs.values())):
            args = (self.prim, self.prim_name, tuple(local_inputs)) if self.prim is not None else tuple(local_inputs)
            return infer_shapes(self.func, args, kwargs, name=self.name)
        with NoFallbackGuard():
            if self.prim is not None:
                return self.func(self.prim, self.prim_name, tuple(local_inputs))
            return self.func(*local_inputs, **kwargs)

    @functools.cached_property
    def attrs(self) -> Dict[str, Any]:
        """The primitive's attributes (a copy, made once per call: rules and the cost read it)."""
        return dict(self.prim.attrs) if self.prim is not None else {}

    def replace_tensors(self, new: Sequence[DTensor]) -> None:
        """Put `new[i]` where the i-th DTensor operand was (by position, so one DTensor used
        twice can take two layouts)."""
        supply = iter(new)
        self.inputs = [_swap(v, supply) for v in self.inputs]
        self.kwargs = {k: _swap(v, supply) for k, v in self.kwargs.items()}
        self.tensors = list(new)


def _holds_meta(values) -> bool:
    return any(isinstance(v, MetaTensor) or (isinstance(v, (list, tuple)) and _holds_meta(v)) for v in values)


def _swap(value, supply):
    """`value` with each DTensor in it replaced by the next of `supply` (a module-level function:
    a nested one that calls itself would keep the op's tensors in a reference cycle)."""
    if isinstance(value, DTensor):
        return next(supply)
    if isinstance(value, (list, tuple)) and any(isinstance(x, DTensor) for x in value):
        return type(value)(_swap(x, supply) for x in value)
    return value


# -- turning operands into DTensors --------------------------------------------------------------

def distribute(execution, tensor: Tensor, layout: TensorLayout, record: bool = False) -> DTensor:
    """Lay a global tensor out by `layout` in `execution` (differentiable local slicing; Partial
    axes get the value on coordinate 0 and zeros elsewhere for sum, copies for avg/max/min). A
    dimension the layout does not divide is cut into torch.chunk pieces (`shard.chunking`).

    Raises:
        ValueError: the tensor's rank differs from the layout's.
    """
    if isinstance(tensor, DTensor):
        return tensor.redistribute(layout)
    tensor = _shape_only(execution, tensor)
    global_shape = tuple(tensor.shape)
    layout.check_shape(global_shape, uneven=True)
    replicated = TensorLayout.replicated(layout.mesh, len(global_shape))
    source = DTensor._create(replicated, {(): tensor}, global_shape, tensor.dtype, execution)
    return source.redistribute(layout, record=record)


def parameter_dtensor(execution, param: Parameter) -> DTensor:
    """The DTensor of a model Parameter in this forward. A global Parameter (simulation) is
    sliced when an op first reads it, so hooks that bring its data in just before its Cell runs
    (HyperOffload's) compose; a local one (msrun) is its own shard."""
    pid = id(param)
    if pid not in execution.parameter_dtensors:
        slot = execution.parameters[pid]
        if slot.param.has_init and not execution.shape_only:
            # built under no_init_parameters() and read by an op before its Cell ran (which would
            # have initialised it): initialised now, on first use; a dry run never initialises
            slot.param.init_data()
        with execution.uncounted():  # parameter shards are not activations
            if slot.local:  # the Parameter stores the shard (padded where a piece would be empty: padded_storage)
                axes = significant_axes(slot.layout)
                shards = {key_of(execution.mesh.coords(r), axes): stored_piece(
                    param, slot.layout.shard_shape(slot.global_shape, execution.mesh.coords(r)))
                    for r in execution.local_ranks}
                dt = DTensor._create(slot.layout, shards, slot.global_shape, param.dtype, execution)
            else:
                def make_shards():
                    # a device's own piece, in the parameter's dtype wherever it is first read (a running
                    # Cell's mixed-precision type would cast the slicing ops' outputs)
                    with execution.uncounted(), bfloat16_emulation.outside_cells():
                        return distribute(execution, param, slot.layout).shards

                dt = DTensor._lazy(slot.layout, make_shards, slot.global_shape, param.dtype, execution)
        dt._parameter_id = pid
        execution.parameter_dtensors[pid] = dt
    return execution.parameter_dtensors[pid]


def _mesh_of(values):
    for v in values:
        if isinstance(v, DTensor):
            return v.execution
        if isinstance(v, (list, tuple)):
            found = _mesh_of(v)
            if found is not None:
                return found
    return None


def replicated_dtensor(execution, tensor: Tensor) -> DTensor:
    """A plain (global) tensor as a DTensor replicated on every device of `execution`. In a
    dry run the shard of a host constant of the model code (not a Parameter, not lazily
    initialised) keeps it as `MetaTensor.constant` (ring attention recognises causal masks by it)."""
    shard = _shape_only(execution, tensor)
    if shard is not tensor and not isinstance(tensor, Parameter) and getattr(tensor, "has_init", True) is False:
        shard.constant = tensor
    return DTensor._create(TensorLayout.replicated(execution.mesh, shard.ndim), {(): shard}, shard.shape,
                           shard.dtype, execution)


def _shape_only(execution, tensor: Tensor) -> Tensor:
    """`tensor` as a MetaTensor in a shape-only execution (a dry run never reads a value or a
    weight); else itself. The stand-in of a trainable Parameter the run lays out carries its
    gradient path; another Parameter (of another model, e.g. another pipeline stage's) gets no
    gradient from this run's backward, as in the simulation."""
    if not execution.shape_only or isinstance(tensor, MetaTensor):
        return tensor
    trained = isinstance(tensor, Parameter) and tensor.requires_grad and id(tensor) in execution.parameters
    return meta(tuple(tensor.shape), tensor.dtype, grad_path=trained)


def _as_dtensor(execution, value):
    if isinstance(value, DTensor):
        if value.layout.mesh != execution.mesh:
            raise ValueError(f"an op mixes DTensors of different meshes: {value.layout.mesh} vs {execution.mesh}")
        if value.execution.job_ranks != execution.job_ranks:
            raise ValueError(f"an op mixes DTensors of meshes on different devices (the job's ranks "
                             f"{value.execution.job_ranks} vs {execution.job_ranks}); move one first")
        return value
    if isinstance(value, Tensor):
        param = execution.laid_out_parameter(value)
        if param is not None:
            return parameter_dtensor(execution, param)
        return replicated_dtensor(execution, value)
    return value


def _normalise(execution, func, args, kwargs) -> OpCall:
    name = getattr(func, "name", type(func).__name__)
    prim = prim_name = None
    if len(args) == 3 and isinstance(args[0], Primitive) and isinstance(args[1], str) and isinstance(args[2], tuple):
        prim, prim_name, inputs = args[0], args[1], list(args[2])
    else:
        inputs = list(args)
    call = OpCall(name, func, [], dict(kwargs), prim, prim_name, shape_only=execution.shape_only)

    def convert(value):
        converted = _as_dtensor(execution, value)
        if isinstance(converted, DTensor):
            call.tensors.append(converted)
            call.sources.append(value)
        return converted

    for value in inputs:
        if isinstance(value, (list, tuple)) and any(isinstance(v, Tensor) for v in value):
            call.inputs.append(type(value)(convert(v) for v in value))
        else:
            call.inputs.append(convert(value))
    for key, value in kwargs.items():  # tensors passed by keyword: laid out and localised too
        call.kwargs[key] = convert(value)
    return call


# -- dispatch ------------------------------------------------------------------------------------

def dispatch(execution, func, args, kwargs):
    """Entry point from `DTensor.__fallback__` (and plain-Tensor calls with DTensor operands).
    What the op moves is recorded as caused by it (`collective_cause`; `execute` names the input)."""
    owner = _mesh_of(list(args) + list(kwargs.values()))
    if owner is not None:
        execution = owner
    call = _normalise(execution, func, args, kwargs)
    if not call.tensors:
        with NoFallbackGuard():
            return func(*args, **kwargs)
    execution.accounting.record_op(call.name, call.tensors)
    previous = set_cause(f"op {call.name}")
    try:
        return _dispatch(execution, call)
    finally:
        set_cause(previous)


def _dispatch(execution, call: OpCall):
    if execution.context_attention is not None:  # attention across the sequence axis (dtensor/context_parallel)
        attention = execution.context_attention(execution, call)
        if attention is not None:
            return attention
    if call.name in TYPE_QUERIES:
        coords = execution.mesh.coords(execution.local_ranks[0])
        return call.run(_localise(call.inputs, dict(enumerate(coords))))
    if random_ops.draw_kind(call) is not None:  # the single device's draw, sliced (dtensor/random.py)
        return _dispatch_random(execution, call)
    written = mutation.mutation_of(call)
    originals = list(call.tensors)
    hint = shard_hints.take(execution, call.name, len(call.tensors))
    if hint is not None:
        call.replace_tensors([t if layout is None else _hinted(t, layout) for t, layout in zip(call.tensors, hint)])
    decision = rank_local_decision(call) or _decide(execution, call, written.rule if written is not None else call.name)
    if written is not None and not _covers_all_axes(decision, written.targets):
        execution.accounting.record_fallback(call.name)
        decision = replicated_decision(call)
    if any(t._uneven for t in call.tensors) and not decision.inputs[0].is_rank_local:
        _check_uneven(call, decision, written.rule if written is not None else call.name)
    if execution.observer is not None:
        execution.observer(call, decision)
    result = execute(execution, call, decision, private=written.targets if written is not None else ())
    if call.name in CASTS and isinstance(result, DTensor):  # a parameter's cast (LayerNorm's, amp's) keeps its name
        result._cast_of = _parameter_of(originals[0])
        result._cast_exact = _holds_parameter_value(execution, originals[0])
    return result if written is None else _write_back(execution, call, written, originals, result)


def _write_back(execution, call: OpCall, written: mutation.Mutation, originals: List[DTensor], result):
    """Give what the caller passed the values the op wrote; returns what the caller gets."""
    if written.from_result:
        first = result if isinstance(result, DTensor) else result[0]
        _wait(call, first)
        return mutation.write_back(execution, call.sources[0], originals[0], first)
    for i in written.targets:
        _wait(call, call.tensors[i])
        mutation.write_back(execution, call.sources[i], originals[i], call.tensors[i])
    return result


def _wait(call: OpCall, written: DTensor) -> None:
    """Wait for the kernels that wrote `written`: a written operand aliases its input's memory,
    so a kernel that failed asynchronously would leave the old values readable, silently."""
    for shard in written.shards.values():
        if isinstance(shard, MetaTensor):
            continue
        try:
            shard.data_sync(True)
        except Exception as error:
            raise _op_error(call, error) from error


def _decide(execution, call: OpCall, rule_name: str) -> Decision:
    """The rule's decision, or the replicated one (recorded) when there is no rule or it
    declines; keyword tensors always take the replicated path (rules read positional ones)."""
    tensor_kwargs = any(isinstance(v, DTensor) for v in call.kwargs.values())
    rule = RULES.get(rule_name) if not tensor_kwargs else None
    try:
        decision = rule(call) if rule is not None else None
    except Exception as error:  # a rule that cannot read the call is a bug: say which op
        raise DTensorOpError(call.name, f"sharding rule {rule_name!r} failed on inputs "
                                        f"{_describe(call)}: {error}") from error
    if decision is None:
        execution.accounting.record_fallback(call.name)
        decision = replicated_decision(call)
    return decision


def _check_uneven(call: OpCall, decision: Decision, rule_name: str) -> None:
    """An op whose decision keeps a dimension split into uneven pieces runs only by a rule that
    is right on them (`rules.registry.UNEVEN`).

    Raises:
        DTensorOpError: otherwise, naming the op, the input and the dimension.
    """
    for i, (t, layout) in enumerate(zip(call.tensors, decision.inputs)):
        dims = layout.uneven_dims(t.global_shape)
        if not dims:
            continue
        check = UNEVEN.get(RULES.get(rule_name))
        reason = check(call, decision) if check is not None else \
            ("its sharding rule needs every device's shard to have the same shape; redistribute it to Replicate() "
             "along that dimension, or use a size the devices divide")
        if reason is None:
            return
        d = dims[0]
        raise DTensorOpError(call.name, f"input {i} of shape {tuple(t.global_shape)} has dimension {d} split into "
                                        f"uneven pieces over {layout.shard_count(d)} devices (torch.chunk: the "
                                        f"trailing devices hold fewer rows); {reason}")


def _covers_all_axes(decision: Decision, targets) -> bool:
    """Each written operand is split over every mesh axis the op runs over (no two runs of the
    op write one shared shard)."""
    axes = set().union(*[significant_axes(layout) for layout in decision.inputs])
    return all(set(significant_axes(decision.inputs[i])) == axes for i in targets)


def _describe(call: OpCall) -> str:
    return ", ".join(f"{tuple(t.shape)} {t.dtype} {t.layout.tensor_map}"
                     f"{' partial ' + repr(t.layout.partial) if t.layout.is_partial else ''}" for t in call.tensors)


def _hinted(t: DTensor, layout: TensorLayout) -> DTensor:
    """`t` as the primitive's `.shard()` asks; moved only if the op's rule then keeps that layout
    (`execute` redistributes from `t` itself, so a gather can take over the gradient sum)."""
    if layout == t.layout:
        return t
    with t.execution.uncounted():  # moved only when used, and then counted as moved
        view = DTensor._lazy(layout, lambda: t.redistribute(layout).shards, t.global_shape, t.dtype, t.execution)
    view._hint_source = t
    return view


def replicated_decision(call: OpCall) -> Decision:
    """Gather every input to a full replica, run once, return replicated outputs."""
    mesh = call.tensors[0].layout.mesh
    return Decision(inputs=[TensorLayout.replicated(mesh, t.ndim) for t in call.tensors], outputs=None)


def execute(execution, call: OpCall, decision: Decision, private: Sequence[int] = (), any_op: bool = False):
    """Redistribute inputs per `decision`, fan out replicated inputs of a sharded op, and run
    the op once per distinct output shard this process holds. The inputs at positions
    `private` (operands the op writes), and for such an op every input cut out of a batched
    op's stack, get copies of their shards first: a shard may be a view of a caller's tensor or
    of a stack, and MindSpore's in-place kernels refuse views. `any_op`: bfloat16 emulated
    whatever the op (`_emulation`)."""
    axes = sorted(set().union(*[significant_axes(layout) for layout in decision.inputs]))
    ready = []
    for i, (t, layout) in enumerate(zip(call.tensors, decision.inputs)):
        fan = [a for a in axes if a not in significant_axes(layout)] if is_float(t.dtype) else []
        if t._hint_source is not None and t._pending is not None:
            t = t._hint_source  # not moved yet: move the original straight to the layout the op needs
        if layout == t.layout and not fan:
            ready.append(t)
        else:
            previous = set_cause(op_cause("redistribute for", call.name, i, _cell_of(execution, call)))
            try:
                t, fan = _sum_parameter_first(execution, t, fan)
                # moved and anchored in its own dtype, as msrun's transports move it (a running Cell's
                # mixed-precision type would cast the package's copies and anchors, some and not others)
                with bfloat16_emulation.outside_cells():
                    moved, fused = t.redistribute_with_fusion(layout, grad_partial_axes=fan)
                    fan = [a for a in fan if a not in fused]
                    if fan:  # a parameter's gradient summed over devices it is replicated on: its grad sync
                        slot = execution.parameters.get(_parameter_of(t))
                        set_cause(grad_sync_cause(slot.param.name) if slot is not None else
                                  op_cause("gradient sum for", call.name, i, _cell_of(execution, call)))
                    ready.append(_fan_out(execution, moved, fan) if fan else moved)
            finally:
                set_cause(previous)
        if i in private or (private and ready[-1]._stacked is not None):  # in-place kernels refuse views
            ready[-1] = DTensor._create(layout, {k: ops.deepcopy(_read(ready[-1], k)) for k in ready[-1].shards},
                                        t.global_shape, t.dtype, execution)
    call.replace_tensors(ready)
    mesh = execution.mesh
    keys = execution.keys(axes)
    emulate = _emulation(execution, call, any_op)
    if execution.batch_shards and emulate is None and all(t._gradient_to is None for t in ready):
        batched_result = run_batched(execution, call, decision, axes, keys)
        if batched_result is not None:
            _record_cost(execution, call, batched_result)
            return batched_result
    results = {}
    try:
        for key in keys:
            coords = dict(zip(axes, key))
            execution.set_running(coords)
            results[key] = _run_local(call, decision, coords, emulate)
    finally:
        execution.set_running(None)
    try:
        result = _assemble(execution, results, axes, decision, mesh, call)
    except DTensorOpError:
        raise
    except Exception as error:  # MindSpore runs kernels asynchronously: their errors surface here
        raise _op_error(call, error) from error
    _record_cost(execution, call, result)
    return result


def _emulation(execution, call: OpCall, any_op: bool) -> Optional[str]:
    """How the op runs on bfloat16 (flag cpu_bfloat16; `bfloat16_emulation.emulation`): an op without
    a bfloat16 CPU kernel, or whose backward lacks one, or with `any_op` any op (a random op: the
    float32 run's draw), per shard on float32 copies; None: MindSpore's kernel. Other ops: one set
    lookup."""
    if execution.shape_only or not (any_op or call.name in bfloat16_emulation.EMULATED):
        return None
    dtypes = [t.dtype for t in call.tensors]
    if any_op:
        return bfloat16_emulation.emulated_kernel(dtypes)
    return bfloat16_emulation.emulation(call.name, dtypes, (t.global_shape for t in call.tensors))  # read lazily


def _parameter_of(t: DTensor) -> Optional[int]:
    """The id of the model Parameter `t` lays out or is a cast of, else None."""
    return t._parameter_id if t._parameter_id is not None else t._cast_of


def _cell_of(execution, call: OpCall) -> str:
    """The Cell path of the first model parameter (or its cast) among the op's inputs
    ("layers.0.fc1" for "layers.0.fc1.weight"), "" when none: where in the model the op runs,
    for collective causes."""
    for t in call.tensors:
        slot = execution.parameters.get(_parameter_of(t))
        if slot is not None:
            return slot.param.name.rpartition(".")[0] or slot.param.name
    return ""


def _record_cost(execution, call: OpCall, result) -> None:
    """Account one device's FLOPs and bytes of the op (`op_cost`), from its local shapes."""
    outs = [r for r in (result if isinstance(result, (tuple, list)) else [result]) if isinstance(r, DTensor)]
    in_shapes = [_shard_shape(t) for t in call.tensors]
    out_shapes = [_shard_shape(r) for r in outs]
    nbytes = sum(math.prod(s) * t.dtype.itemsize for s, t in zip(in_shapes, call.tensors)) + \
        sum(math.prod(s) * r.dtype.itemsize for s, r in zip(out_shapes, outs))
    flops = op_flops(call.name, call.inputs, in_shapes, out_shapes, call.attrs)
    execution.accounting.record_compute(call.name, flops, nbytes)


def _shard_shape(t: DTensor):
    """The shape of `t`'s shard on one device (the largest, for uneven shards)."""
    return t.layout.max_local_shape(t.global_shape) if t._uneven else t.layout.local_shape(t.global_shape)


def _dispatch_random(execution, call: OpCall):
    """A random op on DTensors: every device gets its part of the values one device draws with
    the same seed (`dtensor/random.py`): Dropout draws its mask for the global shape and masks
    each shard; other random ops run once on their gathered inputs (a replication fallback; a
    result shaped like the first input is then split as it was); in-place random ops are refused."""
    kind = random_ops.draw_kind(call)
    if kind == "inplace":
        raise DTensorOpError(call.name, random_ops.inplace_refusal(call.name))
    hint = shard_hints.take(execution, call.name, len(call.tensors))  # a Dropout.shard(...) layout
    if kind == "mask" and call.prim is not None and call.inputs and call.inputs[0] is call.tensors[0] \
            and len(call.tensors) == 1 and not call.kwargs:
        x = call.tensors[0] if not hint or hint[0] is None else call.tensors[0].redistribute(hint[0])
        try:
            return random_ops.apply_dropout(call, x, call.run)
        except DTensorOpError:
            raise
        except Exception as error:
            raise _op_error(call, error) from error
    execution.accounting.record_fallback(call.name)
    first = call.tensors[0]
    result = execute(execution, call, replicated_decision(call), any_op=True)  # bfloat16: the float32 run's draw
    if isinstance(result, DTensor) and result.global_shape == first.global_shape and not first.layout.is_partial:
        return result.redistribute(first.layout)  # an elementwise draw keeps its input's split (local slices)
    return result


def _run_local(call: OpCall, decision: Decision, coords, emulate: Optional[str] = None):
    """The op on the shards at `coords`; `emulate` (`bfloat16_emulation.emulation`): on float32
    copies, bfloat16 outputs."""
    local_inputs = _localise(call.inputs, coords)
    local_kwargs = dict(zip(call.kwargs, _localise(list(call.kwargs.values()), coords)))

    def run(inputs, kwargs):
        if decision.local_fn is not None:
            return decision.local_fn(call, inputs, coords)
        if decision.local_args is not None:
            inputs = decision.local_args(inputs, coords)
        return call.run(inputs, kwargs)

    try:
        if emulate is not None:
            return bfloat16_emulation.run_in_float32(run, local_inputs, local_kwargs, emulate)
        return run(local_inputs, local_kwargs)
    except DTensorOpError:
        raise
    except Exception as error:
        raise _op_error(call, error) from error


def _op_error(call: OpCall, error: Exception) -> DTensorOpError:
    _drain_pipeline()
    text = str(error).split("C++ Call Stack")[0]  # MindSpore's message without its C++ stack
    lines = [line.strip(" -=") for line in text.splitlines() if line.strip(" -=")]
    summary = " ".join(lines[:2]) if lines else repr(error)
    hint = bfloat16_emulation.refusal_hint(text)
    cast = bfloat16_emulation.cell_cast_dtype()
    where = f" (in a Cell whose mixed-precision type casts float inputs to {cast})" if cast is not None else ""
    return DTensorOpError(call.name, f"failed on the shards of DTensors {_describe(call)}{where}: {summary}{hint}")


def _drain_pipeline() -> None:
    """MindSpore 2.10 raises an asynchronous kernel failure again on later, unrelated ops until
    its op pipeline is synchronised; synchronise it so the failure is reported once (here)."""
    try:
        _pynative_executor.sync()
    except Exception:  # the same failure, being reported by the caller
        pass


def _sum_parameter_first(execution, t: DTensor, fan: List[int]) -> Tuple[DTensor, List[int]]:
    """(`t`, `fan`) with a model parameter's gradient sum over the `fan` axes `t` is replicated
    on taken before `t` is redistributed: `t` a parameter, or a cast of one with its layout
    (MindSpore's LayerNorm's, a bfloat16 compute copy's), passes the runtime's parameter hook
    along those axes, and the rest of `fan` (axes the redistribution's gathers may take over) is
    returned. Summed after the move instead, the sum would be a plain collective of the moved
    copy run in every micro-batch's backward (under msrun `k` sums a step with gradient
    accumulation, the runtime's one deferred sum a step otherwise), over the moved copy's bytes
    and in the compute dtype.

    The hook's node runs in the parameter's own dtype, outside the running Cell's
    mixed-precision cast (`to_float`), so the sum is taken on the parameter's gradient (float32
    for float32 master weights). A cast to a narrower dtype keeps its value; each device's read of
    it sends its gradient to the parameter's hooked shard, cast back as Cast's backward casts it
    (`_gradient_to`, `_read`), so the devices' contributions are summed in the parameter's dtype
    in simulation too (autograd adds them at the hook's node), as under msrun."""
    slot = _summed_parameter(execution, t)
    recast = slot is None
    if recast:
        slot = _cast_parameter(execution, t)
    if slot is None:
        return t, fan
    first = [a for a in fan if a not in significant_axes(t.layout)]
    if not first:
        return t, fan
    rest = [a for a in fan if a not in first]
    with bfloat16_emulation.outside_cells():
        if not recast:
            return _fan_out(execution, t, first, slot), rest
        hooked = _fan_out(execution, parameter_dtensor(execution, slot.param), first, slot)
        if execution.shape_only:  # a dry run: the hook recorded the sum; no values to route
            return t, rest
        with execution.uncounted():  # the same bytes as `t`
            out = DTensor._create(t.layout, dict(t.shards), t.global_shape, t.dtype, execution)
    out._cast_of, out._cast_exact, out._gradient_to = t._cast_of, True, hooked
    return out, rest


def _summed_parameter(execution, t: DTensor):
    """The slot of the model parameter whose gradient `t`'s gradient adds to as it is: `t`
    lays the parameter out, or is a cast of it to its own dtype with its layout (the cast's
    backward an identity); None otherwise."""
    if execution.parameter_fan_out is None:
        return None
    if t._parameter_id is not None:
        return execution.parameters.get(t._parameter_id)
    slot = execution.parameters.get(t._cast_of) if t._cast_of is not None else None
    if slot is None or t.dtype != slot.param.dtype or t.layout != slot.layout:
        return None
    return slot


def _cast_parameter(execution, t: DTensor):
    """The slot of the model parameter `t` is a cast of to a narrower float dtype (a bfloat16 or
    float16 compute copy of a float32 weight), with its layout, from its own value (not from a
    rounded copy: cast again from the parameter it is the same value); None otherwise (a widening
    cast's gradient is summed in its wider dtype, after the move)."""
    if execution.parameter_fan_out is None or not t._cast_exact:
        return None
    slot = execution.parameters.get(t._cast_of)
    if slot is None or t.layout != slot.layout:
        return None
    if not (is_float(t.dtype) and itemsize(t.dtype) < itemsize(slot.param.dtype)):
        return None
    return slot


def _holds_parameter_value(execution, t: DTensor) -> bool:
    """Whether `t` holds a model parameter's value exactly: the parameter, or an exact cast of
    it to the parameter's own dtype."""
    if t._parameter_id is not None:
        return True
    slot = execution.parameters.get(t._cast_of) if t._cast_exact else None
    return slot is not None and t.dtype == slot.param.dtype


def _fan_out(execution, t: DTensor, fan: List[int], slot=None) -> DTensor:
    """`t` read by an op sharded over mesh axes `fan` along which `t` is replicated: each
    distinct shard passes the backend's fan-out (identity forward, gradients summed over the
    group in backward); a model parameter's gradient sum (`t` the parameter, or `slot` the
    parameter `t`'s gradient adds to) goes through the runtime's hook."""
    axes = significant_axes(t.layout)
    if slot is None and t._parameter_id is not None:
        slot = execution.parameters.get(t._parameter_id)
    shards = {}
    for key, shard in t.shards.items():
        group = execution.group(fan, dict(zip(axes, key)))
        if slot is not None and execution.parameter_fan_out is not None:
            shards[key] = execution.parameter_fan_out(shard, group, slot)
        else:
            shards[key] = execution.collectives.fan_out(shard, group)
    with execution.uncounted():  # the same bytes as `t`
        out = DTensor._create(t.layout, shards, t.global_shape, t.dtype, execution)
    out._parameter_id, out._cast_of, out._cast_exact = t._parameter_id, t._cast_of, t._cast_exact
    return out


def _read(t: DTensor, key: Key) -> Tensor:
    """`t`'s shard `key` as one device's op reads it: with `_gradient_to` a read of its own,
    whose gradient goes to that DTensor's shard (cast to its dtype), not to `t`'s."""
    shard = t.shards[key]
    return shard if t._gradient_to is None else cast_with_gradient_to(shard, t._gradient_to.shards[key])


def _localise(values, coords):
    """The shards at mesh coordinates `coords` of the DTensors in `values` (nested lists kept)."""
    out = []
    for v in values:
        if isinstance(v, DTensor):
            out.append(_read(v, tuple(coords[a] for a in significant_axes(v.layout))))
        elif isinstance(v, (list, tuple)) and any(isinstance(x, DTensor) for x in v):
            out.append(type(v)(_localise(v, coords)))
        else:
            out.append(v)
    return out


def _assemble(execution, results: Dict[tuple, Any], axes: List[int], decision: Decision, mesh, call: OpCall):
    uneven = any(t._uneven for t in call.tensors)
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
        elif callable(layouts):  # a layout by output rank (rank-local results)
            layout = layouts(sample.ndim)
        else:
            layout = layouts[i] if isinstance(layouts, (list, tuple)) else layouts
        out_axes = significant_axes(layout)
        if not set(out_axes) <= set(axes):
            raise AssertionError(f"sharding rule bug: output axes {out_axes} not among input axes {axes}")
        shards = {}
        for key, value in results.items():
            value = value[i] if isinstance(first, (tuple, list)) else value
            shards.setdefault(key_of(dict(zip(axes, key)), out_axes), value)
        if uneven and layout.is_rank_local:
            global_shape = tuple(sample.shape)
        elif uneven:
            global_shape = uneven_global_shape(call, layout, shards, out_axes, i)
        else:
            global_shape = tuple(n * layout.shard_count(d) for d, n in enumerate(sample.shape))
        out = DTensor._create(layout, shards, global_shape, sample.dtype, execution)
        out._uneven = out._uneven or (uneven and layout.is_rank_local)
        outputs.append(out)
    if isinstance(first, (tuple, list)):
        return type(first)(outputs)
    return outputs[0]


def uneven_global_shape(call: OpCall, layout: TensorLayout, shards: Dict[tuple, Tensor], out_axes, index: int):
    """The global shape of output `index` of an op on uneven shards: a dimension split like a
    dimension of an input (the same mesh axes) whose torch.chunk pieces every held shard
    matches has that input dimension's size; a dimension whose shards (all held) all have one
    size is that size times its shard count.

    Raises:
        DTensorOpError: no size gives the shards' shapes (naming the op and the dimension).
    """
    coords = [dict(zip(out_axes, key)) for key in shards]
    sample = next(iter(shards.values()))
    shape = []
    for d, entry in enumerate(layout.dims):
        sizes = [s.shape[d] for s in shards.values()]
        if not entry:
            shape.append(sample.shape[d])
            continue
        candidates = [t.global_shape[e] for t in call.tensors for e, t_entry in enumerate(t.layout.dims)
                      if t_entry == entry]
        found = next((n for n in candidates
                      if all(layout.dim_bounds(d, n, c)[1] == size for c, size in zip(coords, sizes))), None)
        holds_all = len(shards) == math.prod(layout.mesh.device_matrix[a] for a in out_axes)
        if found is None and holds_all and len(set(sizes)) == 1:  # every piece seen, all one size
            found = sizes[0] * layout.shard_count(d)
        if found is None:
            raise DTensorOpError(call.name, f"output {index} dimension {d} is split over uneven shards of sizes "
                                            f"{sizes} that no input dimension's torch.chunk pieces give; "
                                            "redistribute the input to Replicate() along it first")
        shape.append(found)
    return tuple(shape)


def dispatch_getitem(execution, dt: DTensor, index):
    """`dt[index]`: basic indices (ints, slices, None, Ellipsis) by the indexing rule; tensor
    indices (DTensors or plain, alone or in a tuple) run replicated."""
    from mindspore_hyper.dtensor.rules.indexing import getitem_decision

    call = OpCall("getitem", lambda x, idx: x[idx], [dt], {}, tensors=[dt], sources=[dt])
    items = index if isinstance(index, tuple) else (index,)
    converted = []
    for item in items:
        if isinstance(item, Tensor):
            source, item = item, _as_dtensor(execution, item)
            call.tensors.append(item)
            call.sources.append(source)
        converted.append(item)
    call.inputs.append(tuple(converted) if isinstance(index, tuple) else converted[0])
    execution.accounting.record_op(call.name, call.tensors)
    # uneven pieces (torch.chunk): the indexing rule's offsets assume equal shards; index the gathered value
    decision = getitem_decision(call) if len(call.tensors) == 1 and not dt._uneven else None
    if decision is None:
        execution.accounting.record_fallback("getitem")
        decision = replicated_decision(call)
    return execute(execution, call, decision)


def dispatch_setitem(execution, dt: DTensor, index, value) -> None:
    """`dt[index] = value`: the assignment runs on the gathered value, which is then laid out
    again by `dt`'s layout (and written back to the Parameter `dt` lays out, if any)."""
    execution.accounting.record_op("setitem")
    execution.accounting.record_fallback("setitem")
    previous = set_cause("op setitem (gathered, assigned, laid out again)")
    try:
        whole = ops.deepcopy(dt.full_tensor())
        whole[index] = value  # DTensor indices or values are read by their gathered values
        mutation.write_back(execution, dt, dt, distribute(execution, whole, dt.layout))
    finally:
        set_cause(previous)
