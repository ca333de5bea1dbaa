"""The forward of a whole batch through a pipeline's stages across msrun processes (no
microbatches, e.g. an evaluation): each process runs its stages, activations go stage to stage
point-to-point, the output is broadcast from the last stage, and the stages' auxiliary losses
join the loss."""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
from mindspore import Tensor

from mindspore_hyper.pipeline.aux_loss import AuxLosses
from mindspore_hyper.schedule.actions import P2PTensor, Payload

__all__ = ["distributed_forward"]


def distributed_forward(model, inputs) -> Tensor:
    """See PipelineModel.construct (every process must call it)."""
    schedule = model.schedule
    me, owner = model.ranks[0], schedule.stage_to_rank
    tag = schedule.num_microbatches  # a microbatch index no schedule action uses
    last = len(model.split) - 1
    incoming: Dict[int, int] = {}
    for s in range(1, last + 1):
        if owner[s] == me and owner[s - 1] != me:
            incoming[owner[s - 1]] = incoming.get(owner[s - 1], 0) + 1
    model.transport.expect(incoming)
    x, out = inputs[0], None
    with AuxLosses() as aux:
        for s in model.held_stages():
            if s > 0 and owner[s - 1] != me:
                x = model.transport.recv(P2PTensor(Payload.ACTIVATION, s - 1, s, tag), owner[s - 1])
                x = x if isinstance(x, Tensor) else Tensor(x)
            run = model.stage_models.get(s, model.stage_cells[s])
            x = run(x, *model.stage_inputs(s, inputs))
            if s == last:
                out = x
            elif owner[s + 1] != me:
                model.transport.send(me, P2PTensor(Payload.ACTIVATION, s, s + 1, tag), x, owner[s + 1])
    model.transport.flush()
    out = _broadcast_output(model.runtime, out, model.process_of(owner[last]))
    if model.layers.loss is not None and model.world.size > 1:  # the stages' auxiliary losses join the loss
        local = float(aux.total().asnumpy()) if aux else 0.0
        parts = model.runtime.gather_values(np.array([local], dtype=np.float64))
        out = out + float(sum(parts[model.process_of(r), 0] for r in range(schedule.num_ranks)))
    return out


def _broadcast_output(runtime, out: Optional[Tensor], root: int) -> Tensor:
    """The last stage's output on every process (its shape first, then its values)."""
    header = np.zeros(9, dtype=np.int64)
    if out is not None:
        header[0] = out.ndim
        header[1:1 + out.ndim] = out.shape
    header = runtime.broadcast_values(header, root)
    shape = tuple(int(d) for d in header[1:1 + int(header[0])])
    value = out.asnumpy().astype(np.float32) if out is not None else np.zeros(shape, np.float32)
    return Tensor(runtime.broadcast_values(np.ascontiguousarray(value), root))
