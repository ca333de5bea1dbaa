"""Process groups by name, as upstream's MindSpore platform names them (create_group, split_group's
pg_options, the world group's name), and their refusals. Under msrun: rank_checks.py."""
import pytest

from mindspore_hyper.hyper_parallel import (
    destroy_process_group, get_backend, get_group_local_rank, get_process_group_ranks, split_group,
)
from mindspore_hyper.hyper_parallel.install import get_platform
from mindspore_hyper.hyper_parallel.process_group import create_group


def test_a_named_group_answers_like_the_group_until_destroyed(fresh_session):
    fresh_session.set_context(device_num=8)
    platform = get_platform()
    assert platform.get_world_size() == 8
    name = platform.create_group(rank_list=[6, 2, 4])
    assert name == "3-6-2-4"  # upstream's default: the count, then the ranks as given
    assert get_process_group_ranks(name) == [2, 4, 6]  # the group's rank order is ascending
    assert get_group_local_rank(name, global_rank=4) == 1
    assert get_backend(name) == "simulation"  # one process holds every rank
    assert create_group([2, 4, 6], group_name="evens") == "evens" and create_group([2, 4, 6], "evens") == "evens"
    for world in (None, "hccl_world_group", "mccl_world_group"):
        assert get_process_group_ranks(world) == list(range(8))
    destroy_process_group(name)
    with pytest.raises(ValueError, match="'3-6-2-4': no such group"):
        get_process_group_ranks(name)
    destroy_process_group()  # the whole job: every name goes
    with pytest.raises(ValueError, match="'evens': no such group"):
        get_backend("evens")


def test_bad_groups_are_refused_with_the_field(fresh_session):
    fresh_session.set_context(device_num=4)
    create_group([0, 1], "pair")
    with pytest.raises(ValueError, match="the name 'pair' is already the group of ranks \\[0, 1\\]"):
        create_group([2, 3], "pair")
    with pytest.raises(ValueError, match="the name 'hccl_world_group' is already"):
        create_group([2, 3], "hccl_world_group")
    with pytest.raises(ValueError, match=r"rank_list=\[0, 4\]; expected distinct ranks of the job \(0..3\)"):
        create_group([0, 4])
    with pytest.raises(ValueError, match=r"rank_list=\[1, 1\]"):
        create_group([1, 1])
    with pytest.raises(ValueError, match="expected None, a ProcessGroup or a group name"):
        get_process_group_ranks(3)
    with pytest.raises(ValueError, match="pg_options=.*expected None or a group name"):
        split_group(split_ranks=[[0, 1], [2, 3]], pg_options={"timeout": 1})
    with pytest.raises(ValueError, match="split_ranks is empty"):
        split_group(None, [])
    with pytest.raises(TypeError, match="unexpected keyword"):
        split_group(split_ranks=[[0, 1], [2, 3]], backend="mccl")  # noqa: the keyword is not upstream's
