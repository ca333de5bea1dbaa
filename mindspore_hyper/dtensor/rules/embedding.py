"""Gather: embedding lookup along axis 0, including vocabulary-parallel tables; other axes.

A table sharded on its vocabulary dimension is looked up per device with the indices mapped
into the local range (ids another device holds read a zero row), and the result Partial(sum) over
the vocabulary axes (an AllReduce or ReduceScatter resolves it when consumed). Gathering along
another axis needs that axis whole; the other dimensions of both inputs keep their splits.
"""
from __future__ import annotations

import math

import numpy as np
from mindspore import Tensor, ops

from mindspore_hyper.dtensor.rules.common import make, shard_number, stacked_shard_numbers, without_partial
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

    vocab = params.shape[0]

    def local_fn(call_, inputs, coords):
        """One lookup of the ids into this shard's local rows (`local_rows`, out-of-range ids to
        an extra zero row appended to the table): three kernels instead of ten for the shift
        and the mask, the same values (a masked row is the zero row, an inside row unchanged)."""
        table, ids = inputs[0], inputs[1]
        shard = shard_number(mesh, vocab_axes, coords)
        safe = ops.gather(local_rows(vocab, shard, local_vocab, ids.dtype), ids, 0)
        return call_.run([ops.concat((table, zero_row(table)), 0), safe] + list(inputs[2:]))

    def batch_fn(call_, inputs, batch):
        """`local_fn` for every shard at once: each shard's local ids index its own table,
        flattened into one (stacked tables x local vocabulary) table."""
        if len(inputs) != 4 or batch.local_ranks[0] != 2:
            return None
        table, ids = batch.stacked
        table_sizes = batch.sizes_of(0)
        shard = stacked_shard_numbers(mesh, vocab_axes, batch)  # each batch element's vocabulary shard
        position = np.arange(math.prod(table_sizes)).reshape(table_sizes)  # each element's table
        pad = (1,) * batch.local_ranks[1]
        offset = Tensor((shard * local_vocab).reshape(batch.sizes + pad), ids.dtype)
        base = Tensor(np.broadcast_to(position, batch.sizes).reshape(batch.sizes + pad) * local_vocab, ids.dtype)
        local_ids = ids - offset
        inside = ops.logical_and(local_ids >= 0, local_ids < local_vocab)
        safe = ops.select(inside, local_ids, ops.zeros_like(local_ids)) + base
        rows = call_.run([table.reshape((-1, table.shape[-1])), safe] + list(inputs[2:]))
        return rows * ops.expand_dims(inside, -1).astype(rows.dtype)

    return Decision(inputs=[params_layout, index_layout], outputs=out, local_fn=local_fn, batch_fn=batch_fn)


_LOCAL_ROWS = {}
_ZERO_ROWS = {}


def local_rows(vocab: int, shard: int, local_vocab: int, dtype) -> Tensor:
    """For every global id in [0, vocab), its row in vocabulary shard `shard` (rows
    [shard * local_vocab, (shard + 1) * local_vocab) of the table), or `local_vocab` (the zero
    row appended to the local table) for ids the shard does not hold; cached per argument set.
    An id outside [0, vocab) makes this lookup raise MindSpore's Gather range error, as the
    single-device lookup does."""
    key = (vocab, shard, local_vocab, dtype)
    if key not in _LOCAL_ROWS:
        rows = np.arange(vocab) - shard * local_vocab
        rows[(rows < 0) | (rows >= local_vocab)] = local_vocab
        _LOCAL_ROWS[key] = Tensor(rows, dtype)
    return _LOCAL_ROWS[key]


def zero_row(table: Tensor) -> Tensor:
    """A zero row of `table` (shape (1,) + its row shape, its dtype); cached per shape and dtype."""
    key = (tuple(table.shape[1:]), table.dtype)
    if key not in _ZERO_ROWS:
        _ZERO_ROWS[key] = ops.zeros((1,) + key[0], table.dtype)
    return _ZERO_ROWS[key]


def _gather_other_axis(params, indices, axis: int) -> Decision:
    mesh = params.layout.mesh
    params_dims = [() if d == axis else e for d, e in enumerate(without_partial(params.layout).dims)]
    used = {a for e in params_dims for a in e}
    index_dims = [tuple(a for a in e if a not in used) for e in indices.layout.dims]
    out = params_dims[:axis] + index_dims + params_dims[axis + 1:]
    return Decision(inputs=[make(mesh, params_dims), make(mesh, index_dims)], outputs=make(mesh, out))
