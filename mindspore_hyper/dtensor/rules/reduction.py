"""Reductions: sum/mean/max/min over dimensions, and reductions over whole dimensions.

Reducing a sharded dimension gives a Partial result over its axes — sum and mean of equal-size
shards combine by sum and avg, max and min by max and min — resolved only when a consumer
needs the whole value. Reductions whose per-shard results do not combine that way (positions,
products, spreads, medians, all/any) gather the reduced dimensions first.
"""
from __future__ import annotations

from mindspore import ops

from mindspore_hyper.dtensor.meta import MetaTensor
from mindspore_hyper.dtensor.rules.common import make, norm_dims, without_partial
from mindspore_hyper.dtensor.rules.registry import Decision, accepts_uneven, register

KINDS = {
    "SumExt": "sum", "ReduceSum": "sum", "DeprecatedSum": "sum", "Sum": "sum",
    "MeanExt": "mean", "ReduceMean": "mean", "DeprecatedMean": "mean", "Mean": "mean",
    "ReduceMax": "max", "Max": "max", "Amax": "max",
    "ReduceMin": "min", "Min": "min", "Amin": "min",
}
_DIM_KW = ("axis", "dim")
_KEEP_KW = ("keepdims", "keep_dims", "keepdim")


def parse_reduction(call):
    """(dims or None for all, keepdim) from positional args, kwargs or primitive attrs."""
    dims, keep, dims_given = None, False, False
    for value in call.inputs[1:]:
        if isinstance(value, bool):
            keep = value
        elif isinstance(value, (int, tuple, list)) and not dims_given:
            dims, dims_given = value, True
    for k in _DIM_KW:
        if k in call.kwargs:
            dims = call.kwargs[k]
    for k in _KEEP_KW:
        if k in call.kwargs and call.kwargs[k] is not None:
            keep = bool(call.kwargs[k])
    if "keep_dims" in call.attrs:
        keep = bool(call.attrs["keep_dims"])
    return dims, keep


@accepts_uneven(lambda call, decision: _mean_of_uneven(call))
@register(*KINDS)
def reduction(call):
    x = call.tensors[0]
    if len(call.tensors) > 1:
        return None
    kind = KINDS[call.name]
    dims, keep = parse_reduction(call)
    reduced = norm_dims(dims, x.ndim) if x.ndim else []
    new_op = {"sum": "sum", "mean": "avg", "max": "max", "min": "min"}[kind]
    layout = x.layout
    sharded_reduced = any(layout.dims[d] for d in reduced)
    if layout.partial and (set(layout.partial.values()) != {new_op} or kind == "mean"):
        # mean of a Partial(sum) is Partial(sum) only if no sharded dim is reduced (no new avg)
        if not (kind == "mean" and set(layout.partial.values()) == {"sum"} and not sharded_reduced):
            layout = without_partial(layout)
    partial = dict(layout.partial)
    out_dims = []
    for d, entry in enumerate(layout.dims):
        if d in reduced:
            partial.update({a: new_op for a in entry})
            if keep:
                out_dims.append(())
        else:
            out_dims.append(entry)
    decision = Decision(inputs=[layout], outputs=make(layout.mesh, out_dims, partial))
    if kind == "sum" and layout.uneven_dims(x.global_shape):
        decision.local_fn = _empty_piece_sum(reduced, keep)
    return decision


def _empty_piece_sum(reduced, keep: bool):
    """The per-piece sum, a device's empty torch.chunk piece (3 rows over 4: 1, 1, 1, 0) padded
    with one zero along each empty dimension first: MindSpore 2.10's CPU ReduceSum of a tensor of
    0 elements returns uninitialised memory (checked: 1.5e36 for a (0, 2) tensor's sum), which
    under msrun became every rank's loss once the Partial sum was reduced. The padding is a
    concat, so the piece stays in the graph (its gradient: zeros) and, under msrun, the backward
    reaches the collectives that made it on this rank too."""
    def local_fn(call, inputs, coords):
        x = inputs[0]
        empty = [d for d, n in enumerate(x.shape) if n == 0]
        if isinstance(x, MetaTensor) or not empty:  # a dry run's shapes: the shape rule
            return call.run(inputs, dict(call.kwargs))
        padded = x
        for d in empty:
            shape = list(padded.shape)
            shape[d] = 1
            padded = ops.concat([padded, ops.zeros(tuple(shape), x.dtype)], d)
        out = call.run([padded] + list(inputs[1:]), dict(call.kwargs))
        kept = [d for d in range(x.ndim) if keep or d not in reduced]  # the result's dimensions
        cut = [d for d in empty if d not in reduced]  # empty in the result too
        for d in cut:
            out = ops.split(out, [1, 0], kept.index(d))[1]
        return out
    return local_fn


def _mean_of_uneven(call):
    """Why a mean cannot reduce uneven pieces (their means do not average to the whole's), else None."""
    x = call.tensors[0]
    if KINDS[call.name] != "mean" or x.ndim == 0:
        return None
    dims, _ = parse_reduction(call)
    uneven = [d for d in norm_dims(dims, x.ndim) if d in x.layout.uneven_dims(x.global_shape)]
    if uneven:
        return (f"a mean over dimension {uneven[0]}, split into uneven pieces, is not the mean of the pieces' means; "
                "redistribute it to Replicate() along that dimension first (or take sum / size)")
    return None


# Reductions whose partial results do not combine by a Partial placement (positions, products,
# spreads, medians, bool all/any) and Unstack: the reduced dimensions must be whole per device.
# None for the dimensions means all of them.
WHOLE_DIMS = ("MaxDim", "MinDim", "ArgMaxExt", "ArgMinExt", "Argmax", "Argmin", "ArgMaxWithValue",
              "ArgMinWithValue", "DeprecatedArgmax", "ProdExt", "ReduceStd", "ReduceAll", "ReduceAny", "Median",
              "Unstack")


@accepts_uneven()
@register(*WHOLE_DIMS)
def whole_dims_reduction(call):
    """Reductions over whole dimensions (see WHOLE_DIMS); every output drops them (or keeps
    them as size 1)."""
    x = call.tensors[0]
    if len(call.tensors) > 1 or x.ndim == 0:
        return None
    dims, keep = parse_reduction(call)
    if dims is None and "axis" in call.attrs:
        dims = call.attrs["axis"]
    if call.attrs.get("global_median", False):
        dims = None
    reduced = norm_dims(dims, x.ndim)
    layout = without_partial(x.layout).with_dims([() if d in reduced else e for d, e in enumerate(x.layout.dims)], {})
    out_dims = [() if d in reduced else e for d, e in enumerate(layout.dims) if keep or d not in reduced]
    return Decision(inputs=[layout], outputs=make(layout.mesh, out_dims))
