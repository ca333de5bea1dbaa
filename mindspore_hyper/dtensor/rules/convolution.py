"""Convolution and pooling over NCHW images.

Spatial dimensions must be whole on each device (no halo exchange). Conv2D keeps the batch
split, splits output channels as the weight does, and a split input-channel (contraction)
dimension gives Partial(sum) over its axes; a Partial(sum) input stays Partial (convolution is
linear in it). Grouped convolutions keep only the batch split. Pooling keeps batch and channel
splits.
"""
from __future__ import annotations

from functools import lru_cache

from mindspore.ops import operations as P

from mindspore_hyper.dtensor.rules.common import free_entry, make, without_partial
from mindspore_hyper.dtensor.rules.registry import Decision, register

# op name -> number of trailing spatial dimensions (NCHW-style inputs)
POOLING = {
    "MaxPool": 2, "MaxPoolWithArgmaxV2": 2, "AdaptiveAvgPool2D": 2, "AdaptiveMaxPool2D": 2, "AvgPool3D": 3,
    "ResizeNearestNeighborV2": 2,
}


@register("Conv2D")
def conv2d(call):
    if call.attrs.get("data_format", "NCHW") != "NCHW" or len(call.tensors) != 2:
        return None
    x, w = call.tensors
    mesh = x.layout.mesh
    grouped = int(call.attrs.get("group", 1)) != 1
    x_layout = x.layout if set(x.layout.partial.values()) <= {"sum"} else without_partial(x.layout)
    batch, channels = x_layout.dims[0], (() if grouped else x_layout.dims[1])
    used = set(batch) | set(channels) | set(x_layout.partial)
    out_channels = () if grouped else free_entry(w.layout.dims[0], used)
    partial = dict(x_layout.partial)
    partial.update({a: "sum" for a in channels})
    x_in = make(mesh, [batch, channels, (), ()], x_layout.partial)
    w_in = make(mesh, [out_channels, channels, (), ()])
    out = make(mesh, [batch, out_channels, (), ()], partial)
    if not out_channels:
        return Decision(inputs=[x_in, w_in], outputs=out)
    local_out = w_in.local_shape(tuple(w.shape))[0]
    attrs = call.attrs

    def local_fn(call_, inputs, coords):
        return _conv2d(local_out, attrs["kernel_size"], attrs["mode"], attrs["pad_mode"], tuple(attrs["pad"]),
                       tuple(attrs["stride"]), tuple(attrs["dilation"]))(*inputs)

    return Decision(inputs=[x_in, w_in], outputs=out, local_fn=local_fn)


@lru_cache(maxsize=None)
def _conv2d(out_channel, kernel_size, mode, pad_mode, pad, stride, dilation):
    """A Conv2D primitive for a device's share of the output channels (its `out_channel`
    attribute must match the local weight)."""
    return P.Conv2D(out_channel=out_channel, kernel_size=kernel_size, mode=mode, pad_mode=pad_mode, pad=pad,
                    stride=stride[2:], dilation=dilation[2:])


@register(*POOLING)
def pooling(call):
    x = call.tensors[0]
    if call.attrs.get("data_format", call.attrs.get("format", "NCHW")) not in ("NCHW", "NCDHW"):
        return None
    spatial = POOLING[call.name]
    layout = without_partial(x.layout)
    dims = list(layout.dims[:x.ndim - spatial]) + [()] * spatial
    layout = make(layout.mesh, dims)
    return Decision(inputs=[layout] + [make(layout.mesh, [()] * t.ndim) for t in call.tensors[1:]], outputs=layout)
