"""build_schedule: placement of stages, explicit send/recv, and the refusal of impossible requests."""
import pytest

from mindspore_hyper.schedule import SCHEDULE_KINDS, ActionKind, build_schedule


def test_kinds():
    assert SCHEDULE_KINDS == ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_v", "dualpipe_v")


def test_interleaved_places_stages_round_robin():
    s = build_schedule("interleaved_1f1b", 4, 8, 3)
    assert s.stage_to_rank == tuple(st % 4 for st in range(12))
    assert s.stages_of(1) == (1, 5, 9)
    assert [s.chunk_of(st) for st in (1, 5, 9)] == [0, 1, 2]
    for rank, actions in enumerate(s.actions):
        assert {a.stage for a in actions} == set(s.stages_of(rank))
        assert all(a.chunk == s.chunk_of(a.stage) for a in actions)


def test_zb_v_places_stage_s_and_2p_minus_1_minus_s_together():
    p = 4
    s = build_schedule("zb_v", p, 8, 2)
    for st in range(p):
        assert s.stage_to_rank[st] == s.stage_to_rank[2 * p - 1 - st] == st
    assert s.stages_of(0) == (0, 7)


@pytest.mark.parametrize("kind,v", [("gpipe", 1), ("1f1b", 1), ("zb_h1", 1), ("interleaved_1f1b", 2), ("zb_v", 2),
                                    ("dualpipe_v", 2)])
def test_sends_and_receives_are_explicit_for_every_cross_rank_boundary(kind, v):
    p, m = 4, 8
    s = build_schedule(kind, p, m, v)
    cross = sum(1 for st in range(p * v - 1) if s.stage_to_rank[st] != s.stage_to_rank[st + 1])
    sends = [a for actions in s.actions for a in actions if a.kind is ActionKind.SEND]
    recvs = [a for actions in s.actions for a in actions if a.kind is ActionKind.RECV]
    assert len(sends) == len(recvs) == 2 * cross * m  # an activation and a gradient per boundary and microbatch
    assert {a.tensor for a in sends} == {a.tensor for a in recvs}


def test_dualpipe_v_pairs_wait_for_both_inputs_and_split_only_the_edges():
    p, m = 4, 12
    s = build_schedule("dualpipe_v", p, m, 2)
    assert s.stage_to_rank == (0, 1, 2, 3, 3, 2, 1, 0)
    text = [str(a) for a in s.actions[1]]
    # an overlapped pair (chunk-0 forward, chunk-1 backward): both receives, then the two computes
    i = text.index("F s1 mb6")
    assert text[i - 2:i] == ["recv activation s1 mb6 <- rank 0", "recv gradient s6 mb2 <- rank 0"]
    assert text[i + 1:i + 3] == ["send activation s1 mb6 -> rank 2", "B s6 mb2"]
    kinds = [a.kind for actions in s.actions for a in actions if a.is_compute]
    full = kinds.count(ActionKind.BACKWARD)
    split = kinds.count(ActionKind.BACKWARD_INPUT)
    assert full + split == 2 * p * m and split == kinds.count(ActionKind.BACKWARD_WEIGHT) and 0 < split < full


def test_zero_bubble_schedules_split_every_backward():
    for kind, v in [("zb_h1", 1), ("zb_v", 2)]:
        kinds = {a.kind for actions in build_schedule(kind, 3, 6, v).actions for a in actions}
        assert ActionKind.BACKWARD not in kinds and {ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT} <= kinds


@pytest.mark.parametrize("m", [1, 2, 5])
def test_zb_v_with_few_microbatches_is_still_valid(m):
    s = build_schedule("zb_v", 4, m, 2)
    assert s.num_microbatches == m and all(a.microbatch < m for actions in s.actions for a in actions)


@pytest.mark.parametrize("kind,args,match", [
    ("pipedream", (4, 8), r"kind='pipedream': expected one of \['gpipe', '1f1b', 'interleaved_1f1b', 'zb_h1', "
                          r"'zb_v', 'dualpipe_v'\]"),
    ("gpipe", (0, 8), r"num_stages=0: expected a positive int"),
    ("gpipe", (4, -1), r"num_microbatches=-1: expected a positive int"),
    ("gpipe", (4, 8, 0), r"num_chunks=0: expected a positive int"),
    ("gpipe", (4.0, 8), r"num_stages=4.0: expected a positive int"),
    ("gpipe", (True, 8), r"num_stages=True: expected a positive int"),
    ("1f1b", (4, 3), r"num_microbatches=3: '1f1b' needs at least num_stages=4 microbatches"),
    ("zb_h1", (8, 4), r"num_microbatches=4: 'zb_h1' needs at least num_stages=8 microbatches"),
    ("gpipe", (4, 8, 2), r"num_chunks=2: 'gpipe' places one stage per rank, expected num_chunks=1"),
    ("1f1b", (4, 8, 2), r"num_chunks=2: '1f1b' places one stage per rank"),
    ("zb_v", (4, 8), r"num_chunks=1: V-shaped schedules \('zb_v'\) need exactly 2 chunks per rank"),
    ("zb_v", (4, 8, 3), r"num_chunks=3: V-shaped schedules \('zb_v'\) need exactly 2 chunks per rank"),
    ("interleaved_1f1b", (4, 8), r"num_chunks=1: 'interleaved_1f1b' needs num_chunks >= 2"),
    ("dualpipe_v", (4, 8), r"num_chunks=1: V-shaped schedules \('dualpipe_v'\) need exactly 2 chunks per rank"),
    ("dualpipe_v", (4, 7, 2), r"num_microbatches=7: 'dualpipe_v' needs at least 2 \* num_stages = 8 microbatches"),
    ("interleaved_1f1b", (4, 6, 2), r"num_microbatches=6: 'interleaved_1f1b' needs a multiple of num_stages=4 "
                                    r"\(Megatron-LM's requirement"),
])
def test_impossible_requests_name_the_argument(kind, args, match):
    with pytest.raises(ValueError, match=match):
        build_schedule(kind, *args)


def test_gpipe_accepts_fewer_microbatches_than_stages():
    s = build_schedule("gpipe", 4, 2)
    assert s.num_microbatches == 2
