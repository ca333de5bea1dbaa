"""The values one expert-parallel call passes between its steps: the mesh axes, the routing
shared by a call's chunks, what a dispatch leaves for its combine, and what dispatch and compute
hand over (shared by `expert_parallel.ExpertParallel` and its dispatch schemes)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Hashable, Optional, Tuple

from mindspore import Tensor

from mindspore_hyper.moe.token_dispatch import DispatchPlan
from mindspore_hyper.shard.tensor_layout import TensorLayout

__all__ = ["Key", "Axes", "ExpertInputs", "ExpertOutputs", "Prepared", "State"]

Key = Tuple[int, ...]  # a device's coordinates on the token axes


def _names(mesh, dims) -> tuple:
    """A layout's dims as alias tuples (None for a whole dimension), for messages."""
    return tuple(tuple(mesh.alias_names[a] for a in d) or None for d in dims)


@dataclass
class Axes:
    """The mesh axes of one call (see `expert_parallel`)."""

    token: Tuple[int, ...]  # ascending
    expert: Tuple[int, ...]  # in the expert weights' order (member index = mixed radix over them)
    tensor: Tuple[int, ...]  # the experts' F split, in the weights' order
    members: int  # devices in an expert group
    per_member: int  # (physical) experts per device

    @classmethod
    def of_call(cls, ex, x, weights, physical: int, router_bias=None, biases=()) -> "Axes":
        """The axes of a call on tokens `x` [T, H] (a DTensor) with the weights (router, w_gate,
        w_up, w_down), the router's bias (or None) and the experts' biases (b_gate, b_up, b_down,
        or ()) as laid out, over `physical` experts.

        Raises:
            ValueError: the router weight or bias is split; the expert weights are not split as one
                (experts on dim 0, F on the same axes, biases alike); the experts do not split over
                the devices.
        """
        wr, wg, wu, wd = weights
        mesh = ex.mesh
        for name, w in (("weight", wr), ("bias", router_bias)):
            if w is not None and (w.layout.sharded_axes() or w.layout.is_partial):
                raise ValueError(f"MoE expert parallel: the router {name} must be replicated; the strategy lays it "
                                 f"out as {w.layout.tensor_map}")
        expert = tuple(wg.layout.dims[0])
        tensor = tuple(wg.layout.dims[2])
        expect = {"w_gate": (expert, (), tensor), "w_up": (expert, (), tensor), "w_down": (expert, tensor, ()),
                  "b_gate": (expert, tensor), "b_up": (expert, tensor), "b_down": (expert, ())}
        named = [("w_gate", wg), ("w_up", wu), ("w_down", wd)] + list(zip(("b_gate", "b_up", "b_down"), biases))
        for name, w in named:
            if tuple(tuple(d) for d in w.layout.dims) != expect[name] or w.layout.is_partial:
                raise ValueError(f"MoE expert parallel: experts.{name} is laid out as {_names(mesh, w.layout.dims)}; "
                                 f"expected {_names(mesh, expect[name])} (experts split on dim 0, the feed-forward "
                                 f"dimension on the same axes in every expert weight)")
        tokens_dim = x.layout.dims[0] if x.ndim == 2 else ()
        token = tuple(sorted((set(tokens_dim) | set(expert)) - set(tensor)))
        members = math.prod(mesh.device_matrix[a] for a in expert)
        if physical % members:
            raise ValueError(f"MoE expert parallel: {physical} experts do not split over {members} devices")
        return cls(token, expert, tensor, members, physical // members)

    def local(self, ex) -> bool:
        """Every member of the expert groups is in this process (simulation, or no expert axis)."""
        return ex.holds_all_ranks or self.members == 1

    def member(self, ex, key: Key) -> int:
        """The member index in its expert group of the device with token key `key`."""
        return ex.member_index(self.expert, dict(zip(self.token, key)))

    def key_of_member(self, ex, key: Key, member: int) -> Key:
        """The token key of member `member` of the expert group of token key `key`."""
        coords = dict(zip(self.token, key))
        for a in reversed(self.expert):
            coords[a] = member % ex.mesh.device_matrix[a]
            member //= ex.mesh.device_matrix[a]
        return tuple(coords[a] for a in self.token)


@dataclass
class ExpertInputs:
    """What dispatch delivered: received[dest token key][source][expert slot] -> rows or None."""

    microbatch: Hashable
    received: Dict[Key, Dict[Hashable, Dict[int, Optional[Tensor]]]]


@dataclass
class ExpertOutputs:
    """Expert outputs in the same structure, to be sent back by combine."""

    microbatch: Hashable
    outputs: Dict[Key, Dict[Hashable, Dict[int, Optional[Tensor]]]]


@dataclass
class Prepared:
    """One call's routing, shared by its chunks."""

    x_shape: tuple
    layout: TensorLayout
    axes: Axes
    weights: tuple  # the expert weights (w_gate, w_up, w_down[, b_gate, b_up, b_down]) as laid out for this call
    tokens: Dict[Key, Tensor]  # this call's token shards [T_local, H] by token key
    plans: Dict[Key, DispatchPlan]  # over the logical experts, all local tokens
    gates: Dict[Key, Tensor]
    aux: Tensor
    scheme: object  # the dispatch scheme moving this call's rows (`dispatch_scheme.DispatchScheme`)
    clamp: Optional[tuple] = None  # the experts' clamped SwiGLU (alpha, limit), None for SwiGLU


@dataclass
class State:
    """What a dispatch (of a microbatch, or a chunk of one) leaves for its combine."""

    prep: Prepared
    rows: slice  # the chunk's local token rows
    plans: Dict[Key, DispatchPlan] = field(default_factory=dict)  # the chunk's (physical) plans
    gates: Dict[Key, Tensor] = field(default_factory=dict)
    exchange: object = None  # the exchange moving its rows (`exchange.InProcessExchange`, ...)
    pending: object = None  # hierarchical: the received segments, then the rows combine brought back
    gathered: Dict[tuple, list] = field(default_factory=dict)  # all experts' weights, with a placement
    groups: object = None  # the link groups (`hierarchical.ExpertGroups`) the dispatch counted over
    hops: object = None  # hierarchical dispatch: what its hops leave for combine (`hierarchical_scheme.TwoHops`)
    group_sends: Optional[dict] = None  # hierarchical dispatch: per source key, its GroupRows
    chain: Optional[Tensor] = None  # msrun: the last exchange's output (`ProcessExchange.chained`)
    loads: object = None  # every member's rows when devices route alike (`member_loads.MemberLoads`), else None
    # the exchange buffers counted live (`exchange_buffers`): bytes, or ranks -> bytes; None when not counted
    dispatch_buffers: object = None
    combine_buffers: object = None

    @property
    def axes(self) -> Axes:
        return self.prep.axes

    @property
    def weights(self) -> tuple:
        return self.prep.weights
