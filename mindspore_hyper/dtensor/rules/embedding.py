"""Gather along axis 0 — embedding lookup — including vocabulary-parallel tables.

A table sharded on its vocabulary dimension is looked up per device with the indices shifted
into the local range, out-of-range rows masked to zero, and the result Partial(sum) over the
vocabulary axes (an AllReduce or ReduceScatter resolves it when consumed).
"""
from __future__ import annotations

from mindspore import ops

from mindspore_hyper.dtensor.rules.common import make
from mindspore_hyper.dtensor.rules.registry import Decision, register


@register("Gather")
def gather(call):
    params, indices = call.tensors[0], call.tensors[1]
    axis = next((v for v in call.inputs[2:] if isinstance(v, int) and not isinstance(v, bool)), 0)
    if axis != 0 or call.inputs[0] is not params:
        return None
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
