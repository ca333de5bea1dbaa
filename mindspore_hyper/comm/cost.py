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

On a network given as levels (`levels.Level`: a cluster too large for a device graph, the
step-time estimator's hardware) `hierarchical_time` is the same model with the hierarchical
algorithms of every level (as NCCL's and HCCL's), in pure Python. Per level i, f_i is the group's
fan-out (`levels.group_fanouts`), a_i and b_i the level's alpha and beta, n the bytes of the
formula and n_i = n / (f_0 ... f_{i-1}) what is left after the inner levels reduced or split it:

* all_reduce:      sum_i 2 (f_i - 1) a_i + 2 (f_i - 1) / f_i  n_i b_i
  (with two levels: the hierarchical all_reduce above, without the reduction term)
* all_gather, reduce_scatter (n = the full, unsplit buffer):
                   sum_i (f_i - 1) a_i + (f_i - 1) / f_i  n_i b_i
* all_to_all (n = what one rank sends in total): the share of peers first reached at level i,
  (P_i - P_{i-1}) / P with P_i = f_0 ... f_i:  sum_i (P_i - P_{i-1}) (a_i + n b_i / P)
* send_recv (two ranks): a + n b of the outermost level the pair spans.

With one level this is the ring formula (2(p-1)a + 2(p-1)/p n b for all_reduce).
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Sequence, Tuple

from mindspore_hyper.comm._common import _C
from mindspore_hyper.comm.topology import Topology, load_topology

__all__ = [
    "KINDS", "TransportParams", "estimate_time", "collective_time", "choose_algorithm", "make_cost_model",
    "set_threshold", "force_algorithm", "clear_overrides", "overrides",
    "HIERARCHICAL_KINDS", "hierarchical_time", "transfer_time",
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


HIERARCHICAL_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def hierarchical_time(kind: str, nbytes: float, alphas: Sequence[float], betas: Sequence[float],
                      fanouts: Sequence[int], fixed: float = 0.0) -> float:
    """Modelled seconds of one collective over a network of levels (formulas in the module doc);
    a group of one rank costs 0.

    Args:
        kind: one of HIERARCHICAL_KINDS.
        nbytes: the formula's n in bytes.
        alphas: seconds per message step at each level, innermost first.
        betas: seconds per byte at each level.
        fanouts: the group's fan-out at each level (`levels.group_fanouts`; for send_recv: of
            the two-rank group).
        fixed: seconds paid once by a collective of two or more ranks (e.g. a wait for peers).

    Raises:
        ValueError: unknown kind or negative bytes.
    """
    if kind not in HIERARCHICAL_KINDS:
        raise ValueError(f"kind={kind!r}: expected one of {', '.join(HIERARCHICAL_KINDS)}")
    if nbytes < 0:
        raise ValueError(f"nbytes={nbytes!r}: expected >= 0")
    total, inner, seconds = math.prod(fanouts), 1, fixed
    if total <= 1:
        return 0.0
    if kind == "send_recv":
        return fixed + transfer_time(nbytes, alphas, betas, fanouts)
    for alpha, beta, f in zip(alphas, betas, fanouts):
        if f <= 1:
            continue
        share = nbytes / inner
        if kind == "all_reduce":
            seconds += 2 * (f - 1) * alpha + 2 * (f - 1) / f * share * beta
        elif kind in ("all_gather", "reduce_scatter"):
            seconds += (f - 1) * alpha + (f - 1) / f * share * beta
        else:  # all_to_all
            peers = inner * f - inner
            seconds += peers * (alpha + nbytes * beta / total)
        inner *= f
    return seconds


def transfer_time(nbytes: float, alphas: Sequence[float], betas: Sequence[float], fanouts: Sequence[int]) -> float:
    """Seconds of one point-to-point message between two ranks of a network of levels: a + n b
    of the outermost level the pair spans; 0 within one device.

    Raises:
        ValueError: negative bytes.
    """
    if nbytes < 0:
        raise ValueError(f"nbytes={nbytes!r}: expected >= 0")
    seconds = 0.0
    for alpha, beta, f in zip(alphas, betas, fanouts):
        if f > 1:
            seconds = alpha + nbytes * beta
    return seconds
