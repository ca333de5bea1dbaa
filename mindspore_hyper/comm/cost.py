"""Alpha-beta cost model over a topology: algorithm choice and time estimates.

Every link contributes its latency (alpha) and 1/bandwidth (beta); each transport adds its own
software costs (`TransportParams`: alpha per message, beta per byte, gamma per reduced byte),
measured by a group's ``calibrate()``. Formulas (p ranks, n bytes, worst ring edge or worst pair):

* all_reduce ring: 2(p-1) a + 2(p-1)/p n b + (p-1)/p n g (chunk-pipelined reduce-scatter + all-gather)
* all_reduce recursive_doubling: log2(p) (a + n b + n g) (+ 2 folding steps when p is not a power of 2)
* all_reduce hierarchical: intra-node ring reduce-scatter/all-gather + inter-node all-reduce of n/L
* all_gather / reduce_scatter ring: (p-1)(a + n/p b) (+ reduction); all_to_all pairwise: (p-1)(a + n/p b)
* broadcast binomial: log2(p)(a + n b); pipelined_chain: (p-2+k)(a + n/k b), k = sqrt((p-2) n b / a)

The latency-optimal algorithm wins for small messages, the bandwidth-optimal one for large;
user thresholds (`set_threshold`) and forced algorithms (`force_algorithm`) override the model.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

from mindspore_hyper.comm._common import _C
from mindspore_hyper.comm.topology import Topology, load_topology

__all__ = [
    "KINDS", "TransportParams", "estimate_time", "collective_time", "choose_algorithm", "make_cost_model",
    "set_threshold", "force_algorithm", "clear_overrides", "overrides",
]

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "barrier", "send_recv")
TransportParams = _C.TransportParams

_THRESHOLDS: Dict[str, float] = {}
_FORCED: Dict[str, str] = {}
_TOPOLOGY_CACHE: Dict[Tuple[str, Optional[int]], Topology] = {}


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: expected one of {', '.join(KINDS)}")


def set_threshold(kind: str, nbytes: Optional[int]) -> None:
    """Messages of at most `nbytes` use the latency-optimal algorithm of `kind` (recursive doubling
    for all_reduce, binomial for broadcast); larger ones the model's best of the others.
    None removes the override. Applies to models and groups created afterwards."""
    _check_kind(kind)
    if nbytes is None:
        _THRESHOLDS.pop(kind, None)
    else:
        if nbytes < 0:
            raise ValueError(f"nbytes={nbytes!r}: expected >= 0 or None")
        _THRESHOLDS[kind] = float(nbytes)


def force_algorithm(kind: str, algorithm: Optional[str]) -> None:
    """Always use `algorithm` for `kind` (None or "auto" removes it); validated by the C++ model."""
    _check_kind(kind)
    if algorithm in (None, "auto"):
        _FORCED.pop(kind, None)
        return
    _C.CostModel(None, TransportParams()).force_algorithm(kind, algorithm)  # validates the name
    _FORCED[kind] = algorithm


def clear_overrides() -> None:
    _THRESHOLDS.clear()
    _FORCED.clear()


def overrides() -> dict:
    return {"thresholds": dict(_THRESHOLDS), "forced": dict(_FORCED)}


def apply_overrides(model) -> None:
    for kind, nbytes in _THRESHOLDS.items():
        model.set_threshold(kind, nbytes)
    for kind, algo in _FORCED.items():
        model.force_algorithm(kind, algo)


_PRESET_DEVICES = {"supernode384": 384, "node8": 16, "ring": 8}


def _topology(topology, group: Optional[Sequence[int]] = None) -> Optional[Topology]:
    """A Topology from a spec; a preset name is sized to cover `group` (node8 with 64 devices...)."""
    if topology is None or isinstance(topology, Topology):
        return topology
    n = None
    if isinstance(topology, str) and topology in _PRESET_DEVICES:
        n = max(_PRESET_DEVICES[topology], (max(group) + 1) if group else 0)
    key = (str(topology), n)
    if key not in _TOPOLOGY_CACHE:
        _TOPOLOGY_CACHE[key] = Topology.preset(topology, n) if n is not None else load_topology(topology)
    return _TOPOLOGY_CACHE[key]


def make_cost_model(topology=None, params: Optional[TransportParams] = None,
                    group: Optional[Sequence[int]] = None):
    """A C++ CostModel over `topology` (preset name, YAML path, Topology, or None = uniform) with
    transport costs `params` (default zero: the topology's hardware costs only) and the overrides.
    A preset name is sized to cover the device ids in `group`."""
    topo = _topology(topology, group)
    model = _C.CostModel(topo.cpp if topo is not None else None, params or TransportParams())
    apply_overrides(model)
    return model


def choose_algorithm(kind: str, nbytes: int, group_ranks: Sequence[int], topology="node8",
                     params: Optional[TransportParams] = None) -> Tuple[str, float]:
    """(algorithm, seconds) the library would use for `kind` on `group_ranks` (topology device ids)."""
    _check_kind(kind)
    group = list(group_ranks)
    return tuple(make_cost_model(topology, params, group).choose(kind, float(nbytes), group))


def estimate_time(kind: str, nbytes: int, group_ranks: Sequence[int], topology="node8",
                  params: Optional[TransportParams] = None) -> float:
    """Modelled seconds of one collective of `kind` moving `nbytes` over the devices `group_ranks`
    of `topology`, with the algorithm the library would choose.

    nbytes means: all_reduce/broadcast the buffer per rank; all_gather the gathered output;
    reduce_scatter the input per rank; all_to_all what one rank sends in total; send_recv the
    message (group_ranks = [src, dst]). A group of one device costs 0.
    """
    return choose_algorithm(kind, nbytes, group_ranks, topology, params)[1]


_STEP_KIND = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
              "AllToAll": "all_to_all", "Broadcast": "broadcast"}


def collective_time(kind: str, input_bytes: int, group_ranks: Sequence[int], topology=None) -> float:
    """Modelled seconds of one collective named as a plan step (`AllGather`, ...) whose per-device
    input is `input_bytes`; `topology` defaults to the context flag. "P2P" is one ring step of
    the group (each device sends `input_bytes` to its neighbour: a send_recv between the first two)."""
    if topology is None:
        from mindspore_hyper.context import get_context

        topology = get_context("topology")
    if kind == "P2P":
        group = list(group_ranks)
        return estimate_time("send_recv", int(input_bytes), group[:2], topology) if len(group) > 1 else 0.0
    nbytes = input_bytes * len(group_ranks) if kind == "AllGather" else input_bytes
    return estimate_time(_STEP_KIND[kind], int(nbytes), list(group_ranks), topology)
