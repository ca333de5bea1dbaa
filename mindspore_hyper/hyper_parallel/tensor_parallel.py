"""Tensor-parallel styles and `parallelize_module` (HyperParallel's and torch's semantics).

A style lays a Cell's Parameters out on a one-dimensional mesh and converts its inputs and
outputs at the Cell's boundary (`distribute_module`):
- ColwiseParallel: a Dense/Linear's output features (weight rows, bias) or an Embedding's
  embedding dimension split; input Replicate, output Shard(-1).
- RowwiseParallel: a Dense/Linear's input features split (bias replicated), input Shard(-1),
  output Replicate (the partial sums reduced); an Embedding's vocabulary split.
- SequenceParallel: Parameters replicated, activations split along the sequence dimension.
- PrepareModuleInput / PrepareModuleOutput / PrepareModuleInputOutput: only the conversions.
- NoParallel: Parameters replicated, input and output Replicate.
`use_local_output` returns local tensors, as upstream does: the shard where every rank's is the
same, else a rank-local value (`dtensor.rank_local_view`) in every mode, under msrun too (one
shard), so the model's ops on it are accounted per process as per simulated device.
"""
from __future__ import annotations

import fnmatch
from typing import Dict, Optional, Tuple, Union

from mindspore import nn

from mindspore_hyper.comm.collective_cause import set_cause
from mindspore_hyper.dtensor.dtensor import DTensor, rank_local_view
from mindspore_hyper.hyper_parallel.device_mesh import DeviceMesh, get_current_mesh
from mindspore_hyper.hyper_parallel.distribute import distribute_module
from mindspore_hyper.shard.placement import Placement, Replicate, Shard

__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel", "SequenceParallel", "PrepareModuleInput",
           "PrepareModuleOutput", "PrepareModuleInputOutput", "NoParallel", "parallelize_module"]


def _one(placement: Optional[Placement], default: Placement) -> Placement:
    if placement is None:
        return default
    if isinstance(placement, (tuple, list)):
        if len(placement) != 1:
            raise ValueError(f"layouts {placement!r}: a tensor-parallel style takes one placement (a 1-D mesh)")
        placement = placement[0]
    return placement


def _style_cause(style: "ParallelStyle", module: nn.Cell, where: str) -> str:
    """The report's cause of a style's redistribution: "RowwiseParallel output of layers.0.wo" (the
    Cell's path read from its parameters' names, which carry it once the model is built)."""
    names = [p.name for p in module.get_parameters()]
    path = names[0].rsplit(".", 1)[0] if names and "." in names[0] else type(module).__name__
    return f"{type(style).__name__} {where} of {path}"


def _redistribute(x: DTensor, mesh: DeviceMesh, placement: Placement, cause: str) -> DTensor:
    previous = set_cause(cause)
    try:
        return x.redistribute(mesh, (placement,))
    finally:
        set_cause(previous)


def _to_dtensor(x, mesh: DeviceMesh, placement: Placement, desired: Placement, cause: str,
                last_dim: Optional[int] = None):
    """`x` as a DTensor at `desired`: a plain or rank-local `x` is each rank's local part under
    `placement`. `last_dim`: the global size of the last dimension (a Linear's input features),
    so a local part split there into uneven torch.chunk pieces gets its true global shape (the
    even rule, local size times devices, would be wrong)."""
    if not isinstance(x, DTensor) or x.layout.is_rank_local:
        shape = None
        if last_dim is not None and isinstance(placement, Shard) and placement.dim % x.ndim == x.ndim - 1:
            shape = tuple(x.shape[:-1]) + (last_dim,)
        x = DTensor.from_local(x, mesh, (placement,), shape=shape)
    if x.placements != (desired,):
        x = _redistribute(x, mesh, desired, cause)
    return x


def _from_dtensor(x, mesh: DeviceMesh, placement: Placement, use_local_output: bool, cause: str):
    if not isinstance(x, DTensor):
        return x
    if x.placements != (placement,):
        x = _redistribute(x, mesh, placement, cause)
    return rank_local_view(x) if use_local_output else x


def _kind(module: nn.Cell) -> str:
    """"embedding" or "linear" by the Cell's class and parameters.

    Raises:
        ValueError: neither (the style cannot say how to split it).
    """
    name = type(module).__name__
    params = dict(module.parameters_and_names())
    if "Embedding" in name and len(params) == 1:
        return "embedding"
    weight = params.get("weight")
    if weight is not None and len(weight.shape) == 2 and set(params) <= {"weight", "bias"}:
        return "linear"
    raise ValueError(f"{name}: tensor-parallel styles split nn.Dense / mint.nn.Linear (weight [out, in], bias) and "
                     f"nn.Embedding / mint.nn.Embedding; this Cell has parameters {sorted(params)}. Use "
                     "distribute_module with a partition_fn, or PrepareModuleInput/Output around it")


class ParallelStyle:
    """A way to parallelize one Cell on a one-dimensional mesh (see module docstring)."""

    def apply(self, module: nn.Cell, device_mesh: DeviceMesh) -> nn.Cell:
        if device_mesh.ndim != 1:
            raise ValueError(f"{type(self).__name__}: tensor-parallel styles take a 1-D mesh; got {device_mesh!r} "
                             f"(pass a sub-mesh such as mesh[{device_mesh.mesh_dim_names[-1]!r}])")
        return self._apply(module, device_mesh)

    def _apply(self, module: nn.Cell, device_mesh: DeviceMesh) -> nn.Cell:
        raise NotImplementedError


class ColwiseParallel(ParallelStyle):
    """Split a Dense/Linear's output features or an Embedding's embedding dimension."""

    def __init__(self, *, input_layouts: Optional[Placement] = None, output_layouts: Optional[Placement] = None,
                 use_local_output: bool = True):
        self.input_layout = _one(input_layouts, Replicate())
        self.output_layout = _one(output_layouts, Shard(-1))
        self.use_local_output = use_local_output

    def _apply(self, module, mesh):
        params = dict(module.parameters_and_names())
        if _kind(module) == "embedding":
            plan = {name: (Shard(1),) for name in params}
        else:
            plan = {name: (Shard(0),) for name in params}
        cause_in, cause_out = _style_cause(self, module, "input"), _style_cause(self, module, "output")
        return distribute_module(
            module, mesh, parameter_shard_plan=plan,
            input_fn=lambda m, inputs, mesh: (_to_dtensor(inputs[0], mesh, self.input_layout, Replicate(),
                                                        cause_in),)
            + tuple(inputs[1:]),
            output_fn=lambda m, out, mesh: _from_dtensor(out, mesh, self.output_layout, self.use_local_output,
                                                      cause_out))


class RowwiseParallel(ParallelStyle):
    """Split a Dense/Linear's input features (bias replicated) or an Embedding's vocabulary."""

    def __init__(self, *, input_layouts: Optional[Placement] = None, output_layouts: Optional[Placement] = None,
                 use_local_output: bool = True):
        self.input_layout = _one(input_layouts, Shard(-1))
        self.output_layout = _one(output_layouts, Replicate())
        self.use_local_output = use_local_output

    def _apply(self, module, mesh):
        params = dict(module.parameters_and_names())
        if _kind(module) == "embedding":
            plan, desired, in_features = {name: (Shard(0),) for name in params}, Replicate(), None
        else:
            plan = {"weight": (Shard(1),)}
            if "bias" in params:
                plan["bias"] = (Replicate(),)
            desired, in_features = Shard(-1), int(params["weight"].shape[1])
        cause_in, cause_out = _style_cause(self, module, "input"), _style_cause(self, module, "output")
        return distribute_module(
            module, mesh, parameter_shard_plan=plan,
            input_fn=lambda m, inputs, mesh: (_to_dtensor(inputs[0], mesh, self.input_layout, desired,
                                                        cause_in, in_features),)
            + tuple(inputs[1:]),
            output_fn=lambda m, out, mesh: _from_dtensor(out, mesh, self.output_layout, self.use_local_output,
                                                      cause_out))


class SequenceParallel(ParallelStyle):
    """Parameters replicated; the input split along `sequence_dim` (a plain input is this rank's
    sequence shard); the output stays a DTensor unless `use_local_output`."""

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = False):
        if isinstance(sequence_dim, bool) or not isinstance(sequence_dim, int):
            raise ValueError(f"SequenceParallel(sequence_dim={sequence_dim!r}): expected an int")
        self.sequence_dim = sequence_dim
        self.use_local_output = use_local_output

    def _apply(self, module, mesh):
        shard = Shard(self.sequence_dim)

        def inputs_fn(m, inputs, mesh):
            first = inputs[0]
            if not isinstance(first, DTensor) or first.layout.is_rank_local:
                first = DTensor.from_local(first, mesh, (shard,))
            return (first,) + tuple(inputs[1:])

        def outputs_fn(m, out, mesh):
            return rank_local_view(out) if self.use_local_output and isinstance(out, DTensor) else out

        return distribute_module(module, mesh, input_fn=inputs_fn, output_fn=outputs_fn)


class NoParallel(ParallelStyle):
    """Parameters replicated on the mesh; input and output Replicate (local output by default)."""

    def __init__(self, *, input_layout: Optional[Placement] = None, output_layout: Optional[Placement] = None,
                 use_local_output: bool = True):
        self.input_layout = _one(input_layout, Replicate())
        self.output_layout = _one(output_layout, Replicate())
        self.use_local_output = use_local_output

    def _apply(self, module, mesh):
        cause_in, cause_out = _style_cause(self, module, "input"), _style_cause(self, module, "output")
        return distribute_module(
            module, mesh,
            input_fn=lambda m, inputs, mesh: (_to_dtensor(inputs[0], mesh, self.input_layout, Replicate(),
                                                        cause_in),)
            + tuple(inputs[1:]),
            output_fn=lambda m, out, mesh: _from_dtensor(out, mesh, self.output_layout, self.use_local_output,
                                                      cause_out))


def _layouts(value, name: str) -> Tuple[Optional[Placement], ...]:
    if value is None:
        return ()
    if isinstance(value, Placement):
        return (value,)
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"{name}={value!r}: expected a Placement, None, or a tuple of them (one per input)")
    return tuple(value)


class PrepareModuleInput(ParallelStyle):
    """Convert the positional (and keyword) inputs: each plain input with a layout becomes a
    DTensor of that layout, then is redistributed to the desired one; None leaves an input alone."""

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                 desired_input_kwarg_layouts=None, use_local_output: bool = False):
        self.input_layouts = _layouts(input_layouts, "input_layouts")
        self.desired_input_layouts = _layouts(desired_input_layouts, "desired_input_layouts")
        if len(self.input_layouts) != len(self.desired_input_layouts):
            raise ValueError(f"PrepareModuleInput: input_layouts {self.input_layouts} and desired_input_layouts "
                             f"{self.desired_input_layouts} must have the same length")
        self.input_kwarg_layouts = dict(input_kwarg_layouts or {})
        self.desired_input_kwarg_layouts = dict(desired_input_kwarg_layouts or {})
        if set(self.input_kwarg_layouts) != set(self.desired_input_kwarg_layouts):
            raise ValueError("PrepareModuleInput: input_kwarg_layouts and desired_input_kwarg_layouts must name the "
                             "same keywords")
        self.use_local_output = use_local_output

    def convert(self, inputs, mesh, cause: str = "PrepareModuleInput input"):
        if len(inputs) < len(self.input_layouts):
            raise ValueError(f"PrepareModuleInput: {len(self.input_layouts)} input layouts for {len(inputs)} inputs")
        out = list(inputs)
        for i, (layout, desired) in enumerate(zip(self.input_layouts, self.desired_input_layouts)):
            if layout is None or out[i] is None:
                continue
            out[i] = _to_dtensor(out[i], mesh, layout, _one(desired, layout), cause)
            if self.use_local_output:
                out[i] = rank_local_view(out[i])
        return tuple(out)

    def _apply(self, module, mesh):
        if self.input_kwarg_layouts:
            raise ValueError("PrepareModuleInput(input_kwarg_layouts=...): keyword inputs are not converted yet; pass "
                             "them positionally")
        inner = module.construct
        prepare = self
        cause = _style_cause(self, module, "input")

        def construct(*args, **kwargs):
            return inner(*prepare.convert(args, mesh, cause), **kwargs)

        object.__setattr__(module, "construct", construct)
        return module


class PrepareModuleOutput(ParallelStyle):
    """Convert the outputs: each with a layout is redistributed to the desired one (and made
    local with `use_local_output`)."""

    def __init__(self, *, output_layouts, desired_output_layouts, use_local_output: bool = True):
        self.output_layouts = _layouts(output_layouts, "output_layouts")
        self.desired_output_layouts = _layouts(desired_output_layouts, "desired_output_layouts")
        if len(self.output_layouts) != len(self.desired_output_layouts):
            raise ValueError("PrepareModuleOutput: output_layouts and desired_output_layouts must have the same length")
        self.use_local_output = use_local_output

    def convert(self, outputs, mesh, cause: str = "PrepareModuleOutput output"):
        single = not isinstance(outputs, (tuple, list))
        values = [outputs] if single else list(outputs)
        for i, (layout, desired) in enumerate(zip(self.output_layouts, self.desired_output_layouts)):
            if layout is None:
                continue
            value = _to_dtensor(values[i], mesh, layout, _one(desired, layout), cause)
            values[i] = rank_local_view(value) if self.use_local_output else value
        return values[0] if single else type(outputs)(values)

    def _apply(self, module, mesh):
        inner = module.construct
        prepare = self
        cause = _style_cause(self, module, "output")

        def construct(*args, **kwargs):
            return prepare.convert(inner(*args, **kwargs), mesh, cause)

        object.__setattr__(module, "construct", construct)
        return module


class PrepareModuleInputOutput(ParallelStyle):
    """PrepareModuleInput and PrepareModuleOutput on one Cell."""

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                 desired_input_kwarg_layouts=None, use_local_input: bool = False, output_layouts=None,
                 desired_output_layouts=None, use_local_output: bool = True):
        self.prepare_input = PrepareModuleInput(
            input_layouts=input_layouts, desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts, desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_input)
        self.prepare_output = PrepareModuleOutput(output_layouts=output_layouts,
                                                  desired_output_layouts=desired_output_layouts,
                                                  use_local_output=use_local_output)

    def _apply(self, module, mesh):
        self.prepare_input._apply(module, mesh)
        return self.prepare_output._apply(module, mesh)


def parallelize_module(module: nn.Cell, device_mesh: Optional[DeviceMesh] = None,
                       parallelize_plan: Union[ParallelStyle, Dict[str, ParallelStyle], None] = None) -> nn.Cell:
    """Apply a style to `module`, or styles to its submodules by name pattern (`fnmatch` per
    dotted path, e.g. "layers.*.attention.wq").

    Args:
        module: the Cell (changed in place and returned).
        device_mesh: a one-dimensional mesh (default: the current mesh).
        parallelize_plan: a ParallelStyle, or submodule name pattern -> ParallelStyle.

    Raises:
        ValueError: a pattern that matches no submodule (the nearest names are listed), a style
            on a Cell it cannot split, or a mesh of several dimensions.
    """
    mesh = device_mesh if device_mesh is not None else get_current_mesh()
    if parallelize_plan is None:
        return module
    if isinstance(parallelize_plan, ParallelStyle):
        return parallelize_plan.apply(module, mesh)
    if not isinstance(parallelize_plan, dict):
        raise ValueError(f"parallelize_plan: expected a ParallelStyle or a dict of them, got "
                         f"{type(parallelize_plan).__name__}")
    names = [name for name, _ in module.cells_and_names() if name]
    cells = dict(module.cells_and_names())
    for pattern, style in parallelize_plan.items():
        if not isinstance(style, ParallelStyle):
            raise ValueError(f"parallelize_plan[{pattern!r}]: expected a ParallelStyle, got {type(style).__name__}")
        matched = [name for name in names if _matches(name, pattern)]
        if not matched:
            import difflib

            near = difflib.get_close_matches(pattern, names, n=5, cutoff=0.4)
            raise ValueError(f"parallelize_plan: {pattern!r} matches no submodule of {type(module).__name__}; nearest "
                             f"names: {near or names[:5]}")
        for name in matched:
            style.apply(cells[name], mesh)
    return module


def _matches(name: str, pattern: str) -> bool:
    parts, wanted = name.split("."), pattern.split(".")
    return len(parts) == len(wanted) and all(fnmatch.fnmatchcase(p, w) for p, w in zip(parts, wanted))
