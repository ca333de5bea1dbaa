"""Process groups of the HyperParallel API: named rank sets, over the job's communicators."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from mindspore_hyper.hyper_parallel.rank_threads import thread_rank
from mindspore_hyper.hyper_parallel.session import holds_all_ranks, job_size, refuse_in_simulation, reset_session

__all__ = ["ProcessGroup", "init_process_group", "destroy_process_group", "get_process_group_ranks", "get_backend",
           "split_group", "get_group_local_rank", "get_rank", "get_world_size"]


@dataclass(frozen=True)
class ProcessGroup:
    """A set of global ranks (ascending order is the group's rank order)."""

    ranks: Tuple[int, ...]

    def size(self) -> int:
        return len(self.ranks)

    def rank_of(self, global_rank: int) -> int:
        """`global_rank`'s index in the group.

        Raises:
            ValueError: it is not a member.
        """
        if global_rank not in self.ranks:
            raise ValueError(f"rank {global_rank} is not in process group {self.ranks}")
        return self.ranks.index(global_rank)

    @classmethod
    def of(cls, ranks: Sequence[int]) -> "ProcessGroup":
        return cls(tuple(int(r) for r in ranks))


def _world():
    from mindspore_hyper.runtime.distributed.world import world

    return world()




def init_process_group(backend: Optional[str] = None, **kwargs) -> None:
    """Join the job: under msrun this process's place in it (MindSpore communication, this
    package's transport); in simulation the job is this process (nothing to join).

    Raises:
        ValueError: an unknown keyword (named).
    """
    unknown = set(kwargs) - {"init_method", "timeout", "world_size", "rank", "store", "group_name", "pg_options",
                             "device_id"}
    if unknown:
        raise ValueError(f"init_process_group: unexpected keyword {sorted(unknown)[0]!r}")
    if not holds_all_ranks():
        _world()


def destroy_process_group(group: Optional[ProcessGroup] = None) -> None:
    """Forget the API's meshes and runs (the job's own communicators close with the process)."""
    if group is None:
        reset_session()


def get_process_group_ranks(group: Optional[ProcessGroup] = None) -> List[int]:
    """The global ranks of `group` (None: the whole job)."""
    return list(group.ranks) if group is not None else list(range(job_size()))


def get_backend(group: Optional[ProcessGroup] = None) -> str:
    """The transport: "simulation" in one process, else the `dist_transport` of the job."""
    return "simulation" if holds_all_ranks() else _world().transport


def split_group(parent_pg: Optional[ProcessGroup] = None, split_ranks: Sequence[Sequence[int]] = (), **kwargs):
    """The group of `split_ranks` that holds this process (msrun; refused in simulation, where
    the answer differs per device).

    Raises:
        ValueError: overlapping groups, ranks outside the parent, or this rank in none of them.
    """
    parent = set(get_process_group_ranks(parent_pg))
    seen: set = set()
    for ranks in split_ranks:
        if seen & set(ranks) or not set(ranks) <= parent:
            raise ValueError(f"split_group: split_ranks={list(map(list, split_ranks))} overlap or leave the parent "
                             f"group {sorted(parent)}")
        seen |= set(ranks)
    refuse_in_simulation("split_group()")
    me = _world().rank
    for ranks in split_ranks:
        if me in ranks:
            return ProcessGroup.of(sorted(ranks))
    raise ValueError(f"split_group: rank {me} is in none of {list(map(list, split_ranks))}")


def get_group_local_rank(group: Optional[ProcessGroup] = None, global_rank: Optional[int] = None) -> int:
    """`global_rank`'s (default: this process's) index in `group`."""
    if global_rank is None:
        global_rank = thread_rank()  # a per-rank simulation's thread
    if global_rank is None:
        refuse_in_simulation("get_group_local_rank()")
        global_rank = _world().rank
    ranks = get_process_group_ranks(group)
    if global_rank not in ranks:
        raise ValueError(f"get_group_local_rank: rank {global_rank} is not in the group {ranks}")
    return ranks.index(global_rank)


def get_rank(group: Optional[ProcessGroup] = None) -> int:
    """This process's rank (in `group`); refused in simulation."""
    return get_group_local_rank(group)


def get_world_size(group: Optional[ProcessGroup] = None) -> int:
    """The number of ranks of `group` (None: the job)."""
    return len(get_process_group_ranks(group))
