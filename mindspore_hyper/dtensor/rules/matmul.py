"""MatMul family, Dense and BiasAdd.

Sharding the contraction dimension yields Partial(sum) over its axes; a Partial(sum) left
operand stays Partial (matmul is linear in it). The right operand follows the left one's batch
and contraction layout; its output dimension keeps its own axes unless the left operand uses them.
"""
from __future__ import annotations

from mindspore import ops

from mindspore_hyper.dtensor.rules.common import free_entry, make, without_partial
from mindspore_hyper.dtensor.rules.registry import Decision, accepts_uneven, register


def _empty_pieces_safe(decision: Decision, tensors, out_shape) -> Decision:
    """`decision`, its op run on a device holding an empty torch.chunk piece (6 features over 4
    devices: 2, 2, 2, 0; 3 rows over 4: 1, 1, 1, 0) with each empty operand replaced by zeros one
    element long in its empty dimensions, the result cut back to its empty size. MindSpore 2.10's
    CPU MatMul with a contraction of 0 elements returns uninitialised memory (checked: a
    (2, 0) @ (0, 3) product held nonzero values), where the right value is zeros; the same
    product appears in the backward of an empty output or row piece (dx = dy @ w with dy empty
    along the contraction). With the zero slices the forward is exact and every gradient is
    zero where it must be. The zeros are fresh, so the empty piece leaves the gradient graph
    (keeping it in by concatenation trips MindSpore's StridedSliceGrad on the empty result): under
    msrun, where empty parameter pieces are refused, an empty activation piece with a collective
    behind it in the backward is not tested. `out_shape(a_shape, b_shape)` gives the local result's
    shape. Only uneven layouts can leave a piece empty; even ones keep the plain (batched) path."""
    if not any(layout.uneven_dims(tuple(t.shape)) for layout, t in zip(decision.inputs, tensors)):
        return decision

    def local_fn(call, inputs, coords):
        n = len(tensors)
        if not any(0 in tuple(x.shape) for x in inputs[:n]):
            return call.run(inputs, dict(call.kwargs))
        target = out_shape(tuple(inputs[0].shape), tuple(inputs[1].shape))
        padded = [ops.zeros(tuple(max(d, 1) for d in x.shape), x.dtype) if 0 in tuple(x.shape) else x
                  for x in inputs[:n]]
        out = call.run(padded + list(inputs[n:]), dict(call.kwargs))
        return out[tuple(slice(0, d) for d in target)]

    decision.local_fn = local_fn
    return decision


def _matmul_shape(ta: bool, tb: bool):
    """The local MatMul result's shape from its operands' (right-aligned batch broadcast)."""
    def shape(a, b):
        m = a[-1] if ta else a[-2]
        n = b[-2] if tb else b[-1]
        batch_a, batch_b = list(a[:-2]), list(b[:-2])
        nd = max(len(batch_a), len(batch_b))
        batch_a, batch_b = [1] * (nd - len(batch_a)) + batch_a, [1] * (nd - len(batch_b)) + batch_b
        batch = [0 if 0 in (x, y) else max(x, y) for x, y in zip(batch_a, batch_b)]
        return tuple(batch) + (m, n)
    return shape


def _flags(call):
    name = call.name
    if name in ("MatMul", "BatchMatMul"):
        inputs = call.inputs
        ta = bool(inputs[2]) if len(inputs) > 2 else bool(call.attrs.get("transpose_a", False))
        tb = bool(inputs[3]) if len(inputs) > 3 else bool(call.attrs.get("transpose_b", False))
        return ta, tb
    return False, False


@accepts_uneven()
@register("MatMul", "MatMulExt", "BatchMatMul", "BatchMatMulExt", "Bmm", "BmmExt")
def matmul(call):
    a, b = call.tensors[0], call.tensors[1]
    if a.ndim < 2 or b.ndim < 2:
        return None
    mesh = a.layout.mesh
    ta, tb = _flags(call)
    na, nb = a.ndim, b.ndim
    a_m, a_k = (na - 1, na - 2) if ta else (na - 2, na - 1)
    b_k, b_n = (nb - 1, nb - 2) if tb else (nb - 2, nb - 1)
    a_layout = a.layout if set(a.layout.partial.values()) <= {"sum"} else without_partial(a.layout)
    a_dims = [list(e) for e in a_layout.dims]
    out_nd = max(na, nb)
    out_batch = [()] * (out_nd - 2)
    # batch dims: right-aligned broadcasting
    for i in range(out_nd - 2):
        da, db = i - (out_nd - na), i - (out_nd - nb)
        if da >= 0 and (db < 0 or a.shape[da] == b.shape[db] or b.shape[db] == 1) and a.shape[da] > 1:
            out_batch[i] = tuple(a_dims[da])
        elif da >= 0:
            a_dims[da] = []  # broadcast batch dim of a must be whole
    used = {x for e in a_dims for x in e} | set(a_layout.partial)
    b_dims = [()] * nb
    for i in range(out_nd - 2):
        db = i - (out_nd - nb)
        if db >= 0 and b.shape[db] > 1:
            b_dims[db] = out_batch[i]
    b_dims[b_k] = tuple(a_dims[a_k])
    b_dims[b_n] = free_entry(b.layout.dims[b_n], used)
    out_dims = list(out_batch) + [tuple(a_dims[a_m]), b_dims[b_n]]
    partial = dict(a_layout.partial)
    partial.update({x: "sum" for x in a_dims[a_k]})
    decision = Decision(
        inputs=[make(mesh, a_dims, a_layout.partial), make(mesh, b_dims)],
        outputs=make(mesh, out_dims, partial),
    )
    return _empty_pieces_safe(decision, call.tensors[:2], _matmul_shape(ta, tb))


@accepts_uneven()
@register("BiasAdd")
def bias_add(call):
    x = call.tensors[0]
    fmt = call.inputs[2] if len(call.inputs) > 2 and isinstance(call.inputs[2], str) else call.attrs.get("data_format", "NCHW")
    channel = x.ndim - 1 if (fmt in ("NHWC",) or x.ndim == 2) else 1
    mesh = x.layout.mesh
    layout = x.layout if set(x.layout.partial.values()) <= {"sum"} else without_partial(x.layout)
    bias_layout = make(mesh, [layout.dims[channel]], layout.partial)  # Partial(sum): added once
    return Decision(inputs=[layout, bias_layout], outputs=layout)


@accepts_uneven()
@register("Dense")
def dense(call):
    """x @ w.T + b (what mint.nn.functional.linear and ops.dense run): like MatMul with the
    weight's rows as the output features; the bias follows them and is added once under
    Partial(sum)."""
    x, w = call.tensors[0], call.tensors[1]
    if x.ndim < 1 or w.ndim != 2:
        return None
    mesh = x.layout.mesh
    x_layout = x.layout if set(x.layout.partial.values()) <= {"sum"} else without_partial(x.layout)
    contraction = x_layout.dims[-1]
    used = {a for e in x_layout.dims for a in e} | set(x_layout.partial)
    features = free_entry(w.layout.dims[0], used)
    partial = dict(x_layout.partial)
    partial.update({a: "sum" for a in contraction})
    inputs = [x_layout, make(mesh, [features, contraction])]
    if len(call.tensors) > 2:
        inputs.append(make(mesh, [features], partial))
    decision = Decision(inputs=inputs, outputs=make(mesh, list(x_layout.dims[:-1]) + [features], partial))
    return _empty_pieces_safe(decision, call.tensors, lambda x_shape, w_shape: x_shape[:-1] + w_shape[:1])
