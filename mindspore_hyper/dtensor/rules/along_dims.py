"""Same-shape ops that act along some dimensions: scans, sorts, top-k, flips, triangles, L2
normalisation.

The dimensions an op acts along must be whole on each device (gathered if split); every other
dimension keeps its split, and every output (values, indices) has the input's layout. Partial
inputs are reduced first (none of these ops is linear in a way a Partial value survives).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from mindspore_hyper.dtensor.rules.common import make, norm_dims, unshard_dims
from mindspore_hyper.dtensor.rules.registry import Decision, accepts_uneven, register


@dataclass(frozen=True)
class Dims:
    """Where an op's dimensions are: argument `position` (an int, a sequence of ints or a 0-d
    tensor), else the primitive attribute `attr`, else `default`."""

    position: Optional[int] = None
    attr: Optional[str] = None
    default: Any = None

    def read(self, call):
        if self.position is not None and len(call.inputs) > self.position:
            value = call.inputs[self.position]
            return int(value) if hasattr(value, "layout") else value  # a 0-d tensor axis
        if self.attr is not None and self.attr in call.attrs:
            return call.attrs[self.attr]
        return self.default


ALONG = {
    "CumSum": Dims(1), "CumProd": Dims(1), "Cummax": Dims(1), "Cummin": Dims(1, "axis"),
    "CumulativeLogsumexp": Dims(1), "ReverseV2": Dims(1), "Sort": Dims(attr="axis", default=-1),
    "TopK": Dims(default=-1), "L2Normalize": Dims(attr="axis"), "Tril": Dims(default=(-2, -1)),
    "Triu": Dims(default=(-2, -1)),
}


@accepts_uneven()
@register(*ALONG)
def along_dims(call):
    x = call.tensors[0]
    dims = ALONG[call.name].read(call)
    if dims is None or x.ndim == 0:
        return None
    layout = unshard_dims(x.layout, norm_dims(dims, x.ndim))
    others = [make(layout.mesh, [()] * t.ndim) for t in call.tensors[1:]]  # e.g. a 0-d tensor axis
    return Decision(inputs=[layout] + others, outputs=layout)
