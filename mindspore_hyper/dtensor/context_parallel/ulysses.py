"""DeepSpeed-Ulysses attention over the context-parallel axis.

q, k and v arrive sharded along the sequence. One AllToAll each moves them to head-sharded
layouts (every device: the whole sequence for 1/cp of the heads), attention runs there by the
ordinary sharding rules (scores [.., h/cp, t, s] per device), and one AllToAll moves the output
back to sequence-sharded. The AllToAlls are the redistribution planner's, so they run over the
run's collectives in every mode and are recorded in forward and backward.

The heads dimension is the one before the sequence (dim -3: [b, h, t, d], or the fused b*h of
[b*h, t, d]); attention is independent along it, so any split is exact.
"""
from __future__ import annotations

from mindspore import ops

from mindspore_hyper.dtensor.context_parallel.scores import AttentionScores, ordinary
from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.dtensor.rules.common import make

__all__ = ["attention"]


def attention(execution, scores: AttentionScores, value: DTensor) -> DTensor:
    """Ulysses attention of `scores` (softmax pending) with `value` (see module docstring).

    Raises:
        ValueError: the heads dimension does not divide by the devices it would be split over
            (sizes named).
    """
    cp_name = execution.context_parallel.axis
    axis = execution.mesh.axis_index(cp_name)
    q, kt = scores.q, scores.key_t
    heads = q.ndim - 3
    q_layout = _head_sharded(q, axis, heads, cp_name)
    kt_layout = _head_sharded(kt, axis, heads, cp_name, q_layout.dims[heads])
    v_layout = _head_sharded(value, axis, heads, cp_name, q_layout.dims[heads])
    back = make(q.layout.mesh, [tuple(a for a in e if a != axis) for e in q.layout.dims[:-2]] + [(axis,), ()])
    with ordinary():
        qh, kh, vh = q.redistribute(q_layout), kt.redistribute(kt_layout), value.redistribute(v_layout)
        s = ops.matmul(qh, kh)
        for step in scores.steps:
            s = step.apply(s, step.mask)
        out = ops.matmul(ops.softmax(s, -1), vh)
    return out.redistribute(back)


def _head_sharded(t: DTensor, axis: int, heads: int, cp_name: str, head_entry=None):
    """`t`'s layout with the cp axis moved to the heads dimension and its last two dimensions
    whole (`head_entry` forces the heads dimension's axes, to match q's)."""
    mesh = t.layout.mesh
    dims = [tuple(a for a in e if a != axis) for e in t.layout.dims]
    dims[heads] = tuple(head_entry) if head_entry is not None else dims[heads] + (axis,)
    dims[-1] = dims[-2] = ()
    count = 1
    for a in dims[heads]:
        count *= mesh.device_matrix[a]
    if t.shape[heads] % count:
        names = " x ".join(f"{mesh.alias_names[a]}={mesh.device_matrix[a]}" for a in dims[heads])
        raise ValueError(f"context_method='ulysses': the heads dimension {heads} (size {t.shape[heads]}) of a "
                         f"{tuple(t.shape)} attention operand must divide by {count} ({names}; the "
                         f"context-parallel axis {cp_name!r} has {mesh.device_matrix[axis]} devices); "
                         "use context_method='ring' or a head count that divides")
    return make(mesh, dims)
