"""Upstream's checks of a pipeline execution order (`core.pipeline_parallel.scheduler`).

An order is upstream's `exec_order`: pipeline rank -> its MetaSteps in program order. Each send
and receive becomes a named transfer, "Send_Receive_(src)->(dst)_micro{m}_{k}th" (the k-th
transfer of microbatch m from rank src to rank dst on that rank), so the two ends of one
transfer carry one name. Every rank runs its transfers in order and a transfer completes on both
ends together, so the order deadlocks exactly when the graph "a rank runs X before Y" has a cycle.
Bad entries are reported (logged and returned), never raised: the checks describe an order, they
do not run it. This package's own schedules are checked by `mindspore_hyper.schedule.validate`.
"""
from __future__ import annotations

import logging
import re
from collections import defaultdict
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

from mindspore_hyper.hyper_parallel.pipeline_steps import MetaStep, MetaStepType

__all__ = ["generate_operations", "parse_and_validate", "detect_cycle_in_graph", "validate_pipeline_execution"]

logger = logging.getLogger(__name__)

_SENDS = {MetaStepType.FWD_SEND: 1, MetaStepType.BWD_SEND: -1}  # the stage a send goes to: stage + this
_RECVS = {MetaStepType.FWD_RECV: -1, MetaStepType.BWD_RECV: 1}  # the stage a receive comes from
_RANK_IN_NAME = re.compile(r"\((\d+)\)")
_END = object()


def _stage_rank(stage: int, ranks: int, stages: int, com_type: str) -> int:
    """The pipeline rank holding `stage`: round robin ("loop") or there and back ("v")."""
    if com_type == "loop":
        return stage % ranks
    if com_type == "v":
        return stage if stage < ranks else stages - 1 - stage
    raise ValueError(f"com_type must be 'loop' (stage s on rank s % ranks) or 'v' (a V-shaped placement), "
                     f"but got {com_type!r}")


def generate_operations(order_list: Dict[int, Sequence[MetaStep]], chunk_num: int,
                        com_type: str = "loop") -> Dict[str, List[str]]:
    """Each rank's transfers, in its order, by name (module docstring).

    Args:
        order_list: pipeline rank -> its MetaSteps (computations are skipped, and so are None
            entries: the bubbles upstream's schedules leave in an order).
        chunk_num: stages per rank (the virtual pipeline's chunks; "v" places exactly 2).
        com_type: "loop" or "v", how stages are placed on ranks.

    Returns:
        str(rank) -> transfer names; a rank without transfers is left out. A send from the last
        stage forward (or the first backward) has no peer and is left out.

    Raises:
        ValueError: an unknown com_type, "v" with chunk_num other than 2, or a chunk_num below 1.
        TypeError: an entry that is neither a MetaStep nor None (naming the rank and position).
    """
    if isinstance(chunk_num, bool) or not isinstance(chunk_num, int) or chunk_num < 1:
        raise ValueError(f"chunk_num must be an int >= 1 (stages per rank), but got {chunk_num!r}")
    if com_type == "v" and chunk_num != 2:
        raise ValueError(f"com_type='v' places 2 stages per rank (out and back), but chunk_num={chunk_num}")
    ranks = len(order_list)
    stages = ranks * chunk_num
    operations: Dict[str, List[str]] = defaultdict(list)
    for rank, steps in order_list.items():
        seen: Dict[Tuple[int, int, int], int] = defaultdict(int)
        for index, step in enumerate(steps):
            if step is None:
                continue
            if not isinstance(step, MetaStep):
                raise TypeError(f"order_list[{rank!r}][{index}]: expected a MetaStep (or None for a bubble), but got "
                                f"{step!r}")
            if step.type in _SENDS:
                peer_stage = step.stage_index + _SENDS[step.type]
            elif step.type in _RECVS:
                peer_stage = step.stage_index + _RECVS[step.type]
            else:
                continue
            if not 0 <= peer_stage < stages:
                continue
            peer = _stage_rank(peer_stage, ranks, stages, com_type)
            src, dst = (rank, peer) if step.type in _SENDS else (peer, rank)
            seen[src, dst, step.micro_index] += 1
            operations[str(rank)].append(
                f"Send_Receive_({src})->({dst})_micro{step.micro_index}_{seen[src, dst, step.micro_index]}th")
    return dict(operations)


def parse_and_validate(data: dict, all_rank: bool = True) -> List[str]:
    """Check that both ends of every transfer list it: the ranks named in a transfer's first two
    "(rank)" groups must each hold that name.

    Args:
        data: str(rank) -> transfer names (`generate_operations`' form).
        all_rank: also report a transfer naming a rank that `data` does not hold (False: only the
            ranks present are checked).

    Returns:
        The problems found, each also logged as an error (empty: consistent).
    """
    problems: List[str] = []
    if not isinstance(data, dict):
        problems.append(f"the order must be a dict of rank -> list of transfer names, but got {type(data).__name__}")
    else:
        held = {rank: set(names) for rank, names in data.items()
                if isinstance(names, list) and all(isinstance(n, str) for n in names)}
        for rank, names in data.items():
            if rank not in held:
                problems.append(f"rank {rank!r}: expected a list of transfer names (str), but got {names!r}")
                continue
            for name in names:
                ends = set(_RANK_IN_NAME.findall(name)[:2])
                missing = ends - held.keys()
                if all_rank and missing:
                    problems.append(f"{name!r} (rank {rank!r}) names ranks {sorted(missing)} that the order "
                                    "does not hold")
                    continue
                for end in sorted(ends & held.keys()):
                    if name not in held[end]:
                        problems.append(f"rank {end!r} is missing {name!r}, which rank {rank!r} runs")
    for problem in problems:
        logger.error(problem)
    return problems


def detect_cycle_in_graph(ranks_map: Dict[Hashable, Sequence[Hashable]]
                          ) -> Tuple[Optional[List[Hashable]], Optional[List[str]]]:
    """A cycle of the graph whose edges are consecutive entries of each rank's list.

    Args:
        ranks_map: rank -> node names in that rank's order.

    Returns:
        (cycle, edges): the cycle's nodes with the first repeated at the end and, per edge,
        "<rank> <u> -> <v>" (the rank listing that edge, the last one where several do); or
        (None, None) when the graph has no cycle. Nodes are searched depth first in the order
        they first lead anywhere, their successors in the order listed.
    """
    successors: Dict[Hashable, List[Hashable]] = defaultdict(list)
    edge_rank: Dict[Tuple[Hashable, Hashable], Hashable] = {}
    for rank, nodes in ranks_map.items():
        for u, v in zip(nodes, nodes[1:]):
            successors[u].append(v)
            edge_rank[u, v] = rank
    done = set()
    for root in list(successors):
        if root in done:
            continue
        path, on_path, pending = [root], {root: 0}, [iter(successors[root])]
        while pending:
            nxt = next(pending[-1], _END)
            if nxt is _END:
                node = path.pop()
                del on_path[node]
                done.add(node)
                pending.pop()
                continue
            if nxt in on_path:
                cycle = path[on_path[nxt]:] + [nxt]
                return cycle, [f"{edge_rank[u, v]} {u} -> {v}" for u, v in zip(cycle, cycle[1:])]
            if nxt not in done:
                on_path[nxt] = len(path)
                path.append(nxt)
                pending.append(iter(successors.get(nxt, ())))
    return None, None


def validate_pipeline_execution(order_list: Dict[int, Sequence[MetaStep]], chunk_num: int,
                                com_type: str = "loop") -> dict:
    """Name the order's transfers, check their ends match, and look for a deadlock (a cycle).

    Args:
        order_list, chunk_num, com_type: as `generate_operations`.

    Returns:
        {"formatted_operations": the named transfers, "problems": unmatched ends
        (`parse_and_validate`), "cycle_path" / "cycle_ranks": a deadlock's cycle or None,
        "has_cycle": bool}; a cycle is logged as an error.
    """
    operations = generate_operations(order_list, chunk_num, com_type)
    problems = parse_and_validate(operations, True)
    cycle, edges = detect_cycle_in_graph(operations)
    if cycle:
        logger.error("pipeline order deadlocks: %s (%s)", " -> ".join(cycle), "; ".join(edges))
    return {"formatted_operations": operations, "problems": problems, "cycle_path": cycle, "cycle_ranks": edges,
            "has_cycle": bool(cycle)}
