"""Laying tensors and Cells out on a DeviceMesh: distribute_tensor, distribute_module, factories.

A Cell's Parameter laid out on a mesh stays a MindSpore Parameter (so `trainable_params()`,
optimizers and checkpoints see it as usual): in simulation the global one, under msrun this
process's shard (it replaces the global Parameter in the Cell, equal on every process to rank
0's initial value). While the Cell runs, its laid-out Parameters read as DTensors, and an op
that meets one beside a DTensor treats it as that DTensor.
"""
from __future__ import annotations

import functools
import math
from types import SimpleNamespace
from typing import Callable, Dict, Optional, Sequence

from mindspore import Parameter, Tensor, nn, ops

from mindspore_hyper.dtensor.dispatch import distribute, parameter_dtensor
from mindspore_hyper.dtensor.dtensor import DTensor, layout_on
from mindspore_hyper.hyper_parallel.device_mesh import DeviceMesh, get_current_mesh
from mindspore_hyper.hyper_parallel.host_device import check_not_meta, on_host
from mindspore_hyper.hyper_parallel.session import is_prepared_elsewhere, mesh_of, remember_mesh, runtime_of
from mindspore_hyper.shard.placement import Replicate, Shard

__all__ = ["distribute_tensor", "distribute_module", "lay_out_parameter", "laid_out_parameters", "wrap_construct",
           "local_values",
           "zeros", "ones", "full", "empty", "rand", "randn"]


def _mesh(device_mesh: Optional[DeviceMesh]) -> DeviceMesh:
    mesh = device_mesh if device_mesh is not None else get_current_mesh()
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"device_mesh: expected a DeviceMesh (init_device_mesh), got {type(mesh).__name__}")
    return mesh


def _placements(mesh: DeviceMesh, placements) -> tuple:
    return tuple(placements) if placements is not None else (Replicate(),) * mesh.ndim


def distribute_tensor(tensor: Tensor, device_mesh: Optional[DeviceMesh] = None, placements=None, *,
                      src_data_rank: Optional[int] = 0) -> DTensor:
    """Lay the global `tensor` out on `device_mesh` by `placements` (default: the current mesh,
    replicated). Every rank takes its piece of the same global value: in simulation exactly; under
    msrun the value of the device at index `src_data_rank` of the rank's group along the mesh's
    dimensions (broadcast first; torch's meaning), or each process's own when None. A dimension
    the placements do not divide is split as torch.chunk splits it (ceil(n / k) per rank, the
    trailing ranks fewer or none).

    Raises:
        ValueError: bad placements, a tensor rank the placements do not fit, or a src_data_rank
            outside the group.
    """
    mesh = _mesh(device_mesh)
    if isinstance(tensor, DTensor):
        raise ValueError("distribute_tensor: the tensor is already a DTensor; use .redistribute(device_mesh, placements)")
    if src_data_rank is not None and (isinstance(src_data_rank, bool) or not isinstance(src_data_rank, int)
                                      or not 0 <= src_data_rank < mesh.size()):
        raise ValueError(f"distribute_tensor: src_data_rank={src_data_rank!r}; expected a rank of the mesh's group "
                         f"(0..{mesh.size() - 1}) or None")
    layout = layout_on(mesh, _placements(mesh, placements), tensor.ndim)
    execution = mesh.execution()
    if src_data_rank is not None and len(execution.local_ranks) == 1 and mesh.size() > 1:
        tensor = _broadcast(execution, mesh, tensor, src_data_rank)
    out = distribute(execution, tensor, layout)
    out._device_mesh = mesh
    return out


def _broadcast(execution, mesh: DeviceMesh, tensor: Tensor, source: int) -> Tensor:
    """This process's `tensor` replaced by that of the device at index `source` of its group along
    `mesh`'s dimensions (torch's src_data_rank: a group rank; a sub-mesh broadcasts within each of
    its groups, e.g. each "tp" group from its own first device)."""
    from mindspore_hyper.comm.collectives import AxisGroup

    local = execution.local_ranks[0]
    ranks = tuple(execution.mesh.axis_group(local, list(mesh.dims)))
    group = AxisGroup("+".join(mesh.mesh_dim_names), ranks, (ranks.index(local),), records=False)
    return execution.collectives.broadcast([tensor], source, group)[0]


# -- factories -------------------------------------------------------------------------------------

def _no_grad(requires_grad: bool) -> None:
    if requires_grad:
        raise ValueError("requires_grad=True: MindSpore differentiates with respect to Parameters; make a Parameter "
                         "of the global value and lay it out with distribute_module / parallelize_module")


def _factory(make: Callable[[tuple, object], Tensor]):
    def factory(*size, dtype=None, device_mesh: Optional[DeviceMesh] = None, placements=None,
                requires_grad: bool = False) -> DTensor:
        import mindspore as ms

        _no_grad(requires_grad)
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in shape):
            raise ValueError(f"size={size!r}: expected non-negative ints")
        return distribute_tensor(make(shape, dtype or ms.float32), device_mesh, placements, src_data_rank=None)

    return factory


zeros = _factory(lambda shape, dtype: ops.zeros(shape, dtype))
ones = _factory(lambda shape, dtype: ops.ones(shape, dtype))
empty = _factory(lambda shape, dtype: ops.zeros(shape, dtype))


def full(size, fill_value, *, dtype=None, device_mesh: Optional[DeviceMesh] = None, placements=None,
         requires_grad: bool = False) -> DTensor:
    """A DTensor of `size` filled with `fill_value`."""
    import mindspore as ms

    _no_grad(requires_grad)
    return distribute_tensor(ops.full(tuple(size), fill_value, dtype=dtype or ms.float32), device_mesh, placements,
                             src_data_rank=None)


def _random(kind: str):
    def factory(*size, dtype=None, device_mesh: Optional[DeviceMesh] = None, placements=None,
                requires_grad: bool = False) -> DTensor:
        """Random values drawn once for the global shape (the same global tensor in every mode and
        world size for one seed: each rank then takes its piece)."""
        import mindspore as ms

        _no_grad(requires_grad)
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
        values = ops.rand(shape) if kind == "rand" else ops.randn(shape)
        return distribute_tensor(values.astype(dtype or ms.float32), device_mesh, placements, src_data_rank=0)

    return factory


rand = _random("rand")
randn = _random("randn")


# -- Cells -------------------------------------------------------------------------------------------

def lay_out_parameter(root: nn.Cell, param: Parameter, mesh: DeviceMesh, placements) -> Parameter:
    """Lay `param` (held somewhere in `root`) out on `mesh`; returns the Parameter `root` now holds
    for it (a new shard Parameter under msrun, `param` itself in simulation).

    A Parameter already laid out replicated (e.g. by an enclosing Cell's `shard_module`, which
    replicates what its plan leaves out) takes the new layout: every device holds its whole value.

    Raises:
        ValueError: the parameter is already split or Partial on the mesh, or (one process per
            device) a device's torch.chunk piece of it would be empty. A dimension the placements
            do not divide is split into torch.chunk pieces (as upstream and torch).
    """
    execution = mesh.execution()
    if id(param) in execution.parameters:
        held = execution.parameters[id(param)].layout
        if held.sharded_axes() or held.is_partial:
            raise ValueError(f"parameter {param.name!r} is already laid out as {held} (parallelize_module/"
                             "distribute_module applied twice to the same Cell?)")
        del execution.parameters[id(param)]
    layout = layout_on(mesh, placements, len(param.shape))
    layout.check_shape(tuple(param.shape), uneven=True)  # torch.chunk pieces, as upstream and torch
    row = SimpleNamespace(name=param.name, layout=layout, optimizer_layout=layout, global_shape=tuple(param.shape))
    check_not_meta((param,), "parallelize_module/distribute_module/fully_shard")
    with on_host():  # its pieces are values even inside MindSpore's DeviceCtx("meta") (MindFormers')
        slot = runtime_of(execution).materialize(root, param, row)
    empty = [r for r in layout.mesh.ranks if 0 in layout.shard_shape(row.global_shape, layout.mesh.coords(r))]
    if slot.local and empty:  # every process finds the same ranks, so all of them raise
        raise ValueError(f"{type(root).__name__} parameter {param.name!r} of shape {row.global_shape} split as "
                         f"{tuple(placements)}: {_empty_dims_text(row.global_shape, placements, mesh)}: ranks "
                         f"{empty} would hold an empty torch.chunk piece, and MindSpore's optimizers cannot hold a "
                         "Parameter of 0 elements (each process keeps only its piece); use a size that leaves every "
                         "device a piece (in simulation empty pieces run)")
    execution.parameters[id(slot.param)] = slot
    remember_mesh(slot.param, mesh)
    return slot.param


def _empty_dims_text(shape, placements, mesh: DeviceMesh) -> str:
    """The split dimensions of `shape` that leave a device an empty torch.chunk piece, each with
    its size, its devices and sizes that would leave none empty (for lay_out_parameter's refusal)."""
    texts = []
    for dim, size in enumerate(shape):
        devices = math.prod(mesh.shape[i] for i, p in enumerate(placements)
                            if isinstance(p, Shard) and p.dim % len(shape) == dim)
        chunk = -(-size // devices)
        if devices > 1 and chunk * (devices - 1) >= size:  # the last device's piece is empty
            texts.append(f"dimension {dim} has {size} elements over {devices} devices (torch.chunk pieces of "
                         f"{chunk}); {devices * chunk} or another multiple of {devices} would work")
    return "; ".join(texts) or "a split dimension leaves a device nothing"


def local_values(values):
    """`values` with every DTensor in it (nested tuples and lists) replaced by its `to_local()`."""
    if isinstance(values, DTensor):
        return values.to_local()
    if isinstance(values, (tuple, list)):
        return type(values)(local_values(v) for v in values)
    return values


def laid_out_parameters(cell: nn.Cell) -> Dict[str, DTensor]:
    """The Cell's laid-out Parameters by name, as DTensors (for inspection: `placements`,
    `to_local()`, `full_tensor()`)."""
    out = {}
    for name, param in cell.parameters_and_names():
        mesh = mesh_of(param)
        if mesh is not None:
            dt = parameter_dtensor(mesh.execution(), param)
            dt._device_mesh = mesh
            out[name] = dt
            mesh.execution().parameter_dtensors.pop(id(param), None)
    return out


def distribute_module(module: nn.Cell, device_mesh: Optional[DeviceMesh] = None,
                      partition_fn: Optional[Callable[[str, nn.Cell, DeviceMesh], None]] = None,
                      input_fn: Optional[Callable] = None, output_fn: Optional[Callable] = None,
                      parameter_shard_plan: Optional[Dict[str, Sequence]] = None) -> nn.Cell:
    """Lay `module`'s Parameters out on `device_mesh` and run its inputs/outputs through hooks.

    Args:
        module: the Cell (changed in place and returned).
        device_mesh: the mesh (default: the current one).
        partition_fn: called as (name, submodule, mesh) for every submodule; it lays parameters
            out with `lay_out_parameter`. Parameters left alone are replicated on the mesh.
        input_fn: (module, inputs, mesh) -> inputs, before each call.
        output_fn: (module, outputs, mesh) -> outputs, after each call.
        parameter_shard_plan: parameter name (relative to `module`) -> placements (HyperParallel's
            form); the rest are replicated.

    Raises:
        ValueError: a plan entry names no parameter, or a shape the placements cannot split.
    """
    mesh = _mesh(device_mesh)
    execution = mesh.execution()
    if parameter_shard_plan:
        named = dict(module.parameters_and_names())
        for name, placements in parameter_shard_plan.items():
            if name not in named:
                raise ValueError(f"parameter_shard_plan: no parameter {name!r} in {type(module).__name__}; it has "
                                 f"{sorted(named)}")
            lay_out_parameter(module, named[name], mesh, placements)
    if partition_fn is not None:
        for name, sub in module.cells_and_names():
            partition_fn(name, sub, mesh)
    for _, param in list(module.parameters_and_names()):
        if id(param) not in execution.parameters:
            lay_out_parameter(module, param, mesh, (Replicate(),) * mesh.ndim)
    wrap_construct(module, mesh, input_fn, output_fn)
    return module


def wrap_construct(module: nn.Cell, mesh: DeviceMesh, input_fn, output_fn, prepare=None) -> None:
    """While `module` runs, its laid-out Parameters read as DTensors; inputs and outputs pass
    `input_fn` / `output_fn`. `prepare(inputs)` may give the DTensors some Parameters read
    instead (by id: fully_shard's gathered ones); Parameters another Cell prepares are left to it.
    Applied again (a second style on one Cell), the hooks nest."""
    inner = module.construct
    execution = mesh.execution()

    @functools.wraps(inner)
    def construct(*args, **kwargs):
        if input_fn is not None:
            args = tuple(input_fn(module, args, mesh))
        prepared = prepare(args) if prepare is not None else {}
        injected = []
        for _, cell in module.cells_and_names():
            for name, param in cell._params.items():
                if param is None or id(param) not in execution.parameters or name in cell.__dict__:
                    continue
                if id(param) in prepared:
                    dt = prepared[id(param)]
                elif is_prepared_elsewhere(param):
                    continue
                else:
                    dt = parameter_dtensor(execution, param)
                dt._device_mesh = mesh_of(param)
                cell.__dict__[name] = dt
                injected.append((cell, name, param))
        try:
            outputs = inner(*args, **kwargs)
        finally:
            for cell, name, param in injected:
                del cell.__dict__[name]
                execution.parameter_dtensors.pop(id(param), None)
        return output_fn(module, outputs, mesh) if output_fn is not None else outputs

    object.__setattr__(module, "construct", construct)
