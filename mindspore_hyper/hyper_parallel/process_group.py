"""Process groups of the HyperParallel API: rank sets, over the job's communicators.

Upstream's MindSpore platform names its groups by strings (`platform.create_group(rank_list)`,
`split_group(..., pg_options=name)`, MindSpore's "hccl_world_group"); torch passes group objects.
Both are taken: a `ProcessGroup`, a name a script made here, a world group's name, or None (the
whole job).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from mindspore_hyper.hyper_parallel.rank_threads import thread_rank
from mindspore_hyper.hyper_parallel.session import (
    holds_all_ranks, job_size, named_groups, refuse_in_simulation, reset_session,
)

__all__ = ["ProcessGroup", "init_process_group", "destroy_process_group", "get_process_group_ranks", "get_backend",
           "split_group", "get_group_local_rank", "get_rank", "get_world_size", "create_group"]

WORLD_GROUP_NAMES = ("hccl_world_group", "mccl_world_group", "nccl_world_group")


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


def _group_of(group) -> Optional[ProcessGroup]:
    """`group` as a ProcessGroup (None: the whole job).

    Raises:
        ValueError: a name no `create_group`/`split_group` made, or another type (named).
    """
    if group is None or isinstance(group, ProcessGroup):
        return group
    if isinstance(group, str):
        if group in WORLD_GROUP_NAMES:
            return None
        if group in named_groups():
            return named_groups()[group]
        raise ValueError(f"process group {group!r}: no such group; expected None, a world group name "
                         f"{WORLD_GROUP_NAMES}, a ProcessGroup or a name made by create_group/split_group "
                         f"(made: {sorted(named_groups())})")
    raise ValueError(f"process group {group!r}: expected None, a ProcessGroup or a group name (str)")


def _name(ranks: Sequence[int], group_name: Optional[str]) -> str:
    """Upstream's default group name: "<count>-<rank>-<rank>-..."."""
    return group_name if group_name is not None else f"{len(ranks)}-" + "-".join(str(r) for r in ranks)


def _register(name: str, group: ProcessGroup, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what}: group name {name!r}; expected a non-empty str")
    if name in WORLD_GROUP_NAMES or named_groups().get(name, group) != group:
        raise ValueError(f"{what}: the name {name!r} is already the group of ranks "
                         f"{list(named_groups()[name].ranks) if name in named_groups() else 'of the whole job'}; "
                         f"choose another name")
    named_groups()[name] = group
    return name


def create_group(rank_list: Sequence[int], group_name: Optional[str] = None) -> str:
    """A process group of `rank_list`, by name (upstream's `platform.create_group`).

    Args:
        rank_list: distinct ranks of the job.
        group_name: its name (default upstream's "<count>-<rank>-...").

    Returns:
        The name, which every group function here takes.

    Raises:
        ValueError: repeated ranks, ranks outside the job, or a name already given to other ranks.
    """
    ranks = [int(r) for r in rank_list]
    if not ranks or len(set(ranks)) != len(ranks) or not all(0 <= r < job_size() for r in ranks):
        raise ValueError(f"create_group: rank_list={ranks}; expected distinct ranks of the job (0..{job_size() - 1})")
    return _register(_name(ranks, group_name), ProcessGroup.of(sorted(ranks)), "create_group")


def destroy_process_group(group=None) -> None:
    """None or a world group's name: forget the API's meshes, runs and named groups (the job's own
    communicators close with the process); a named group: forget that name.

    Raises:
        ValueError: an unknown group name (named).
    """
    if _group_of(group) is None:
        reset_session()
    elif isinstance(group, str):
        del named_groups()[group]


def get_process_group_ranks(group=None) -> List[int]:
    """The global ranks of `group` (None or a world group's name: the whole job)."""
    group = _group_of(group)
    return list(group.ranks) if group is not None else list(range(job_size()))


def get_backend(group=None) -> str:
    """The group's communication backend: under msrun MindSpore's (its `init` backend, "mccl" on
    CPU, as upstream answers "hccl" on Ascend) when MindSpore's communication is initialised in
    this process, else this package's transport ("shm"); "simulation" in one process."""
    _group_of(group)
    if holds_all_ranks():
        return "simulation"
    from mindspore.communication.management import GlobalComm

    return GlobalComm.BACKEND if GlobalComm.INITED else _world().transport


def split_group(parent_pg=None, split_ranks: Sequence[Sequence[int]] = (), timeout=None, pg_options=None,
                group_desc: Optional[str] = None) -> ProcessGroup:
    """The group of `split_ranks` that holds this process (msrun; refused in simulation, where
    the answer differs per device).

    Args:
        parent_pg: the group split (None: the job).
        split_ranks: disjoint rank lists inside the parent.
        timeout: accepted as upstream's; no effect (groups are made on first use).
        pg_options: upstream's MindSpore platform takes it as the new group's name (str); that
            name then works wherever a group does. Default: upstream's "<count>-<rank>-...".
        group_desc: a description; no effect.

    Returns:
        The ProcessGroup (also reachable by its name).

    Raises:
        ValueError: overlapping groups, ranks outside the parent, this rank in none of them, a
            `pg_options` that is not a str, or a name already given to other ranks.
    """
    parent = set(get_process_group_ranks(parent_pg))
    if not split_ranks:
        raise ValueError("split_group: split_ranks is empty; expected a list of rank lists")
    if pg_options is not None and not isinstance(pg_options, str):
        raise ValueError(f"split_group: pg_options={pg_options!r}; expected None or a group name (str), as "
                         "upstream's MindSpore platform takes it (backend options are not supported)")
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
            group = ProcessGroup.of(sorted(ranks))
            _register(_name(list(ranks), pg_options), group, "split_group")
            return group
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
