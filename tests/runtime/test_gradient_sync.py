"""`GradientSync`: each gradient collective records the row of the bytes it moves.

The msrun path is checked here against a stand-in collectives backend whose communicator sums
what it is given over two fake members (the other member holding twice this one's array), so
the moved values and the recorded bytes can both be computed by hand; the real transports are
covered by the msrun tests, which compare the distributed report with the simulation's.
"""
import numpy as np
import pytest

from mindspore_hyper.comm.collectives import AxisGroup
from mindspore_hyper.dtensor.accounting import Accounting
from mindspore_hyper.runtime.gradient_sync import GradientSync, member_group


class _TwoMembers:
    """A communicator of two members, the other one holding 2x this one's array."""

    def __init__(self, log):
        self.log = log

    def all_reduce(self, x):
        self.log.append(("all_reduce", x.nbytes))
        return x * 3

    def all_reduce_async(self, x):
        self.log.append(("all_reduce_async", x.nbytes))
        result = x * 3

        class Handle:
            def wait(self, timeout=None):
                return result

        return Handle()

    def reduce_scatter(self, x, dim):
        self.log.append(("reduce_scatter", x.nbytes))
        return np.array_split(x * 3, 2, axis=dim)[0]

    def all_gather(self, x, dim):
        self.log.append(("all_gather", x.nbytes))
        return np.concatenate([x, x * 2], axis=dim)


class _Backend:
    def __init__(self):
        self.log, self.groups = [], []

    def communicator(self, group):
        self.groups.append(group)
        return _TwoMembers(self.log)


def _rows(accounting):
    return {key: tuple(value) for key, value in accounting.comm_backward.items()}


def test_in_process_parameter_sum_rows_and_once_per_step():
    # ring bytes by hand for P = 64 bytes over n = 4: AllReduce 2(n-1)/n P = 96,
    # ReduceScatter (n-1)/n P = 48, the ZeRO AllGather of P/n = 16 per device sends (n-1) P/n = 48
    accounting = Accounting(4)
    sync = GradientSync(accounting, collectives=None)
    group = AxisGroup.whole(4, "data")
    assert sync.claim(1, group) and not sync.claim(1, group)
    sync.parameter_sum(64, group, zero=None, name="w")
    sync.parameter_sum(64, group, zero=("data", 4), name="v")
    assert _rows(accounting) == {("AllReduce", "data"): (1, 96, 64), ("ReduceScatter", "data"): (1, 48, 64),
                                 ("AllGather", "data"): (1, 48, 16)}
    causes = accounting.comm_backward_causes
    assert dict(causes[("AllReduce", "data")]) == {"grad sync of w": 1}
    assert dict(causes[("AllGather", "data")]) == {"optimizer ZeRO gather of v": 1}
    sync.begin_step()
    assert sync.claim(1, group)


def test_parameter_sum_with_zero_over_part_of_the_group_first_sums_over_the_rest():
    # P = 64 bytes summed over data+tensor (2 x 2), its optimizer states split over data only (as a
    # process runs it): AllReduce over tensor, n = 2: 2(n-1)/n P = 64; ReduceScatter over data (n-1)/n P = 32;
    # the AllGather of the updated half P/2 = 32 sends (n-1) P/n = 32
    accounting = Accounting(4)
    sync = GradientSync(accounting, collectives=None)
    sync.parameter_sum(64, AxisGroup.whole(4, "data+tensor"), zero=("data", 2), name="norm")
    assert _rows(accounting) == {("AllReduce", "tensor"): (1, 64, 64), ("ReduceScatter", "data"): (1, 32, 64),
                                 ("AllGather", "data"): (1, 32, 32)}
    assert dict(accounting.comm_backward_causes[("AllReduce", "tensor")]) == {"grad sync of norm": 1}


def test_process_collectives_move_and_record_the_same_bytes():
    accounting, backend = Accounting(2), _Backend()
    sync = GradientSync(accounting, backend)
    group = member_group("data", (0, 1), rank=0)
    grad = np.arange(6, dtype=np.float32).reshape(2, 3)  # 24 bytes
    np.testing.assert_array_equal(sync.all_reduce(grad, group, names=("w",)), grad * 3)
    np.testing.assert_array_equal(sync.all_reduce_async(grad, group).wait(), grad * 3)  # not recorded
    np.testing.assert_array_equal(sync.reduce_scatter(grad, group, ["a", "b"]), grad[0] * 3)
    np.testing.assert_array_equal(sync.all_gather(grad[:1], 0, group, "w"), np.stack([grad[0], grad[0] * 2]))
    assert sync.sum_scalar(0.5, member_group("all", (0, 1), 1)) == 1.5  # no cause: not recorded
    assert backend.log == [("all_reduce", 24), ("all_reduce_async", 24), ("reduce_scatter", 24),
                           ("all_gather", 12), ("all_reduce", 8)]
    assert backend.groups[-1].local == (1,)
    # n = 2: AllReduce sends 2(n-1)/n B = B, ReduceScatter (n-1)/n B, AllGather (n-1) B of its input
    assert _rows(accounting) == {("AllReduce", "data"): (1, 24, 24), ("ReduceScatter", "data"): (1, 12, 24),
                                 ("AllGather", "data"): (1, 12, 12)}
    assert dict(accounting.comm_backward_causes[("ReduceScatter", "data")]) == {"grad sync of a, b": 1}


def test_member_group_refuses_a_rank_outside_the_group():
    with pytest.raises(ValueError, match=r"rank 3 is not a member of group 'data' \(0, 1\)"):
        member_group("data", (0, 1), rank=3)


def test_sum_scalar_records_one_float64_all_reduce_under_its_cause():
    # in one process the value is the sum already (nothing moves); in a process of one member it
    # is summed by the communicator; both record an AllReduce of 8 bytes: n = 4 sends
    # 2(n-1)/n x 8 = 12 bytes, n = 2 sends 8
    accounting = Accounting(4)
    sync = GradientSync(accounting, collectives=None)
    assert sync.sum_scalar(2.5, AxisGroup.whole(4, "data+tensor"), "clip grad norm") == 2.5
    assert _rows(accounting) == {("AllReduce", "data+tensor"): (1, 12, 8)}
    assert dict(accounting.comm_backward_causes[("AllReduce", "data+tensor")]) == {"clip grad norm": 1}
    accounting, backend = Accounting(2), _Backend()
    sync = GradientSync(accounting, backend)
    assert sync.sum_scalar(0.5, member_group("data", (0, 1), 0), "grad norm") == 1.5
    assert backend.log == [("all_reduce", 8)]
    assert _rows(accounting) == {("AllReduce", "data"): (1, 8, 8)}



def test_sum_scalar_over_one_device_records_nothing():
    # a group of one runs no collective: the value is the sum, no report row (the HyperParallel
    # clipping and the models' norms share this rule through sum_scalar)
    accounting = Accounting(1)
    sync = GradientSync(accounting, collectives=None)
    assert sync.sum_scalar(2.5, AxisGroup.whole(1, "data"), "clip grad norm") == 2.5
    assert _rows(accounting) == {}
