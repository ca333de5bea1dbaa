"""simulate_shared: ranks whose speed depends on how many compute at once, against hand-computed
timelines; with speed 1 everywhere it is simulate_schedule; bad speeds are named."""
import random

import pytest

from mindspore_hyper.schedule import build_schedule, simulate_schedule, simulate_shared


def _ends(timeline):
    """(rank, action label) -> end, for the compute actions."""
    return {(s.lane, s.label): s.end for s in timeline.spans if s.busy}


def test_1f1b_two_ranks_by_hand():
    """1F1B, p = 2, m = 2, F = 1 and B = 2 work units per stage; one rank computing runs at speed
    2, two at speed 1 (4 processes on 2 cores, alone = a core each):
    rank 0 F mb0 alone 0 -> 0.5; both F (r0 mb1, r1 mb0) 0.5 -> 1.5; r1 B mb0 alone 1.5 -> 2.5;
    r0 B mb0 and r1 F mb1 together from 2.5: r1's F ends 3.5, then r1 B mb1 beside r0's B until
    r0's ends at 4.5 (1 unit left for r1); r1 alone 4.5 -> 5.0; r0 B mb1 alone 5.0 -> 6.0."""
    t = simulate_shared(build_schedule("1f1b", 2, 2), forward=1.0, backward_input=1.0, backward_weight=1.0,
                        speeds=(2.0, 1.0))
    assert _ends(t) == pytest.approx({(0, "F s0 mb0"): 0.5, (0, "F s0 mb1"): 1.5, (1, "F s1 mb0"): 1.5,
                                      (1, "B s1 mb0"): 2.5, (1, "F s1 mb1"): 3.5, (0, "B s0 mb0"): 4.5,
                                      (1, "B s1 mb1"): 5.0, (0, "B s0 mb1"): 6.0})
    assert t.makespan == pytest.approx(6.0)
    dedicated = simulate_schedule(build_schedule("1f1b", 2, 2), 1.0, 1.0, 1.0)
    assert dedicated.makespan == pytest.approx(9.0)  # (m + p - 1)(F + B)


def test_gpipe_transfer_latency_by_hand():
    """GPipe p = 2, m = 1, F = 1, B = 2, p2p 0.25, speeds (2, 1): nobody computes at the same time,
    so every action runs at speed 2: F0 0 -> 0.5, arrives 0.75; F1 -> 1.25; B1 -> 2.25, arrives
    2.5; B0 -> 3.5. The receives wait for the transfers."""
    t = simulate_shared(build_schedule("gpipe", 2, 1), 1.0, 1.0, 1.0, p2p=0.25, speeds=(2.0, 1.0))
    assert _ends(t) == pytest.approx({(0, "F s0 mb0"): 0.5, (1, "F s1 mb0"): 1.25, (1, "B s1 mb0"): 2.25,
                                      (0, "B s0 mb0"): 3.5})
    waits = {(s.lane, s.label): (s.start, s.end) for s in t.spans if s.kind == "recv"}
    assert waits[(1, "recv activation s1 mb0 <- rank 0")] == pytest.approx((0.0, 0.75))
    assert waits[(0, "recv gradient s0 mb0 <- rank 1")] == pytest.approx((0.5, 2.5))


@pytest.mark.parametrize("kind, p, v", [("gpipe", 3, 1), ("1f1b", 4, 1), ("zb_h1", 3, 1), ("interleaved_1f1b", 2, 2),
                                        ("zb_v", 3, 2), ("dualpipe_v", 2, 2)])
def test_speed_one_is_simulate_schedule(kind, p, v):
    rng = random.Random(p * 10 + v)
    n = p * v
    costs = [[rng.uniform(0.5, 2.0) for _ in range(n)] for _ in range(3)]
    schedule = build_schedule(kind, p, 2 * p, v)
    shared = simulate_shared(schedule, *costs, p2p=0.1)
    plain = simulate_schedule(schedule, *costs, p2p=0.1)
    assert shared.makespan == pytest.approx(plain.makespan, rel=1e-12)
    assert _ends(shared) == pytest.approx(_ends(plain), rel=1e-12)


def test_equal_speeds_scale_the_dedicated_timeline():
    """Speed 0.5 for every k: each compute takes twice as long, transfers do not."""
    schedule = build_schedule("1f1b", 3, 3)
    half = simulate_shared(schedule, 1.0, 1.0, 1.0, speeds=(0.5, 0.5, 0.5))
    assert half.makespan == pytest.approx(2 * simulate_schedule(schedule, 1.0, 1.0, 1.0).makespan)


@pytest.mark.parametrize("speeds, message", [((1.0,), r"speeds=\(1.0,\): expected one speed per number"),
                                             ((1.0, 0.0), r"speeds\[1\]=0.0 \(the speed with 2 ranks computing\)"),
                                             ((float("inf"), 1.0), r"speeds\[0\]=inf")])
def test_bad_speeds_are_named(speeds, message):
    with pytest.raises(ValueError, match=message):
        simulate_shared(build_schedule("1f1b", 2, 2), speeds=speeds)


def test_bad_latency_is_named():
    with pytest.raises(ValueError, match="p2p=-1"):
        simulate_shared(build_schedule("1f1b", 2, 2), p2p=-1)


def test_speeds_as_a_function_of_the_computing_ranks():
    """The function form gives each rank its own speed: rank 1 always at half speed doubles its
    actions; a count-only function equals the sequence form; a bad value is named."""
    from mindspore_hyper.schedule import build_schedule, simulate_shared

    schedule = build_schedule("1f1b", 2, 2)
    by_count = simulate_shared(schedule, 1.0, 1.0, 1.0, speeds=(2.0, 1.0))
    as_function = simulate_shared(schedule, 1.0, 1.0, 1.0, speeds=lambda rank, computing: (2.0, 1.0)[len(computing) - 1])
    assert as_function.end == pytest.approx(by_count.end)
    slow = simulate_shared(schedule, 1.0, 1.0, 1.0, speeds=lambda rank, computing: 0.5 if rank == 1 else 1.0)
    assert slow.end > simulate_shared(schedule, 1.0, 1.0, 1.0).end
    with pytest.raises(ValueError, match=r"speeds\(0, \[0\]\)=0: expected a finite number > 0"):
        simulate_shared(schedule, 1.0, 1.0, 1.0, speeds=lambda rank, computing: 0)
