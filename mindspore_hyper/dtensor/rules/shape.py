"""Reshape, Flatten, Transpose, ExpandDims/Unsqueeze, Squeeze, BroadcastTo, ExpandAs, Tile, Pad.

Reshape keeps the sharding of a run of input dimensions that maps onto a run of output
dimensions whenever every shard stays one contiguous range: the run's axes (major first) are
those of its leading dimensions split down to size 1 locally plus those of the first dimension
left larger, and they spread over the output dimensions the same way; otherwise the run is
gathered first. Local reshapes use the local output shape.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

from mindspore_hyper.dtensor.rules.common import make, norm_dims, unshard_dims
from mindspore_hyper.dtensor.rules.registry import Decision, accepts_uneven, register


def _target_shape(call, in_shape) -> Tuple[int, ...]:
    rest = call.inputs[1:]
    if len(rest) == 1 and isinstance(rest[0], (tuple, list)):
        shape = list(rest[0])
    else:
        shape = [int(v) for v in rest]
    if "shape" in call.kwargs:
        shape = list(call.kwargs["shape"])
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = math.prod(in_shape) // known
    return tuple(int(s) for s in shape)


def _groups(src: Sequence[int], dst: Sequence[int]) -> Optional[List[Tuple[List[int], List[int]]]]:
    """Pair up runs of input and output dims with equal products (size-1 dims attach to a run)."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        gi, gj = [], []
        pi = pj = 1
        if i < len(src):
            gi.append(i); pi *= src[i]; i += 1
        if j < len(dst):
            gj.append(j); pj *= dst[j]; j += 1
        while pi != pj:
            if pi < pj and i < len(src):
                gi.append(i); pi *= src[i]; i += 1
            elif pj < pi and j < len(dst):
                gj.append(j); pj *= dst[j]; j += 1
            else:
                return None
        groups.append((gi, gj))
    return groups


def reshape_layouts(x, out_shape):
    """(input layout, output layout) reshaping `x` to `out_shape` by the module docstring's
    rule, or None if the shapes do not pair up."""
    mesh = x.layout.mesh
    in_shape = tuple(x.shape)
    groups = _groups(in_shape, out_shape)
    if groups is None:
        return None
    in_dims = [list(e) for e in x.layout.dims]
    out_dims = [()] * len(out_shape)
    for gi, gj in groups:
        axes = _group_axes(mesh, in_shape, in_dims, gi)
        placed = _place(mesh, axes, [out_shape[d] for d in gj])
        if placed is None:
            for d in gi:
                in_dims[d] = []
            continue
        for d, entry in zip(gj, placed):
            out_dims[d] = entry
    return make(mesh, in_dims, x.layout.partial), make(mesh, out_dims, x.layout.partial)


def _group_axes(mesh, in_shape, in_dims, dims: List[int]) -> List[int]:
    """The mesh axes splitting a run of input dims as one contiguous dim, major first: the
    leading dims' axes while each such dim is split down to size 1 locally, then the axes of the
    first dim left larger locally; the dims after it are made whole (`in_dims` is updated)."""
    axes: List[int] = []
    done = False
    for d in dims:
        if done or in_shape[d] == 1:
            in_dims[d] = []
            continue
        axes.extend(in_dims[d])
        if in_shape[d] // math.prod(mesh.device_matrix[a] for a in in_dims[d]) > 1:
            done = True
    return axes


def _place(mesh, axes: List[int], sizes: Sequence[int]) -> Optional[List[tuple]]:
    """Mesh axes (major first) over a run of output dims of `sizes` keeping every shard one
    contiguous range: each dim takes axes while their product divides its size, and passes the
    rest on only when split down to size 1. None when that leaves axes over."""
    rest = list(axes)
    placed: List[tuple] = []
    for size in sizes:
        taken: List[int] = []
        count = 1
        while rest and size > 1 and size % (count * mesh.device_matrix[rest[0]]) == 0:
            count *= mesh.device_matrix[rest[0]]
            taken.append(rest.pop(0))
        placed.append(tuple(taken))
        if rest and size > 1 and count < size:
            return None
    return None if rest else placed


@register("Reshape", "View")
def reshape(call):
    x = call.tensors[0]
    out_shape = _target_shape(call, tuple(x.shape))
    layouts = reshape_layouts(x, out_shape)
    if layouts is None:
        return None
    in_layout, out_layout = layouts
    local = out_layout.local_shape(out_shape)
    return Decision(inputs=[in_layout], outputs=out_layout, local_args=lambda inputs, coords: [inputs[0], local])


@register("Flatten", "FlattenExt")
def flatten(call):
    """Flatten (all but the first dimension) and FlattenExt (start..end): reshapes whose local
    op computes its own local shape."""
    x = call.tensors[0]
    if x.ndim == 0:
        return None
    if call.name == "Flatten":
        start, end = 1, x.ndim - 1
    else:
        start = call.inputs[1] if len(call.inputs) > 1 else 0
        end = call.inputs[2] if len(call.inputs) > 2 else -1
        start, end = start % x.ndim, end % x.ndim
    shape = tuple(x.shape)
    out_shape = shape[:start] + (math.prod(shape[start:end + 1]),) + shape[end + 1:]
    layouts = reshape_layouts(x, out_shape)
    return None if layouts is None else Decision(inputs=[layouts[0]], outputs=layouts[1])


def _perm(call, ndim) -> Tuple[int, ...]:
    rest = call.inputs[1:]
    if call.name in ("TransposeExt", "SwapAxes", "Swapaxes", "TransposeExtView"):
        a, b = (int(v) % ndim for v in rest[:2])
        perm = list(range(ndim))
        perm[a], perm[b] = perm[b], perm[a]
        return tuple(perm)
    if len(rest) == 1 and isinstance(rest[0], (tuple, list)):
        return tuple(int(p) % ndim for p in rest[0])
    return tuple(int(p) % ndim for p in rest)


@accepts_uneven()
@register("Transpose", "DeprecatedTranspose", "TransposeExt", "SwapAxes", "Swapaxes", "Permute", "TransposeExtView",
          "TransposeView")
def transpose(call):
    x = call.tensors[0]
    perm = _perm(call, x.ndim)
    out = make(x.layout.mesh, [x.layout.dims[p] for p in perm], x.layout.partial)
    return Decision(inputs=[x.layout], outputs=out)


@accepts_uneven()
@register("ExpandDims", "Unsqueeze")
def expand_dims(call):
    x = call.tensors[0]
    axis = int(call.inputs[1]) % (x.ndim + 1)
    dims = list(x.layout.dims)
    dims.insert(axis, ())
    return Decision(inputs=[x.layout], outputs=make(x.layout.mesh, dims, x.layout.partial))


@register("Squeeze")
def squeeze(call):
    x = call.tensors[0]
    axis = call.inputs[1] if len(call.inputs) > 1 else call.attrs.get("axis", ())
    every = axis in ((), None, [])
    if every and len(call.inputs) < 2:
        return None  # a primitive squeezing every size-1 dimension would also squeeze local ones
    squeezed = [d for d in range(x.ndim) if x.shape[d] == 1] if every else norm_dims(axis, x.ndim)
    squeezed = tuple(d for d in squeezed if x.shape[d] == 1)
    dims = [e for d, e in enumerate(x.layout.dims) if d not in squeezed]
    out = make(x.layout.mesh, dims, x.layout.partial)
    if not squeezed:  # an empty axis tuple would squeeze the local size-1 dimensions
        return Decision(inputs=[x.layout], outputs=out, local_fn=lambda call_, inputs, coords: inputs[0])
    return Decision(inputs=[x.layout], outputs=out,
                    local_args=lambda inputs, coords: [inputs[0], squeezed] + list(inputs[2:]))


@register("BroadcastTo")
def broadcast_to(call):
    x = call.tensors[0]
    shape = tuple(call.inputs[1]) if len(call.inputs) > 1 else tuple(call.attrs.get("shape"))
    off = len(shape) - x.ndim
    shape = tuple(x.shape[d - off] if s == -1 else s for d, s in enumerate(shape))
    dims = [()] * off + [e if x.shape[d] == shape[d + off] else () for d, e in enumerate(x.layout.dims)]
    layout = make(x.layout.mesh, dims[off:], {})
    out = make(x.layout.mesh, dims, {})
    local = out.local_shape(shape)
    return Decision(inputs=[layout], outputs=out, local_args=lambda inputs, coords: [inputs[0], local])


@register("Tile")
def tile(call):
    """Dimensions repeated more than once must be whole; new leading dimensions are whole."""
    x = call.tensors[0]
    reps = tuple(call.inputs[1])
    reps = (1,) * (x.ndim - len(reps)) + reps
    off = len(reps) - x.ndim
    in_dims = [e if reps[d + off] == 1 else () for d, e in enumerate(x.layout.dims)]
    return Decision(inputs=[make(x.layout.mesh, in_dims, x.layout.partial)],
                    outputs=make(x.layout.mesh, [()] * off + in_dims, x.layout.partial))


@register("ExpandAs")
def expand_as(call):
    """x broadcast to `other`'s shape: the output takes `other`'s split; x's broadcast
    dimensions are whole and the others follow the output (the local op reads `other`'s
    local shape)."""
    x, other = call.tensors[0], call.tensors[1]
    mesh = x.layout.mesh
    out_dims = list(other.layout.dims)
    off = other.ndim - x.ndim
    x_dims = [out_dims[d + off] if x.shape[d] == other.shape[d + off] else () for d in range(x.ndim)]
    out_dims[:off] = [()] * off
    for d in range(x.ndim):
        if not x_dims[d]:
            out_dims[d + off] = ()
    return Decision(inputs=[make(mesh, x_dims), make(mesh, out_dims)], outputs=make(mesh, out_dims))


@register("PadV3")
def pad(call):
    """Padded dimensions (the last len(paddings)/2) must be whole; the others keep their split."""
    x = call.tensors[0]
    paddings = tuple(call.inputs[1])
    padded = [x.ndim - 1 - i for i in range(len(paddings) // 2) if paddings[2 * i] or paddings[2 * i + 1]]
    layout = unshard_dims(x.layout, padded)
    return Decision(inputs=[layout] + [make(layout.mesh, [()] * t.ndim) for t in call.tensors[1:]], outputs=layout)
