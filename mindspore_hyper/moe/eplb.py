"""Expert-parallel load balancing: replicate hot experts and place the replicas on devices.

`rebalance_experts` has the contract of DeepSeek's EPLB (github.com/deepseek-ai/EPLB, MIT): from
per-layer expert loads it returns which logical expert each physical slot holds (phy2log), the
physical slots of each logical expert (log2phy, -1 padded) and the replica counts (logcnt).
Written here in numpy from the published description:

- hierarchical (when the number of nodes divides the number of expert groups): pack expert groups
  onto nodes so node loads balance, replicate experts within each node (each new replica goes to
  the expert with the largest load per replica), then pack each node's replicas onto its devices;
- global (otherwise): the same with one group and one node.

Packing is greedy: items by decreasing load, each to the least loaded pack that still has room
(every pack gets the same number of items). Ties go to the lower index, as in the reference.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

__all__ = ["rebalance_experts", "balanced_packing", "replicate_experts"]


def balanced_packing(weight: np.ndarray, num_packs: int) -> Tuple[np.ndarray, np.ndarray]:
    """Pack the n items of each row of `weight` [L, n] into `num_packs` packs of n/num_packs
    items each, balancing pack loads. Returns (pack index [L, n], position in the pack [L, n])."""
    rows, n = weight.shape
    per_pack = n // num_packs
    if per_pack == 1:
        return np.tile(np.arange(n), (rows, 1)), np.zeros((rows, n), dtype=np.int64)
    pack = np.full((rows, n), -1, dtype=np.int64)
    rank = np.full((rows, n), -1, dtype=np.int64)
    for r in range(rows):
        loads = np.zeros(num_packs)
        sizes = np.zeros(num_packs, dtype=np.int64)
        for item in np.argsort(-weight[r], kind="stable"):
            open_packs = np.nonzero(sizes < per_pack)[0]
            p = open_packs[np.argmin(loads[open_packs])]
            pack[r, item], rank[r, item] = p, sizes[p]
            loads[p] += weight[r, item]
            sizes[p] += 1
    return pack, rank


def replicate_experts(weight: np.ndarray, num_physical: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Grow the experts of each row of `weight` [L, E] to `num_physical` replicas, each new one
    for the expert with the largest load per replica. Returns (logical expert of each physical
    slot [L, P], its replica number [L, P], replicas per expert [L, E])."""
    rows, num_logical = weight.shape
    phy2log = np.tile(np.arange(num_physical), (rows, 1))
    replica = np.zeros((rows, num_physical), dtype=np.int64)
    count = np.ones((rows, num_logical), dtype=np.int64)
    for slot in range(num_logical, num_physical):
        hottest = np.argmax(weight / count, axis=1)
        phy2log[:, slot] = hottest
        replica[:, slot] = count[np.arange(rows), hottest]
        count[np.arange(rows), hottest] += 1
    return phy2log, replica, count


def _inverse(perm: np.ndarray) -> np.ndarray:
    inv = np.empty_like(perm)
    rows = np.arange(perm.shape[0])[:, None]
    inv[rows, perm] = np.arange(perm.shape[1])[None, :]
    return inv


def _hierarchical(weight: np.ndarray, num_physical: int, num_groups: int, num_nodes: int, num_gpus: int):
    layers, num_logical = weight.shape
    group_size = num_logical // num_groups
    groups_per_node = num_groups // num_nodes
    per_gpu = num_physical // num_gpus
    # 1. expert groups onto nodes; renumber experts node-major ("mlog")
    node, slot = balanced_packing(weight.reshape(layers, num_groups, group_size).sum(-1), num_nodes)
    log2mlog = ((node * groups_per_node + slot) * group_size)[:, :, None] + np.arange(group_size)
    log2mlog = log2mlog.reshape(layers, num_logical)
    mlog2log = _inverse(log2mlog)
    # 2. replicas within each node
    per_node = np.take_along_axis(weight, mlog2log, 1).reshape(layers * num_nodes, num_logical // num_nodes)
    phy2mlog, phy_replica, mlog_count = replicate_experts(per_node, num_physical // num_nodes)
    # 3. each node's replicas onto its devices
    replica_load = np.take_along_axis(per_node / mlog_count, phy2mlog, 1)
    gpu, gpu_slot = balanced_packing(replica_load, num_gpus // num_nodes)
    pphy2phy = _inverse(gpu * per_gpu + gpu_slot)
    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, 1).reshape(layers, num_nodes, -1)
    pphy2mlog = (pphy2mlog + (np.arange(num_nodes) * (num_logical // num_nodes))[None, :, None]).reshape(layers, -1)
    phy2log = np.take_along_axis(mlog2log, pphy2mlog, 1)
    replica = np.take_along_axis(phy_replica, pphy2phy, 1).reshape(layers, -1)
    logcnt = np.take_along_axis(mlog_count.reshape(layers, -1), log2mlog, 1)
    return phy2log, replica, logcnt


def rebalance_experts(weight, num_replicas: int, num_groups: int, num_nodes: int,
                      num_gpus: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Replicate and place experts (see module docstring).

    Args:
        weight: [layers, logical experts] load statistics (e.g. tokens per expert).
        num_replicas: physical experts, a multiple of `num_gpus`, >= logical experts.
        num_groups: expert groups (a divisor of the logical experts).
        num_nodes: server nodes (the fast intra-node links); divides `num_gpus`.
        num_gpus: devices.

    Returns:
        phy2log [layers, num_replicas]: logical expert of each physical slot (slot p is on device
        p // (num_replicas / num_gpus)); log2phy [layers, logical, max replicas]: the slots of each
        logical expert, -1 padded; logcnt [layers, logical]: replicas of each logical expert.

    Raises:
        ValueError: a size that does not divide as required (named in the message).
    """
    weight = np.asarray(weight, dtype=np.float64)
    if weight.ndim != 2:
        raise ValueError(f"rebalance_experts: weight must be [layers, experts], got shape {weight.shape}")
    layers, num_logical = weight.shape
    if num_gpus < 1 or num_nodes < 1 or num_gpus % num_nodes:
        raise ValueError(f"rebalance_experts: num_gpus={num_gpus} must be a positive multiple of num_nodes={num_nodes}")
    if num_replicas < num_logical or num_replicas % num_gpus:
        raise ValueError(f"rebalance_experts: num_replicas={num_replicas} must be >= {num_logical} experts and a "
                         f"multiple of num_gpus={num_gpus}")
    if num_groups < 1 or num_logical % num_groups:
        raise ValueError(f"rebalance_experts: num_groups={num_groups} must divide the {num_logical} experts")
    if num_groups % num_nodes == 0:
        groups, nodes = num_groups, num_nodes
        if (num_replicas // nodes) < num_logical // nodes or (num_replicas % nodes):
            raise ValueError(f"rebalance_experts: num_replicas={num_replicas} must split over num_nodes={nodes}")
    else:
        groups, nodes = 1, 1
    phy2log, replica, logcnt = _hierarchical(weight, num_replicas, groups, nodes, num_gpus)
    log2phy = np.full((layers, num_logical, int(logcnt.max())), -1, dtype=np.int64)
    rows = np.repeat(np.arange(layers), num_replicas)
    log2phy[rows, phy2log.ravel(), replica.ravel()] = np.tile(np.arange(num_replicas), layers)
    return phy2log.astype(np.int64), log2phy, logcnt.astype(np.int64)
