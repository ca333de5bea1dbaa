"""Gather: embedding lookup along axis 0, including vocabulary-parallel tables; other axes.

A table sharded on its vocabulary dimension is looked up per device with the indices shifted
into the local range, out-of-range rows masked to zero, and the result Partial(sum) over the
vocabulary axes (an AllReduce or ReduceScatter resolves it when consumed). Gathering along
another axis needs that axis whole; the other dimensions of both inputs keep their splits.
"""
from __future__ import annotations

from mindspore import ops

from mindspore_hyper.dtensor.rules.common import make, without_partial
from mindspore_hyper.dtensor.rules.registry import Decision, register


@register("Gather")
def gather(call):
    params, indices = call.tensors[0], call.tensors[1]
    axis = next((v for v in call.inputs[2:] if isinstance(v, int) and not isinstance(v, bool)), 0)
    if call.inputs[0] is not params or any(isinstance(v, int) and v for v in call.inputs[3:4]):
        return None  # not (params, indices, axis) or batch_dims set
    if axis % params.ndim != 0:
        return _gather_other_axis(params, indices, axis % params.ndim)
    mesh = params.layout.mesh
    vocab_axes = params.layout.dims[0]
    idx_dims = [tuple(a for a in e if a not in vocab_axes) for e in indices.layout.dims]
    used = set(vocab_axes) | {a for e in idx_dims for a in e}
    row_dims = [tuple(a for a in e if a not in used) for e in params.layout.dims[1:]]
    params_layout = make(mesh, [vocab_axes] + row_dims)
    index_layout = make(mesh, idx_dims)
    out = make(mesh, idx_dims + row_dims, {a: "sum" for a in vocab_axes})
    if not vocab_axes:
        return Decision(inputs=[params_layout, index_layout], outputs=out)
    local_vocab = params_layout.local_shape(tuple(params.shape))[0]

    def local_fn(call_, inputs, coords):
        table, ids = inputs[0], inputs[1]
        shard = 0
        for a in vocab_axes:
            shard = shard * mesh.device_matrix[a] + coords[a]
        local_ids = ids - shard * local_vocab
        inside = ops.logical_and(local_ids >= 0, local_ids < local_vocab)
        safe = ops.select(inside, local_ids, ops.zeros_like(local_ids))
        rows = call_.run([table, safe] + list(inputs[2:]))
        mask = ops.expand_dims(inside, -1).astype(rows.dtype) if rows.ndim > ids.ndim else inside.astype(rows.dtype)
        return rows * mask

    return Decision(inputs=[params_layout, index_layout], outputs=out, local_fn=local_fn)


def _gather_other_axis(params, indices, axis: int) -> Decision:
    mesh = params.layout.mesh
    params_dims = [() if d == axis else e for d, e in enumerate(without_partial(params.layout).dims)]
    used = {a for e in params_dims for a in e}
    index_dims = [tuple(a for a in e if a not in used) for e in indices.layout.dims]
    out = params_dims[:axis] + index_dims + params_dims[axis + 1:]
    return Decision(inputs=[make(mesh, params_dims), make(mesh, index_dims)], outputs=make(mesh, out))
