"""Routing one expert-parallel call: the tokens laid out over the token axes, each device's
tokens routed and their dispatch planned (no exchange yet), and the whole batch's auxiliary loss
(the devices' routing sums added over the token axes first, as on one device)."""
from __future__ import annotations

import math

import numpy as np
from mindspore import Tensor

from mindspore_hyper.dtensor.dispatch import _fan_out, parameter_dtensor, replicated_dtensor
from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.dtensor.meta import MetaTensor
from mindspore_hyper.moe.expert_state import Axes, Prepared
from mindspore_hyper.moe.losses import logsumexp_square_sum
from mindspore_hyper.moe.token_dispatch import expert_capacity, plan_dispatch
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["route_call"]


def _param(ex, cell, name: str) -> DTensor:
    """`cell`'s parameter `name` as a DTensor of this execution (as the strategy lays it out)."""
    value = cell.__dict__.get(name)
    if isinstance(value, DTensor):
        return value
    param = cell._params[name]
    if id(param) in ex.parameters:
        return parameter_dtensor(ex, param)
    return replicated_dtensor(ex, param)


def route_call(moe, x: DTensor, placement, scheme_for) -> Prepared:
    """Lay `moe`'s input `x` out, route it and plan every device's dispatch over the logical
    experts (`placement`: the physical ones' count); `scheme_for(axes)` picks the dispatch scheme."""
    ex = x.execution
    weights = (_param(ex, moe.router, "weight"), _param(ex, moe.experts, "w_gate"),
               _param(ex, moe.experts, "w_up"), _param(ex, moe.experts, "w_down"))
    router_bias = _param(ex, moe.router, "bias") if moe.router.bias is not None else None
    biases = tuple(_param(ex, moe.experts, n) for n in ("b_gate", "b_up", "b_down")) if moe.experts.has_bias else ()
    num_tokens = math.prod(x.shape[:-1])
    xt = x.reshape(num_tokens, moe.hidden)
    physical = moe.num_experts if placement is None else placement.num_physical
    axes = Axes.of_call(ex, xt, weights, physical, router_bias, biases)
    layout = TensorLayout.from_dims(ex.mesh, [list(axes.token), []])
    if num_tokens % layout.shard_count(0):
        raise ValueError(f"MoE expert parallel: {num_tokens} tokens do not split over the token axes "
                         f"{[ex.mesh.alias_names[a] for a in axes.token]} ({layout.shard_count(0)} devices)")
    xt = xt.redistribute(layout)
    wr, wg, wu, wd = weights
    if axes.token:  # every device routes its own tokens: the router's gradient summed over them
        wr = _fan_out(ex, wr, list(axes.token))
        router_bias = None if router_bias is None else _fan_out(ex, router_bias, list(axes.token))
    data = [a for a in axes.token if a not in axes.expert]
    if data:
        wg, wu, wd = (_fan_out(ex, w, data) for w in (wg, wu, wd))
        biases = tuple(_fan_out(ex, b, data) for b in biases)
    local_tokens = num_tokens // layout.shard_count(0)
    capacity = expert_capacity(local_tokens, moe.num_experts, moe.top_k, moe.capacity_factor)
    tokens, plans, gates = {}, {}, {}
    prob_sums, sq_sums, choice_counts = [], [], []
    for key in ex.keys(axes.token):
        tokens[key] = xt.shards[key]
        routing = moe.router.route(tokens[key], wr.shards[()], moe.router.noise(local_tokens),
                                   None if router_bias is None else router_bias.shards[()])
        plans[key] = plan_dispatch(routing.experts, moe.num_experts, capacity)
        gates[key] = routing.gates
        prob_sums.append(routing.probs.sum(0))
        sq_sums.append(logsumexp_square_sum(routing.logits))
        choice_counts.append(Tensor(plans[key].choice_counts.astype(np.float32)))
    aux = _aux(moe, ex, axes, prob_sums, sq_sums, choice_counts, num_tokens)
    return Prepared(tuple(x.shape), layout, axes, (wg, wu, wd) + biases, tokens, plans, gates, aux, scheme_for(axes),
                    moe.experts.clamp)


def _aux(moe, ex, axes: Axes, prob_sums, sq_sums, choice_counts, num_tokens: int) -> Tensor:
    """The whole batch's auxiliary loss: the devices' routing sums added over the token axes first
    (and `moe.last_expert_counts`, the whole batch's choices per expert)."""
    if axes.token:
        group = ex.group(axes.token, {})
        coll = ex.collectives
        prob_sums = coll.all_reduce(prob_sums, "sum", group)
        sq_sums = coll.all_reduce(sq_sums, "sum", group)
        choice_counts = coll.all_reduce(choice_counts, "sum", group)
    counts = choice_counts[0]
    # a dry run has no routing values: its choices are the balanced assumption, counted none
    moe.last_expert_counts = None if isinstance(counts, MetaTensor) else counts.asnumpy().astype(np.int64)
    return moe.aux_loss(prob_sums[0], choice_counts[0], sq_sums[0], num_tokens)
