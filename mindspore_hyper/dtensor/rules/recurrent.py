"""The fused LSTM primitive (what nn.LSTM runs on CPU): split over the batch only.

Inputs are x (seq, batch, input), h0 and c0 (layers*directions, batch, hidden) and the flat
weights; each device runs its batch share with the whole weights. Outputs y, hy and cy keep the
batch split. The kernel's two workspace outputs have no global meaning (their size is not a
function of the batch); they are returned as None, so reading them fails instead of returning
one device's workspace (nn.LSTM ignores them; autograd keeps each device's own).
"""
from __future__ import annotations

from mindspore_hyper.dtensor.rules.common import make
from mindspore_hyper.dtensor.rules.registry import Decision, register


@register("LSTM")
def lstm(call):
    if len(call.tensors) != 4:
        return None
    x, h, c, w = call.tensors
    mesh = x.layout.mesh
    batch = x.layout.dims[1]
    per_batch = make(mesh, [(), batch, ()])

    def local_fn(call_, inputs, coords):
        y, hy, cy, _, _ = call_.run(inputs)
        return y, hy, cy, None, None

    return Decision(inputs=[per_batch, per_batch, per_batch, make(mesh, [()] * w.ndim)],
                    outputs=[per_batch] * 3, local_fn=local_fn)
