"""Softmax/LogSoftmax, LayerNorm, RMSNorm, BatchNorm and softmax cross-entropy.

The normalised dimensions must be whole on each device (they are gathered if sharded); all
other dimensions keep their sharding. Partial inputs are reduced first (these ops are not linear).
BatchNorm normalises each channel over batch and space when training (only the channel split
stays; the moving statistics it updates follow the channel split) and is elementwise per
channel when evaluating.
"""
from __future__ import annotations

from mindspore_hyper.dtensor.rules.common import make, norm_dims, unshard_dims, without_partial
from mindspore_hyper.dtensor.rules.registry import Decision, accepts_uneven, register


def _axis_arg(call, default=-1):
    for value in call.inputs[1:]:
        if isinstance(value, (int, tuple, list)) and not isinstance(value, bool):
            return value
    for k in ("axis", "dim"):
        if k in call.kwargs:
            return call.kwargs[k]
    return call.attrs.get("axis", default)


@accepts_uneven()
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


@register("BatchNorm")
def batch_norm(call):
    x = call.tensors[0]
    if call.attrs.get("data_format", "NCHW") != "NCHW" or len(call.tensors) != 5 or x.ndim < 2:
        return None
    flags = [v for v in call.inputs[5:6] if isinstance(v, bool)]
    training = flags[0] if flags else bool(call.attrs.get("is_training", False))
    layout = without_partial(x.layout)
    if training:
        layout = unshard_dims(layout, [d for d in range(x.ndim) if d != 1])
    per_channel = make(layout.mesh, [layout.dims[1]])
    return Decision(inputs=[layout] + [per_channel] * 4, outputs=[layout] + [per_channel] * 4)


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
