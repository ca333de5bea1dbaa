"""Python indexing (`x[...]`), GatherD and OneHot.

Basic indices (ints, slices, None, Ellipsis): a dimension taken whole by `:` keeps its
sharding; any other indexed dimension is gathered first. Tensor indices fall back to replicated.
"""
from __future__ import annotations

from mindspore import Tensor

from mindspore_hyper.dtensor.rules.common import make, norm_dims, unshard_dims, without_partial
from mindspore_hyper.dtensor.rules.registry import Decision, register


def _expand(index, ndim):
    index = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, (Tensor, list)) or (hasattr(i, "__array__") and not isinstance(i, (int, slice))) for i in index):
        return None
    n_real = sum(1 for i in index if i is not None and i is not Ellipsis)
    out = []
    for i in index:
        if i is Ellipsis:
            out.extend([slice(None)] * (ndim - n_real))
        else:
            out.append(i)
    if Ellipsis not in index:
        out.extend([slice(None)] * (ndim - n_real))
    return out


def getitem_decision(call):
    x, index = call.inputs[0], call.inputs[1]
    items = _expand(index, x.ndim)
    if items is None:
        return None
    mesh = x.layout.mesh
    in_dims = [list(e) for e in x.layout.dims]
    out_dims = []
    d = 0
    for item in items:
        if item is None:
            out_dims.append(())
            continue
        if isinstance(item, bool) or not isinstance(item, (int, slice)):
            return None
        whole = isinstance(item, slice) and item == slice(None)
        if not whole:
            in_dims[d] = []
        if isinstance(item, slice):
            out_dims.append(tuple(in_dims[d]))
        d += 1
    layout = make(mesh, in_dims, x.layout.partial)
    return Decision(inputs=[layout], outputs=make(mesh, out_dims, x.layout.partial))


@register("GatherD")
def gather_d(call):
    x = call.tensors[0]
    dim = call.inputs[1] if isinstance(call.inputs[1], int) else call.kwargs.get("dim", 0)
    dim = norm_dims(dim, x.ndim)[0]
    layout = unshard_dims(x.layout, [dim])
    index_layout = make(layout.mesh, layout.dims)
    return Decision(inputs=[layout, index_layout], outputs=index_layout)


@register("OneHot")
def one_hot(call):
    """The indices keep their split; the new class dimension is whole."""
    indices = call.tensors[0]
    axis = call.attrs.get("axis", -1)
    axis = axis % (indices.ndim + 1)
    layout = without_partial(indices.layout)
    dims = list(layout.dims)
    dims.insert(axis, ())
    others = [make(layout.mesh, [()] * t.ndim) for t in call.tensors[1:]]
    return Decision(inputs=[layout] + others, outputs=make(layout.mesh, dims))
