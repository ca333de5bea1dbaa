"""Softmax/LogSoftmax, LayerNorm, RMSNorm and softmax cross-entropy.

The normalised dimensions must be whole on each device (they are gathered if sharded); all
other dimensions keep their sharding. Partial inputs are reduced first (these ops are not linear).
"""
from __future__ import annotations

from mindspore_hyper.dtensor.rules.common import make, norm_dims, unshard_dims
from mindspore_hyper.dtensor.rules.registry import Decision, register


def _axis_arg(call, default=-1):
    for value in call.inputs[1:]:
        if isinstance(value, (int, tuple, list)) and not isinstance(value, bool):
            return value
    for k in ("axis", "dim"):
        if k in call.kwargs:
            return call.kwargs[k]
    return call.attrs.get("axis", default)


@register("Softmax", "LogSoftmax", "SoftmaxExt", "LogSoftmaxExt")
def softmax(call):
    x = call.tensors[0]
    axes = norm_dims(_axis_arg(call), x.ndim)
    layout = unshard_dims(x.layout, axes)
    return Decision(inputs=[layout], outputs=layout)


@register("LayerNorm")
def layer_norm(call):
    x, gamma, beta = call.tensors[:3]
    begin_norm = call.attrs.get("begin_norm_axis", -1) % x.ndim
    layout = unshard_dims(x.layout, range(begin_norm, x.ndim))
    mesh = x.layout.mesh
    stats = make(mesh, list(layout.dims[:begin_norm]) + [()] * (x.ndim - begin_norm))
    return Decision(
        inputs=[layout, make(mesh, [()] * gamma.ndim), make(mesh, [()] * beta.ndim)],
        outputs=[layout, stats, stats],
    )


@register("RmsNorm")
def rms_norm(call):
    x, gamma = call.tensors[:2]
    mesh = x.layout.mesh
    begin = x.ndim - gamma.ndim
    layout = unshard_dims(x.layout, range(begin, x.ndim))
    stats = make(mesh, list(layout.dims[:begin]) + [()] * gamma.ndim)
    return Decision(inputs=[layout, make(mesh, [()] * gamma.ndim)], outputs=[layout, stats])


@register("SoftmaxCrossEntropyWithLogits")
def softmax_cross_entropy(call):
    logits, labels = call.tensors[:2]
    mesh = logits.layout.mesh
    layout = unshard_dims(logits.layout, [logits.ndim - 1])
    batch = make(mesh, [layout.dims[0]])
    return Decision(inputs=[layout, layout], outputs=[batch, layout])


@register("SparseSoftmaxCrossEntropyWithLogits")
def sparse_softmax_cross_entropy(call):
    logits, labels = call.tensors[:2]
    if call.attrs.get("is_grad", False):
        return None
    mesh = logits.layout.mesh
    layout = unshard_dims(logits.layout, [logits.ndim - 1])
    batch_axes = layout.dims[0]
    label_layout = make(mesh, [batch_axes] + [()] * (labels.ndim - 1))
    loss = make(mesh, [], {a: "avg" for a in batch_axes})  # mean over the local batch
    return Decision(inputs=[layout, label_layout], outputs=loss)
