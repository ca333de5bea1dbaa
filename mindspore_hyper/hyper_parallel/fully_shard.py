"""`fully_shard`: torch FSDP2's and HyperParallel's fully sharded data parallelism.

Each Parameter of the Cell is split along its first dimension over the data-parallel mesh (on
top of any tensor-parallel layout it already has: the data-parallel pieces are cut from each
tensor-parallel piece, torch's StridedShard order). Rows the mesh does not divide are split as
torch's FSDP2 and upstream's fully_shard split them (torch.chunk, upstream's ceil-chunk geometry):
ceil(rows / devices) each, the trailing devices fewer or none. Under msrun each process's Parameter
is its piece as it is (5 rows over 2 processes: 3 and 2), so are its gradient and the optimizer's
states; the padding to equal pieces lives only inside the gathers and reduce-scatters
(`dtensor.padded_collectives`). A process whose piece is empty (5 rows over 4: 2, 2, 1, 0) stores
one zero row in its place (`dtensor.padded_storage`: MindSpore's optimizers cannot hold a Parameter
of 0 elements); its DTensor piece is empty, and checkpoints hold no row of it. While the Cell runs,
its Parameters read as
DTensors gathered over the data-parallel mesh; the gather's backward reduce-scatters the
gradient. Optimizers built on `trainable_params()` then update the shards: under msrun each
process holds and updates only its piece (parameters, gradients and optimizer states all split:
ZeRO-3); in simulation the global Parameter stands for all of them.

Gradient reduction follows torch: when the Cell's inputs are each rank's own plain tensors (under
msrun), a rank's loss is its own batch's and the gradient is averaged over the data-parallel
ranks. In simulation such inputs are the same on every rank, so the one computation is already
that average. Inputs that are DTensors split over the data-parallel mesh describe one global
batch: its loss is global and its gradient is summed, as every DTensor op sums.

Mixed precision (`mp_policy=MixedPrecisionPolicy(param_dtype=, reduce_dtype=, output_dtype=,
cast_forward_inputs=)`, torch FSDP2's semantics, `fully_shard_policies.py`): the sharded Parameter
keeps its dtype (float32 master weights); the gathered copy is cast to `param_dtype` after the
gather, so the Cell computes in `param_dtype`, the gradient comes back through the cast in the
Parameter's dtype and the gather's backward reduce-scatters it in that dtype (`reduce_dtype`
float32 for float32 Parameters); the sharded gradient is float32. The gather moves float32 (twice
torch's bfloat16 all-gather bytes; the values are the same, as the cast commutes with the gather).
On CPU, bfloat16 compute needs `cpu_bfloat16="emulate"` (bfloat16_emulation.py). A global batch
(DTensor inputs split over the data-parallel mesh) with a `param_dtype` cast is refused: its
ranks' gradients would be summed at the bfloat16 copy's fan-out, in bfloat16, not in `reduce_dtype`.

`set_requires_gradient_sync(False)` (torch FSDP2's gradient accumulation, `hsdp_module.py`): the
gathers of forwards run while it is off reduce nothing in their backward; each rank's gradients
add up unsynchronised and the first backward with it on reduces the sum once
(`grad_accumulation.py`, style "deferred").
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Dict, Optional, Tuple

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mindspore_hyper.dtensor.dtensor import DTensor, is_float, significant_axes
from mindspore_hyper.hyper_parallel.device_mesh import DeviceMesh, get_current_mesh
from mindspore_hyper.hyper_parallel.distribute import lay_out_parameter, local_values, wrap_construct
from mindspore_hyper.hyper_parallel.fully_shard_policies import FLOAT_DTYPES, check_policies, compute_dtype
from mindspore_hyper.hyper_parallel.grad_accumulation import GradAccumulation
from mindspore_hyper.hyper_parallel.host_device import on_host
from mindspore_hyper.hyper_parallel.hsdp_module import HSDPModule
from mindspore_hyper.hyper_parallel.main_grad import accumulate_on_main_grad
from mindspore_hyper.hyper_parallel.session import mesh_of, prepare_elsewhere, remember_mesh, runtime_of
from mindspore_hyper.shard.placement import Replicate
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["fully_shard", "FSDPModule"]


@functools.lru_cache(maxsize=None)
def _gradient_scaler(scale: float):
    """Identity forward; the backward multiplies the gradient by `scale`. A primitive
    (`InsertGradientOf`), not a custom-bprop Cell: torch-style `loss.backward()`
    (autograd_compat.py) cannot run a Cell's bprop outside `mindspore.value_and_grad`."""

    def scaled(dout):
        return dout * scale

    return ops.InsertGradientOf(scaled)


class FSDPModule:
    """What `fully_shard` / `hsdp` record on a Cell (`cell.fsdp_state`): the Parameters it
    shards, and how their gradient is reduced.

    Attributes:
        mesh: the mesh the Cell's hooks run on.
        gathered: id(param) -> (param, the layout it is used in while the Cell runs, the mesh
            axes it is split over).
        reduce: "avg" (torch's FSDP: per-rank losses averaged) or "sum" (HyperParallel's hsdp).
        grad_scale: a factor on the reduced gradient (hsdp's `grad_scale`).
        mp_policy: fully_shard's MixedPrecisionPolicy (checked), or None (no casts).
        reduce_dtype: hsdp's: the dtype a floating Parameter's gradient is reduced in (cast
            there and back), or None (its own).
        accumulation: the Cell's GradAccumulation (`grad_accumulation.py`: gradients summed
            without synchronisation), or None (every backward synchronises).
    """

    def __init__(self, mesh: DeviceMesh, gathered: Dict[int, Tuple[Parameter, TensorLayout, Tuple[int, ...]]],
                 reduce: str = "avg", grad_scale: float = 1.0, mp_policy=None, reduce_dtype=None):
        self.mesh = mesh
        self.reduce_dtype = reduce_dtype
        self.gathered = gathered
        self.reduce = reduce
        self.grad_scale = grad_scale
        self.mp_policy = mp_policy
        self.accumulation: Optional[GradAccumulation] = None


def _sharded_layout(layout: TensorLayout, dp_axes: Tuple[int, ...]) -> TensorLayout:
    """`layout` with dimension 0 further split over `dp_axes` (after its own axes: torch's order)."""
    dims = [tuple(entry) for entry in layout.dims]
    used = set(layout.sharded_axes()) | set(layout.partial)
    clash = used & set(dp_axes)
    if clash:
        names = [layout.mesh.alias_names[a] for a in sorted(clash)]
        raise ValueError(f"fully_shard: the parameter is already laid out over mesh dimension {names}")
    dims[0] = dims[0] + tuple(dp_axes)
    return TensorLayout.from_dims(layout.mesh, dims, layout.partial)


def fully_shard(module: nn.Cell, *, mesh: Optional[DeviceMesh] = None, reshard_after_forward: bool = True,
                mp_policy=None, offload_policy=None, ignored_params=None, replicate_params=None) -> nn.Cell:
    """Shard `module`'s Parameters over the data-parallel `mesh` (see module docstring).

    Apply it bottom-up (blocks first, then the root), as with torch: a Parameter already managed
    by an inner `fully_shard` is left to it.

    Args:
        module: the Cell (changed in place and returned).
        mesh: the data-parallel mesh, one dimension (or a sub-mesh such as `mesh["dp"]`); default
            the current mesh.
        reshard_after_forward: True (the default) or False: upstream frees the gathered
            Parameters after the forward (True) or keeps them for the backward (False), a
            memory/communication trade with the same values; here they live until the backward
            releases them either way.
        mp_policy, offload_policy: upstream's policies (`fully_shard_policies.py`):
            `OffloadPolicy()` (no offload) is taken, CPU offload refused; a `MixedPrecisionPolicy`
            acts as torch's (module docstring: compute in `param_dtype`, gradients reduced and
            kept in the Parameters' dtype, `output_dtype` and `cast_forward_inputs` casts);
            `apply_grad_on_fp32_main_grad=True` adds each backward's reduced gradients onto
            `param.main_grad` (`main_grad.py`).
        ignored_params: Parameters to leave unsharded.
        replicate_params: upstream's Parameters kept whole on every rank; None or empty only.

    Returns:
        `module`, whose class gains `HSDPModule` (upstream's per-Cell settings).

    Raises:
        ValueError: an unsupported argument, or a Parameter already split over the mesh; when the
            Cell runs, a global batch with a `param_dtype` cast (module docstring).
    """
    mesh = mesh if mesh is not None else get_current_mesh()
    check_policies(mp_policy, offload_policy, {p.dtype for p in module.get_parameters()})
    if replicate_params:
        raise ValueError(f"fully_shard(replicate_params=[{len(replicate_params)} Parameters]): keeping chosen "
                         "Parameters whole inside a sharded Cell is not supported yet; pass them as ignored_params "
                         "or wrap them in their own Cell")
    if not isinstance(reshard_after_forward, bool):
        raise ValueError(f"fully_shard(reshard_after_forward={reshard_after_forward!r}): expected a bool (resharding "
                         "to a smaller group after the forward is not supported)")
    if getattr(module, "fsdp_state", None) is not None:
        raise ValueError(f"fully_shard: {type(module).__name__} is already fully sharded")
    state = shard_parameters(module, mesh, lambda slot: tuple(mesh.dims), ignored_params, reduce="avg",
                             mp_policy=mp_policy)
    state.accumulation = GradAccumulation("deferred")  # set_requires_gradient_sync (hsdp_module.py)
    if mp_policy is not None and mp_policy.apply_grad_on_fp32_main_grad:
        skip = {id(p) for p in (ignored_params or ())} | {  # ignored, or an inner fully_shard Cell's
            id(p) for _, cell in module.cells_and_names() if cell is not module
            and getattr(cell, "fsdp_state", None) is not None for p in cell.get_parameters()}
        for param in module.get_parameters():
            if id(param) not in skip:
                accumulate_on_main_grad(param)
    if not isinstance(module, HSDPModule):
        module.__class__ = type(f"HSDP{type(module).__name__}", (HSDPModule, type(module)), {})
    return module


def shard_parameters(module: nn.Cell, mesh: DeviceMesh, axes_of: Callable, ignored_params=None, *,
                     reduce: str = "avg", grad_scale: float = 1.0, threshold_bytes: int = 0,
                     mp_policy=None, reduce_dtype=None) -> FSDPModule:
    """Split each Parameter of `module` (not managed by an inner Cell, not ignored, holding at least
    `threshold_bytes`) along dimension 0 over the mesh axes `axes_of(slot)`, and gather it while
    the Cell runs (see module docstring), cast as `mp_policy` (a checked MixedPrecisionPolicy or
    None) says, its gradient reduced in `reduce_dtype` (hsdp's; None: its own dtype); records and
    returns the Cell's FSDPModule."""
    execution = mesh.execution()
    ignored = {id(p) for p in (ignored_params or ())}
    managed = set()
    for _, cell in module.cells_and_names():
        state = getattr(cell, "fsdp_state", None)
        if state is not None:
            managed |= set(state.gathered)
    gathered: Dict[int, Tuple[Parameter, TensorLayout, Tuple[int, ...]]] = {}
    for _, param in list(module.parameters_and_names()):
        if id(param) in ignored or id(param) in managed:
            continue
        if id(param) not in execution.parameters:
            param = lay_out_parameter(module, param, mesh, (Replicate(),) * mesh.ndim)
        slot = execution.parameters[id(param)]
        axes = tuple(axes_of(slot))
        if not param.shape or not axes or math.prod(slot.global_shape) * param.dtype.itemsize < threshold_bytes:
            # a scalar, a Parameter under the threshold, or rows no group divides stays whole; under
            # hsdp ("sum") its gradient is still summed over the data-parallel group, as upstream's
            if reduce == "sum":
                gathered[id(param)] = (param, slot.layout, ())
                prepare_elsewhere(param)
            continue
        used_layout = slot.layout
        new_layout = _sharded_layout(slot.layout, axes)
        new_layout.check_shape(tuple(slot.global_shape), uneven=True)  # torch.chunk pieces, as FSDP2
        with on_host():  # its piece holds values even inside MindSpore's DeviceCtx("meta") (MindFormers')
            param = _reshard(module, execution, slot, new_layout, mesh)
        gathered[id(param)] = (param, used_layout, axes)
        prepare_elsewhere(param)
    state = FSDPModule(mesh, gathered, reduce, grad_scale, mp_policy, reduce_dtype)
    object.__setattr__(module, "fsdp_state", state)
    plain_inputs = []
    input_dtype = mp_policy.param_dtype if mp_policy is not None and mp_policy.cast_forward_inputs else None
    output_dtype = mp_policy.output_dtype if mp_policy is not None else None

    def note_inputs(cell, inputs, mesh):
        plain_inputs[:] = [not any(isinstance(x, DTensor) for x in inputs)]
        return _cast_floats(inputs, input_dtype)

    def local_outputs(cell, outputs, mesh):  # plain tensors in, plain tensors out (torch's FSDP)
        outputs = local_values(outputs) if plain_inputs and plain_inputs[0] else outputs
        return _cast_floats(outputs, output_dtype)

    wrap_construct(module, mesh, note_inputs, local_outputs, prepare=lambda inputs: _gather(execution, state, inputs))
    return state


def _cast_floats(values, dtype):
    """`values` (a tensor or DTensor, or a tuple/list of them, nested) with each floating tensor
    cast to `dtype` (torch FSDP2's input and output casts); None: unchanged."""
    if dtype is None:
        return values
    if isinstance(values, (tuple, list)):
        return type(values)(_cast_floats(v, dtype) for v in values)
    if isinstance(values, Tensor) and any(values.dtype is f for f in FLOAT_DTYPES) and values.dtype is not dtype:
        return ops.cast(values, dtype)
    return values


def _reshard(module: nn.Cell, execution, slot, layout: TensorLayout, mesh: DeviceMesh) -> Parameter:
    """Give `slot` the `layout`; under msrun its Parameter is replaced by the new piece."""
    old_param = slot.param
    previous = mesh_of(old_param)
    if previous is not None and (previous.root != mesh.root or previous.members != mesh.members):
        raise ValueError(f"fully_shard: parameter {old_param.name!r} is laid out on another root mesh "
                         f"{previous!r}; take both meshes as views of one (init_device_mesh(..., ('dp', 'tp')))")
    dims = sorted(set(previous.dims if previous is not None else ()) | set(mesh.dims))
    view = mesh.view(tuple(dims))
    if slot.local:
        coords = layout.mesh.coords(execution.local_ranks[0])
        rows = slot.global_shape[0]
        held = slot.layout.dim_bounds(0, rows, coords)[0]  # where the old piece starts
        start, length = layout.dim_bounds(0, rows, coords)  # torch.chunk piece: the trailing ones shorter
        value = old_param.asnumpy()[start - held:start - held + length]
        if length == 0:  # an empty piece: one zero row stands for it (padded_storage; no optimizer holds 0 elements)
            value = np.zeros((1,) + value.shape[1:], value.dtype)
        new_param = Parameter(Tensor(value.copy(), dtype=old_param.dtype), name=old_param.name,
                              requires_grad=old_param.requires_grad)
        for _, cell in module.cells_and_names():
            for key, held in list(cell._params.items()):
                if held is old_param:
                    cell._params[key] = new_param
        del execution.parameters[id(old_param)]
        slot.param = new_param
        execution.parameters[id(new_param)] = slot
    slot.layout = layout
    remember_mesh(slot.param, view)
    return slot.param


def _gather(execution, state: FSDPModule, inputs) -> Dict[int, DTensor]:
    """The DTensors this Cell's Parameters read while it runs: gathered over their axes, the
    backward reducing the gradient as `state` says (module docstring):
    - inputs that are DTensors split over the axes (one global batch): the gradient sums, x grad_scale;
    - plain inputs under msrun (each rank's own batch): reduce-scattered, then x grad_scale, and
      averaged for "avg";
    - plain inputs in simulation (the same batch on every rank, computed once): x grad_scale, and
      x the group size for "sum" (what that many equal ranks would sum).
    With `state.mp_policy`'s `param_dtype`, the gathered (and scaled) DTensor is then cast to it:
    the gather and its backward's reduction stay in the Parameter's dtype (module docstring).
    With `state.accumulation` engaged, the backward first adds the gradient to this rank's running
    sum (`grad_accumulation.py`); while its sync is off the reduction is left out. With
    `state.reduce_dtype` the shard is cast to it before the gather and the gathered copy back
    after it (and the replicas' fan-out), so those reductions run in `reduce_dtype`.

    Raises:
        ValueError: a global batch (DTensor inputs split over the group) with a `param_dtype` cast
            or a `reduce_dtype` other than the Parameter's.
        NotImplementedError: gradient accumulation in the dry run (no values to accumulate)."""
    from mindspore_hyper.dtensor.dispatch import parameter_dtensor

    runtime = runtime_of(execution)
    holds_all = runtime.holds_all_ranks()
    out = {}
    for pid, (param, layout, axes) in state.gathered.items():
        # hsdp over fewer devices than the data-parallel group (shard_size, or rows the group does
        # not divide): the Parameter is also replicated over the group's other axes, whose ranks'
        # gradients are summed too (upstream's all-reduce over the unsharded group)
        replicas = [a for a in state.mesh.dims if a not in axes and a not in significant_axes(layout)]
        size = math.prod(execution.mesh.device_matrix[a] for a in list(axes) + replicas)
        # a DTensor batch split over the group (its split or its replica axes) is one global batch
        global_batch = any(isinstance(x, DTensor) and set(significant_axes(x.layout)) & set(axes + tuple(replicas))
                           for x in inputs)
        per_rank = not global_batch and not holds_all
        accumulate = state.accumulation is not None and state.accumulation.engaged()
        if accumulate and not runtime.computes_values():
            raise NotImplementedError(
                f"dry run: {param.name!r}'s gradient is accumulated across backwards (hsdp(enable_grad_accumulation="
                "True), or fully_shard's set_requires_gradient_sync(False)): its running sums are values the dry "
                "run does not hold or report; dry-run the step with every backward synchronised (the same gathers "
                "and reductions) or run it in simulation at a size this machine holds")
        syncing = not accumulate or state.accumulation.sync  # off: no reduction in this backward
        scale = state.grad_scale
        if not global_batch:
            scale *= (1.0 / size if state.reduce == "avg" else 1.0) if per_rank else \
                (size if state.reduce == "sum" else 1.0)
        sharded = parameter_dtensor(execution, param)
        reduce_dtype = state.reduce_dtype if state.reduce_dtype not in (None, param.dtype) and is_float(
            param.dtype) else None
        if reduce_dtype is not None:
            if global_batch:
                raise ValueError(f"hsdp(reduce_dtype={reduce_dtype}): the inputs are DTensors split over the "
                                 f"data-parallel mesh (one global batch), whose ranks' gradients of {param.name!r} "
                                 f"are summed by the ops reading it, in {param.dtype}, not in {reduce_dtype}; pass "
                                 "each rank's plain batch or leave reduce_dtype None")
            sharded = ops.cast(sharded, reduce_dtype)
        gathered = sharded.redistribute(layout, grad_partial_axes=axes if per_rank and syncing else ())
        if per_rank and replicas and syncing:  # identity forward; the backward all-reduces over the replicas
            keys = significant_axes(layout)
            gathered = DTensor._create(layout, {k: execution.collectives.fan_out(v, execution.group(
                replicas, dict(zip(keys, k)))) for k, v in gathered.shards.items()}, gathered.global_shape,
                gathered.dtype, execution)
        if reduce_dtype is not None:
            gathered = ops.cast(gathered, param.dtype)
        if accumulate:  # the backward adds the (scaled) gradient to this rank's running sum first
            rank = tuple(execution.local_ranks)
            gathered = DTensor._create(layout, {k: state.accumulation.add(v, (pid, rank, k), syncing)
                                                for k, v in gathered.shards.items()},
                                       gathered.global_shape, gathered.dtype, execution)
        if scale != 1.0:
            scaler = _gradient_scaler(scale)
            gathered = DTensor._create(layout, {k: scaler(v) for k, v in gathered.shards.items()},
                                       gathered.global_shape, gathered.dtype, execution)
        gathered._parameter_id = pid
        dtype = compute_dtype(state.mp_policy, param.dtype)
        if dtype is not param.dtype:
            if global_batch:
                raise ValueError(f"fully_shard(mp_policy.param_dtype={dtype}): the inputs are DTensors split over the "
                                 f"data-parallel mesh (one global batch), whose ranks' gradients of {param.name!r} "
                                 f"would be summed in {dtype}, not in the reduce dtype {param.dtype}; pass each "
                                 f"rank's plain batch (torch's FSDP2 inputs) or leave param_dtype None")
            gathered = ops.cast(gathered, dtype)  # the dispatcher's Cast: the copy is named as the Parameter's cast
        out[pid] = gathered
    return out
