"""Concat, Stack, Split, Slice and StridedSlice.

The joined/split/sliced dimension must be whole on each device; every other dimension keeps the
first input's sharding (other inputs are laid out to match). A slice that keeps a dimension
entire keeps its sharding and is applied with that dimension's local size.
"""
from __future__ import annotations

from mindspore_hyper.dtensor.rules.common import make, unshard_dims
from mindspore_hyper.dtensor.rules.registry import Decision, register


def _int_arg(call, index, names, default):
    if len(call.inputs) > index and isinstance(call.inputs[index], int) and not isinstance(call.inputs[index], bool):
        return call.inputs[index]
    for n in names:
        if n in call.kwargs:
            return call.kwargs[n]
        if n in call.attrs:
            return call.attrs[n]
    return default


@register("Concat", "Cat")
def concat(call):
    first = call.tensors[0]
    dim = _int_arg(call, 1, ("axis", "dim"), 0) % first.ndim
    layout = unshard_dims(first.layout, [dim])
    return Decision(inputs=[layout] * len(call.tensors), outputs=layout)


@register("Stack", "StackExt")
def stack(call):
    first = call.tensors[0]
    dim = _int_arg(call, 1, ("axis", "dim"), 0) % (first.ndim + 1)
    layout = first.layout.with_partial({})
    dims = list(layout.dims)
    dims.insert(dim, ())
    return Decision(inputs=[layout] * len(call.tensors), outputs=make(layout.mesh, dims))


@register("Split", "SplitTensor", "SplitWithSize", "SplitExt")
def split(call):
    x = call.tensors[0]
    if call.name == "Split":
        dim = _int_arg(call, 1, ("axis",), 0)
    else:
        dim = _int_arg(call, 2, ("dim", "axis"), 0)
    layout = unshard_dims(x.layout, [dim % x.ndim], keep_partial=True)
    return Decision(inputs=[layout], outputs=layout)


@register("Slice")
def slice_(call):
    x = call.tensors[0]
    begin, size = list(call.inputs[1]), list(call.inputs[2])
    size = [x.shape[d] - begin[d] if s == -1 else s for d, s in enumerate(size)]
    whole = [begin[d] == 0 and size[d] == x.shape[d] for d in range(x.ndim)]
    layout = unshard_dims(x.layout, [d for d in range(x.ndim) if not whole[d]], keep_partial=True)
    local = layout.local_shape(tuple(x.shape))
    local_size = tuple(local[d] if whole[d] else size[d] for d in range(x.ndim))
    return Decision(inputs=[layout], outputs=layout,
                    local_args=lambda inputs, coords: [inputs[0], tuple(begin), local_size])


@register("StridedSlice")
def strided_slice(call):
    x = call.tensors[0]
    if any(call.attrs.get(m, 0) for m in ("ellipsis_mask", "new_axis_mask", "shrink_axis_mask")):
        return None
    begin, end, strides = (list(v) for v in call.inputs[1:4])
    begin_mask, end_mask = call.attrs.get("begin_mask", 0), call.attrs.get("end_mask", 0)
    whole = []
    for d in range(x.ndim):
        if d >= len(begin):
            whole.append(True)
            continue
        b = 0 if begin_mask >> d & 1 else begin[d]
        e = x.shape[d] if end_mask >> d & 1 else end[d]
        whole.append(b == 0 and e >= x.shape[d] and strides[d] == 1)
    layout = unshard_dims(x.layout, [d for d in range(x.ndim) if not whole[d]], keep_partial=True)
    local = layout.local_shape(tuple(x.shape))
    local_end = [local[d] if d < len(end) and whole[d] else end[d] for d in range(len(end))]
    return Decision(inputs=[layout], outputs=layout,
                    local_args=lambda inputs, coords: [inputs[0], tuple(begin), tuple(local_end), tuple(strides)]
                    + list(inputs[4:]))
