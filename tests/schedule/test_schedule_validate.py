"""validate_schedule(): a hand-broken schedule for each rule, with the message it must give."""
import dataclasses

import pytest

from mindspore_hyper.schedule import Action, ActionKind, Payload, ScheduleError, build_schedule, validate_schedule

F, B, BI, BW = ActionKind.FORWARD, ActionKind.BACKWARD, ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT


def with_rank(schedule, rank, actions):
    lists = list(schedule.actions)
    lists[rank] = tuple(actions)
    return dataclasses.replace(schedule, actions=tuple(lists))


def index_of(actions, text):
    return [str(a) for a in actions].index(text)


def broken(schedule, match, rule):
    with pytest.raises(ScheduleError, match=match) as info:
        validate_schedule(schedule)
    assert info.value.rule == rule
    return info.value


def test_every_built_schedule_is_valid():
    for kind, v in [("gpipe", 1), ("1f1b", 1), ("zb_h1", 1), ("interleaved_1f1b", 2), ("zb_v", 2)]:
        validate_schedule(build_schedule(kind, 4, 8, v))


def test_wrong_number_of_rank_lists():
    s = build_schedule("1f1b", 3, 3)
    broken(dataclasses.replace(s, actions=s.actions[:2]), r"2 rank action lists, expected num_stages=3", "shape")


def test_rank_holding_two_stages():
    s = build_schedule("1f1b", 3, 3)
    broken(dataclasses.replace(s, stage_to_rank=(0, 0, 2)), r"rank 0 holds stages \[0, 1\], expected num_chunks=1",
           "placement")


def test_action_on_a_rank_its_stage_is_not_placed_on():
    s = build_schedule("1f1b", 3, 3)
    stray = Action(F, 1, 0, 0)
    broken(with_rank(s, 0, s.actions[0] + (stray,)), r"rank 0 #\d+ 'F s1 mb0': stage 1 is placed on rank 1; each stage "
                                                     r"runs on exactly one rank", "placement")


def test_wrong_chunk_and_missing_microbatch():
    s = build_schedule("interleaved_1f1b", 2, 2, 2)
    a = s.actions[1][0]
    bad_chunk = dataclasses.replace(a, chunk=1)
    broken(with_rank(s, 1, (bad_chunk,) + s.actions[1][1:]), r"chunk 1, but stage 1 is chunk 0 of rank 1",
           "placement")
    bad_mb = dataclasses.replace(s.actions[0][0], microbatch=7)
    broken(with_rank(s, 0, (bad_mb,) + s.actions[0][1:]), r"microbatch 7 does not exist", "placement")


def test_send_to_the_wrong_peer():
    s = build_schedule("1f1b", 3, 3)
    i = index_of(s.actions[0], "send activation s0 mb0 -> rank 1")
    wrong = dataclasses.replace(s.actions[0][i], peer=2)
    acts = list(s.actions[0])
    acts[i] = wrong
    broken(with_rank(s, 0, acts), r"peer is rank 2 but stage 1 is on rank 1", "placement")


def test_send_between_stages_of_one_rank():
    s = build_schedule("zb_v", 2, 4, 2)  # stages 1 and 2 both live on rank 1
    extra = Action(ActionKind.SEND, 1, 0, 0, peer=0, payload=Payload.ACTIVATION)
    broken(with_rank(s, 1, s.actions[1] + (extra,)), r"stages 1 and 2 are both on rank 1; the tensor is handed over "
                                                     r"locally", "placement")


def test_missing_forward_and_duplicate_backward():
    s = build_schedule("gpipe", 2, 2)
    acts = [a for a in s.actions[0] if str(a) != "F s0 mb1"]
    acts = [a for a in acts if str(a) != "send activation s0 mb1 -> rank 1"]
    broken(with_rank(s, 0, acts), r"stage 0 mb 1: 0 forwards, expected exactly one", "count")
    twice = s.actions[1] + (Action(B, 1, 0, 0),)
    broken(with_rank(s, 1, twice), r"stage 1 mb 0: 2 full, 0 input and 0 weight backwards \(rank 1 #\d+, rank 1 #\d+\)",
           "count")


def test_full_and_split_backward_mixed():
    s = build_schedule("zb_h1", 2, 2)
    acts = [a for a in s.actions[1] if str(a) != "Bw s1 mb0"] + [Action(B, 1, 0, 0)]
    broken(with_rank(s, 1, acts), r"stage 1 mb 0: 1 full, 1 input and 0 weight backwards", "count")


def test_backward_before_its_forward():
    s = build_schedule("gpipe", 2, 2)
    acts = list(s.actions[1])
    f, b = index_of(acts, "F s1 mb1"), index_of(acts, "B s1 mb1")
    acts[f], acts[b] = acts[b], acts[f]
    broken(with_rank(s, 1, acts), r"rank 1 #\d+ 'B s1 mb1': a backward only after its forward", "order")


def test_weight_gradient_before_its_input_gradient():
    s = build_schedule("zb_h1", 2, 2)
    acts = list(s.actions[0])
    bi, bw = index_of(acts, "Bi s0 mb1"), index_of(acts, "Bw s0 mb1")
    acts[bi], acts[bw] = acts[bw], acts[bi]
    broken(with_rank(s, 0, acts), r"'Bw s0 mb1': a weight-gradient only after its input-gradient", "order")


def test_forward_before_its_input_arrives():
    s = build_schedule("1f1b", 2, 2)
    acts = list(s.actions[1])
    r, f = index_of(acts, "recv activation s1 mb0 <- rank 0"), index_of(acts, "F s1 mb0")
    acts[r], acts[f] = acts[f], acts[r]
    broken(with_rank(s, 1, acts), r"'F s1 mb0': runs before its activation arrives: no earlier "
                                  r"'recv activation s1 mb0' on rank 1", "order")


def test_local_handover_out_of_order():
    s = build_schedule("zb_v", 2, 4, 2)  # rank 1 runs stage 1 then stage 2 without send/recv
    acts = list(s.actions[1])
    f1, f2 = index_of(acts, "F s1 mb0"), index_of(acts, "F s2 mb0")
    acts[f1], acts[f2] = acts[f2], acts[f1]
    broken(with_rank(s, 1, acts), r"'F s2 mb0': its input comes from F s1 mb0 on the same rank, which has not run yet",
           "order")


def test_receive_without_send_and_send_twice():
    s = build_schedule("1f1b", 2, 2)
    no_send = [a for a in s.actions[0] if str(a) != "send activation s0 mb1 -> rank 1"]
    broken(with_rank(s, 0, no_send), r"rank 1 #\d+ 'recv activation s1 mb1 <- rank 0' has no matching send on rank 0",
           "pairing")
    i = index_of(s.actions[0], "send activation s0 mb1 -> rank 1")
    twice = s.actions[0][:i + 1] + s.actions[0][i:]
    broken(with_rank(s, 0, twice), r"activation s0->s1 mb1 is sent 2 times \(rank 0 #\d+, rank 0 #\d+\)", "pairing")


def test_deadlock_names_the_cycle():
    # rank 0 holds back mb1's activation until it has mb1's gradient, which needs that activation
    s = build_schedule("1f1b", 2, 2)
    acts = list(s.actions[0])
    send = acts.pop(index_of(acts, "send activation s0 mb1 -> rank 1"))
    acts.insert(index_of(acts, "B s0 mb1") + 1, send)
    err = broken(with_rank(s, 0, acts), r"wait cycle 0 -> 1 -> 0 with buffered sends: rank 0 blocks at #5 'recv "
                                        r"gradient s0 mb1 <- rank 1' waiting for rank 1; rank 1 blocks at #4 'recv "
                                        r"activation s1 mb1 <- rank 0' waiting for rank 0", "deadlock")
    assert err.cycle == ((0, 5, "recv gradient s0 mb1 <- rank 1"), (1, 4, "recv activation s1 mb1 <- rank 0"))


def test_rendezvous_sends_deadlock_textbook_1f1b():
    s = build_schedule("1f1b", 4, 8)
    with pytest.raises(ScheduleError, match=r"wait cycle 2 -> 3 -> 2 with rendezvous sends: rank 2 blocks at #\d+ "
                                            r"'send activation s2 mb1 -> rank 3' waiting for rank 3; rank 3 blocks "
                                            r"at #\d+ 'send gradient s3 mb0 -> rank 2'") as info:
        validate_schedule(s, sends="rendezvous")
    assert info.value.rule == "deadlock"
    validate_schedule(build_schedule("gpipe", 4, 8), sends="rendezvous")


def test_three_rank_cycle():
    # each rank receives from its left neighbour before sending to its right one: a ring wait
    acts = []
    for rank in range(3):
        right, left = (rank + 1) % 3, (rank - 1) % 3
        acts.append([Action(ActionKind.RECV, rank, 0, 0, peer=left, payload=Payload.ACTIVATION),
                     Action(ActionKind.SEND, rank, 0, 0, peer=right, payload=Payload.ACTIVATION)])
    from mindspore_hyper.schedule.deadlock import check_deadlock

    with pytest.raises(ScheduleError, match=r"wait cycle 0 -> 2 -> 1 -> 0") as info:
        check_deadlock(acts)
    assert [rank for rank, _, _ in info.value.cycle] == [0, 2, 1]


def test_bad_sends_argument():
    with pytest.raises(ValueError, match=r"sends='eager': expected one of \('buffered', 'rendezvous'\)"):
        validate_schedule(build_schedule("gpipe", 2, 2), sends="eager")


def test_action_value_checks():
    with pytest.raises(ValueError, match=r"Action.stage=-1: expected an int >= 0"):
        Action(F, -1, 0, 0)
    with pytest.raises(ValueError, match=r"a send needs the peer rank"):
        Action(ActionKind.SEND, 0, 0, 0, payload=Payload.ACTIVATION)
    with pytest.raises(ValueError, match=r"Action.payload=None: a recv needs 'activation' or 'gradient'"):
        Action(ActionKind.RECV, 1, 0, 0, peer=0)
    with pytest.raises(ValueError, match=r"peer and payload are only for send/recv"):
        Action(F, 0, 0, 0, peer=1)
    with pytest.raises(ValueError, match=r"only send/recv actions move a tensor"):
        Action(F, 0, 0, 0).tensor


def test_action_kind_and_payload_names():
    assert Action("forward", 0, 0, 0).kind is F
    assert Action("send", 0, 0, 0, peer=1, payload="gradient").payload is Payload.GRADIENT
    with pytest.raises(ValueError, match=r"Action.kind='fwd': expected one of \['forward', 'backward', "):
        Action("fwd", 0, 0, 0)
    with pytest.raises(ValueError, match=r"Action.payload='weights': a send needs 'activation' or 'gradient'"):
        Action("send", 0, 0, 0, peer=1, payload="weights")
