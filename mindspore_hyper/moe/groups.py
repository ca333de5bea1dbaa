"""Expert groups over the device topology, and what a dispatch sends over each link level.

An *expert group* is a partition of the expert-parallel devices into groups of devices (not a
HyperMPMD device group, which runs a whole submodule as its own program): by default the
topology's clusters (nodes, `comm.topology.Topology.clusters`), each holding a contiguous block
of experts.
Routing is hierarchical in two ways:

- group-limited routing (`TopKRouter(num_groups, topk_groups)`, DeepSeek-V3): a token picks its
  best `topk_groups` groups first, then its experts within them, so its copies reach few groups;
- two-level dispatch (as in DeepSeek's DeepEP): a token's row crosses to a remote group once,
  then is forwarded to the group's devices over the fast intra-group links.

`link_bytes` counts the bytes a dispatch would put on each link level of a topology, flat (a
token's row goes straight to each device holding one of its experts) or two-level, one row per
(token, device): an analysis over routing plans (a planner: it moves nothing). The executed
two-level dispatch is `moe/hierarchical.py` (`MoE(dispatch="hierarchical")`); its bytes per link
level are measured from the exchanges (`ExpertParallel.last_stats`).
"""
from __future__ import annotations

from typing import Dict, List, Sequence

import numpy as np

__all__ = ["expert_groups", "link_bytes"]


def expert_groups(topology, devices: Sequence[int]) -> List[List[int]]:
    """The expert groups of `devices` (expert-parallel ranks, member order): the topology's
    clusters restricted to them."""
    return [list(c) for c in topology.clusters(list(devices))]


def link_bytes(experts: Sequence[np.ndarray], experts_per_device: int, topology, row_bytes: int,
               two_level: bool = False) -> Dict[str, int]:
    """Dispatch bytes per link level.

    Args:
        experts: per source device, its tokens' chosen experts [T, k] (device d holds experts
            d*experts_per_device ...).
        experts_per_device: experts each device holds.
        topology: a `comm.topology.Topology` (node_of(device) gives the group).
        row_bytes: bytes of one token row.
        two_level: a row crosses to a remote node once, then is forwarded inside it.

    Returns:
        {"local": bytes staying on the source device, "intra_node": ..., "inter_node": ...}.
    """
    out = {"local": 0, "intra_node": 0, "inter_node": 0}
    for src, chosen in enumerate(experts):
        node = topology.node_of(src)
        for row in np.asarray(chosen):
            devices = sorted({int(e) // experts_per_device for e in row})
            remote_nodes = set()
            for d in devices:
                if d == src:
                    out["local"] += row_bytes
                elif topology.node_of(d) == node:
                    out["intra_node"] += row_bytes
                elif two_level:  # one crossing per remote node, then forwarded inside it
                    target = topology.node_of(d)
                    out["intra_node" if target in remote_nodes else "inter_node"] += row_bytes
                    remote_nodes.add(target)
                else:
                    out["inter_node"] += row_bytes
    return out
