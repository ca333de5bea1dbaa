"""Python indexing (`x[...]`), GatherD and OneHot.

Basic indices (ints, slices, None, Ellipsis): a dimension taken whole by `:` keeps its
sharding; any other indexed dimension is gathered first. Tensor indices fall back to replicated.
GatherD along a split dimension picks locally (Partial sum), as Megatron-LM's vocabulary-parallel
cross-entropy does.
"""
from __future__ import annotations

from mindspore import Tensor, ops

from mindspore_hyper.dtensor.rules.common import (make, norm_dims, shard_number, stacked_shard_numbers, unshard_dims,
                                                  without_partial)
from mindspore_hyper.dtensor.rules.registry import Decision, register
from mindspore_hyper.dtensor.meta import MetaTensor


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
    """GatherD (`gather_elements`): the index keeps the input's splits on the other dimensions.
    Along a split gathered dimension (a vocabulary-parallel cross-entropy's label pick) each
    device picks the entries it holds and zeros elsewhere, Partial(sum) over the split's axes,
    so the input is never gathered (`_pick_local`)."""
    x, index = call.tensors[0], call.tensors[1]
    dim = call.inputs[1] if isinstance(call.inputs[1], int) else call.kwargs.get("dim", 0)
    dim = norm_dims(dim, x.ndim)[0]
    mesh = x.layout.mesh
    # an index shorter than the input on a dimension reads other rows than its own shard's
    shorter = [d for d in range(x.ndim) if d != dim and index.shape[d] != x.shape[d]]
    axes = x.layout.dims[dim]
    if not axes or len(call.inputs) != 3 or call.kwargs or 0 in index.shape:
        layout = unshard_dims(x.layout, [dim] + shorter)
        index_layout = make(mesh, layout.dims)
        return Decision(inputs=[layout, index_layout], outputs=index_layout)
    layout = unshard_dims(x.layout, shorter)
    index_layout = make(mesh, [() if d == dim else e for d, e in enumerate(layout.dims)])
    size = x.shape[dim]
    local_size = layout.local_shape(tuple(x.shape))[dim]

    def local_fn(call_, inputs, coords):
        offset = shard_number(mesh, axes, coords) * local_size
        return _pick_local(call_, inputs[0], inputs[1], inputs[2], size, offset, local_size)

    def batch_fn(call_, inputs, batch):
        """`local_fn` for every shard at once: each batch element's offset along `dim`."""
        shard = stacked_shard_numbers(mesh, axes, batch)
        index = batch.full(1)
        offset = Tensor((shard * local_size).reshape(batch.sizes + (1,) * batch.local_ranks[1]), index.dtype)
        return _pick_local(call_, batch.full(0), batch.nb + dim, index, size, offset, local_size)

    return Decision(inputs=[layout, index_layout], outputs=make(mesh, index_layout.dims, {a: "sum" for a in axes}),
                    local_fn=local_fn, batch_fn=batch_fn)


def _pick_local(call_, x, dim: int, index, size: int, offset, local_size: int):
    """GatherD of the entries of `x` (a shard holding [offset, offset + local_size) of a
    dimension of `size`) that `index` points at, zero where another shard holds them. Index
    values follow GatherD's range [-size, size) (negative wrap); others raise IndexError."""
    if isinstance(index, MetaTensor):  # a dry run: no values to check, the shape is GatherD's
        return call_.run([x, dim, index])
    low, high = (int(v) for v in ops.stack([index.min(), index.max()]).asnumpy())  # one host read
    if low < -size or high >= size:
        raise IndexError(f"GatherD: index values must be in [{-size}, {size}) (the gathered dimension's size "
                         f"{size}); got values in [{low}, {high}]")
    wrapped = index + ops.cast(index < 0, index.dtype) * size if low < 0 else index
    local = wrapped - offset
    inside = ops.logical_and(local >= 0, local < local_size)
    picked = call_.run([x, dim, ops.select(inside, local, ops.zeros_like(local))])
    return ops.select(inside, picked, ops.zeros_like(picked))


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
