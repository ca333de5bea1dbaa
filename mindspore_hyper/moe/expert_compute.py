"""The experts' step of an expert-parallel call: every local expert on the rows dispatch
delivered to its device (tensor-parallel experts: on their slice of F, the partial sums
all-reduced over the tensor axes; with a placement, on the replicas' all-gathered weights).

The experts work on plain tensors (the rows each device received), which the DTensor accounting
does not see; their activations are counted by a model (`expert_activation_bytes`), so the
memory figures follow the routing: each expert member its own rows under the balanced assumption
or a given histogram (`member_loads`), else the device the accounting represents (the first of
the token keys: device 0's learned loads in simulation, each process's own under msrun). The
dispatch's exchange buffers (`exchange_buffers`) are freed as the experts take their input. Their
matmuls and SwiGLU products are recorded as timed ops for the same devices (`expert_ops`), so the
step-time prediction counts the experts' FLOPs."""
from __future__ import annotations

from typing import Dict

from mindspore import ops

from mindspore_hyper.dtensor.dtensor import significant_axes
from mindspore_hyper.moe import exchange_buffers
from mindspore_hyper.moe.exchange import split_rows
from mindspore_hyper.moe.expert_ops import expert_ops, record_expert_ops
from mindspore_hyper.moe.experts import swiglu
from mindspore_hyper.moe.expert_state import Key, State

__all__ = ["run_experts", "expert_activation_bytes"]


def run_experts(state: State, received: Dict[Key, dict], placement) -> Dict[Key, dict]:
    """received[dest key][source][slot] -> rows: the experts' outputs in the same structure."""
    ex = state.weights[0].execution
    axes = state.axes
    if state.dispatch_buffers is not None:  # the experts take their input: the exchange buffers go
        exchange_buffers.free(ex.accounting, state.dispatch_buffers)
        state.dispatch_buffers = None
    outputs = {}
    for key, by_src in received.items():
        order = [(slot, src) for slot in range(axes.per_member) for src in sorted(by_src)
                 if by_src[src].get(slot) is not None]
        outputs[key] = {src: {slot: None for slot in range(axes.per_member)} for src in by_src}
        if not order:
            continue
        pieces = [by_src[src][slot] for slot, src in order]
        rows = pieces[0] if len(pieces) == 1 else ops.concat(pieces, 0)
        tp_group = ex.group(axes.tensor, dict(zip(axes.token, key))) if axes.tensor else None
        if tp_group is not None:
            rows = ex.collectives.fan_out(rows, tp_group)
        sizes = [int(p.shape[0]) for p in pieces]
        slot_sizes = [sum(n for (s, _), n in zip(order, sizes) if s == slot) for slot in range(axes.per_member)]
        results = []
        slot_rows = split_rows(rows, slot_sizes)
        clamp = state.prep.clamp
        for tp_key in (ex.keys(axes.tensor) if axes.tensor else [()]):
            per_slot = [ops.unstack(w, 0) for w in _weights(ex, state, key, tp_key, placement)]
            # with F split over tensor, b_down is added once, to the sum of the partial outputs
            down_bias = len(per_slot) == 6 and tp_group is None
            outs = [swiglu(r, *[w[slot] for w in per_slot[:3]], *[b[slot] for b in per_slot[3:5]],
                           per_slot[5][slot] if down_bias else None, clamp=clamp)
                    for slot, r in enumerate(slot_rows) if r is not None]
            results.append(outs[0] if len(outs) == 1 else ops.concat(outs, 0))
        if tp_group is not None:
            if len(results) != len(tp_group.local):
                raise AssertionError(f"{len(results)} tensor-parallel results for {tp_group}")
            results = ex.collectives.all_reduce(results, "sum", tp_group)
            if len(state.weights) == 6:
                b_down = ops.unstack(_weights(ex, state, key, ex.keys(axes.tensor)[0], placement)[5], 0)
                rows_bias = [ops.broadcast_to(b_down[slot].reshape(1, -1), (n, b_down[slot].shape[0]))
                             for slot, n in enumerate(slot_sizes) if n]
                results[0] = results[0] + (rows_bias[0] if len(rows_bias) == 1 else ops.concat(rows_bias, 0))
        for (slot, src), piece in zip(order, split_rows(results[0], sizes)):
            outputs[key][src][slot] = piece
        if key == ex.keys(axes.token)[0] and state.loads is None:  # the device the accounting counts
            tp_key = ex.keys(axes.tensor)[0] if axes.tensor else ()
            w_gate = _weights(ex, state, key, tp_key, placement)[0]
            hidden, f_local, itemsize = int(rows.shape[-1]), int(w_gate.shape[-1]), rows.dtype.itemsize
            record_expert_ops(ex.accounting, expert_ops(slot_sizes, hidden, f_local, itemsize, w_gate.dtype.itemsize))
            _hold(ex, expert_activation_bytes(sum(sizes), hidden, f_local, itemsize))
    loads = state.loads
    if loads is not None:  # every member its own rows (`member_loads`)
        key = next(iter(state.plans))
        tp_key = ex.keys(axes.tensor)[0] if axes.tensor else ()
        w_gate = _weights(ex, state, key, tp_key, placement)[0]
        _, hidden, f_local = (int(n) for n in w_gate.shape)
        itemsize = state.prep.tokens[key].dtype.itemsize
        record_expert_ops(ex.accounting, loads.by_ranks(lambda m: expert_ops(
            loads.received_per_slot(m), hidden, f_local, itemsize, w_gate.dtype.itemsize)))
        _hold(ex, loads.by_ranks(lambda m: expert_activation_bytes(loads.received(m), hidden, f_local, itemsize)))
    return outputs


def expert_activation_bytes(rows: int, hidden: int, ffn_local: int, itemsize: int) -> int:
    """What a device's experts keep for their backward, modelled: their input rows and output
    rows (rows x hidden each) and SwiGLU's gate, up, activated gate and product (rows x
    ffn_local each: its slice of F under tensor-parallel experts), in bytes.

    Args:
        rows: token copies the device's experts received (all its local experts together).
        hidden: H.
        ffn_local: the experts' feed-forward width on this device.
        itemsize: bytes per element.
    """
    return (2 * rows * hidden + 4 * rows * ffn_local) * itemsize


def _hold(ex, nbytes) -> None:
    """Count `nbytes` of expert activations (bytes, or ranks -> bytes per program): held to the
    step's end in a training forward, else alive only during the call."""
    if ex.holds_activations:
        if isinstance(nbytes, dict):
            ex.accounting.hold_by_ranks(nbytes)
        else:
            ex.accounting.hold(nbytes)
    else:
        exchange_buffers.allocate(ex.accounting, nbytes)
        exchange_buffers.free(ex.accounting, nbytes)


def _weights(ex, state: State, key: Key, tp_key: Key, placement):
    """This device's expert weights [per, H, F_local] ... for token key `key`, tensor key `tp_key`."""
    axes = state.axes
    coords = dict(zip(axes.token, key))
    coords.update(zip(axes.tensor, tp_key))
    if placement is None:
        return [w.shards[tuple(coords[a] for a in significant_axes(w.layout))] for w in state.weights]
    # replicas: every logical expert's weights (this tensor slice), all-gathered over the
    # expert axes (backward: reduce-scatter, so each replica's gradient reaches its expert)
    cache_key = tuple(sorted((a, c) for a, c in coords.items() if a not in axes.expert))
    if cache_key not in state.gathered:
        group = ex.group(axes.expert, {a: c for a, c in coords.items() if a not in axes.expert})
        gathered = []
        for w in state.weights:
            sig = significant_axes(w.layout)
            shards = [w.shards[tuple(ex.mesh.coords(group.ranks[i])[a] for a in sig)] for i in group.local]
            gathered.append(ex.collectives.all_gather(shards, 0, group, grad_partial=True)[0]
                            if group.size > 1 else shards[0])
        state.gathered[cache_key] = gathered
    return placement.member_weights(axes.member(ex, key), axes.per_member, state.gathered[cache_key])
