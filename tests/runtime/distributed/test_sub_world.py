"""`World.sub(ranks)`: some of the job's processes renumbered 0..n-1, talking to their global ranks."""
import pytest

from mindspore_hyper.runtime.distributed.world import World


class RecordingWorld(World):
    """A World whose communicators are the global ranks asked for (no transport)."""

    def communicator(self, ranks):
        return ("communicator", tuple(ranks))


def test_sub_world_maps_its_ranks_to_the_global_ones():
    job = RecordingWorld(rank=5, size=8, job="t", transport="shm", timeout=7.5)
    sub = job.sub((4, 5, 6, 7))
    assert (sub.rank, sub.size, sub.timeout) == (1, 4, 7.5)
    assert sub.communicator((0, 2)) == ("communicator", (4, 6))


@pytest.mark.parametrize("ranks, message", [
    ((0, 1), r"this process \(rank 5\) is not one of them"),
    ((5, 9), "rank 9 is outside the job's 8 processes"),
    ((5, 5), "a rank appears twice"),
])
def test_sub_world_refuses_ranks_by_name(ranks, message):
    job = RecordingWorld(rank=5, size=8, job="t", transport="shm", timeout=1.0)
    with pytest.raises(ValueError, match=r"World.sub\(ranks=.*" + message):
        job.sub(ranks)
