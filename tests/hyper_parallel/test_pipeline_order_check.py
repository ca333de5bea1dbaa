"""Upstream's execution-order checks (`validate_pipeline_execution` and its parts): transfer names,
unmatched ends, and deadlocks, against hand-derived orders and this package's own deadlock check."""
import logging

import pytest

from mindspore_hyper.hyper_parallel import (
    MetaStep, MetaStepType, detect_cycle_in_graph, generate_operations, install_hyper_parallel, parse_and_validate,
    validate_pipeline_execution,
)
from mindspore_hyper.hyper_parallel.pipeline_steps import meta_steps
from mindspore_hyper.schedule.build import build_schedule
from mindspore_hyper.schedule.errors import ScheduleError
from mindspore_hyper.schedule.validate import validate_schedule

F, B = MetaStepType.FWD, MetaStepType.BWD
FS, FR, BS, BR = MetaStepType.FWD_SEND, MetaStepType.FWD_RECV, MetaStepType.BWD_SEND, MetaStepType.BWD_RECV


def two_rank_order(last_rank):
    """1F1B over 2 ranks, 2 microbatches: rank 0 as this package's schedule runs it, rank 1 given."""
    first = [MetaStep(0, F, 0), MetaStep(0, FS, 0), MetaStep(1, F, 0), MetaStep(1, FS, 0),
             MetaStep(0, BR, 0), MetaStep(0, B, 0), MetaStep(1, BR, 0), MetaStep(1, B, 0)]
    return {0: first, 1: last_rank}


def name(src, dst, micro, k=1):
    return f"Send_Receive_({src})->({dst})_micro{micro}_{k}th"


def test_transfers_are_named_by_both_ends_and_counted_per_microbatch():
    # 2 ranks x 2 chunks ("loop": stages 0, 2 on rank 0; 1, 3 on rank 1): microbatch 0 goes 0 -> 1 twice
    order = {0: [MetaStep(0, F, 0), MetaStep(0, FS, 0), MetaStep(0, FR, 2), MetaStep(0, F, 2), MetaStep(0, FS, 2)],
             1: [MetaStep(0, FR, 1), MetaStep(0, F, 1), MetaStep(0, FS, 1), MetaStep(0, FR, 3), MetaStep(0, F, 3),
                 MetaStep(0, FS, 3)]}
    assert generate_operations(order, chunk_num=2) == {
        "0": [name(0, 1, 0), name(1, 0, 0), name(0, 1, 0, 2)],
        "1": [name(0, 1, 0), name(1, 0, 0), name(0, 1, 0, 2)]}  # the last stage's send has no peer: left out
    # "v": stages 0, 1 go out (ranks 0, 1), stages 2, 3 come back (ranks 1, 0)
    v_order = {0: [MetaStep(0, F, 0), MetaStep(0, FS, 0)], 1: [MetaStep(0, FR, 1), MetaStep(0, FS, 1)]}
    assert generate_operations(v_order, chunk_num=2, com_type="v") == {
        "0": [name(0, 1, 0)], "1": [name(0, 1, 0), name(1, 1, 0)]}
    with pytest.raises(ValueError, match="com_type must be 'loop' .* or 'v'"):
        generate_operations(order, chunk_num=2, com_type="zigzag")
    with pytest.raises(ValueError, match="com_type='v' places 2 stages per rank .* chunk_num=3"):
        generate_operations(order, chunk_num=3, com_type="v")
    with pytest.raises(ValueError, match="chunk_num must be an int >= 1"):
        generate_operations(order, chunk_num=0)
    with pytest.raises(TypeError, match=r"order_list\[1\]\[1\]: expected a MetaStep \(or None for a bubble\)"):
        generate_operations({0: [], 1: [MetaStep(0, FR, 1), "FWD"]}, chunk_num=1)
    bubbles = {rank: [None, *steps, None] for rank, steps in order.items()}  # upstream's schedules leave None
    assert generate_operations(bubbles, chunk_num=2) == generate_operations(order, chunk_num=2)


def test_unmatched_ends_are_reported_and_logged_not_raised(caplog):
    with caplog.at_level(logging.ERROR):
        problems = parse_and_validate({"1": [name(1, 2, 0)], "2": [name(1, 2, 0), name(1, 2, 0, 2)],
                                       "3": "not a list"})
    assert problems == ["rank '1' is missing 'Send_Receive_(1)->(2)_micro0_2th', which rank '2' runs",
                        "rank '3': expected a list of transfer names (str), but got 'not a list'"]
    assert [r.getMessage() for r in caplog.records] == problems
    assert parse_and_validate({"1": [name(1, 4, 0)]}) == [
        "'Send_Receive_(1)->(4)_micro0_1th' (rank '1') names ranks ['4'] that the order does not hold"]
    assert parse_and_validate({"1": [name(1, 4, 0)]}, all_rank=False) == []
    assert parse_and_validate({"1": [name(1, 2, 0)], "2": [name(1, 2, 0)]}) == []
    assert parse_and_validate(["1"]) == ["the order must be a dict of rank -> list of transfer names, but got list"]


def test_cycles_are_found_with_the_ranks_listing_their_edges():
    assert detect_cycle_in_graph({}) == (None, None)
    assert detect_cycle_in_graph({"r": ["A"]}) == (None, None)
    assert detect_cycle_in_graph({"r": ["A", "A"]}) == (["A", "A"], ["r A -> A"])
    assert detect_cycle_in_graph({"1": ["A", "B"], "2": ["B", "C"], "3": ["C", "B"]}) == (
        ["B", "C", "B"], ["2 B -> C", "3 C -> B"])
    assert detect_cycle_in_graph({"1": ["A", "B", "C"], "2": ["C", "D", "E"], "3": ["E", "A"]}) == (
        ["A", "B", "C", "D", "E", "A"], ["1 A -> B", "1 B -> C", "2 C -> D", "2 D -> E", "3 E -> A"])
    # a long chain listed by many ranks, and a diamond: no cycle (an explored node is not a cycle)
    assert detect_cycle_in_graph({r: list("ABCDEFGHI") for r in range(8)}) == (None, None)
    assert detect_cycle_in_graph({"1": ["A", "B", "D"], "2": ["A", "C", "D"]}) == (None, None)
    deep = [f"n{i}" for i in range(20000)]  # deeper than Python's recursion limit
    assert detect_cycle_in_graph({"1": deep}) == (None, None)
    assert detect_cycle_in_graph({"1": deep + ["n0"]})[0] == deep + ["n0"]


def test_a_rank_waiting_for_a_gradient_before_sending_its_activation_deadlocks(caplog):
    last = [MetaStep(0, FR, 1), MetaStep(0, F, 1), MetaStep(0, B, 1), MetaStep(0, BS, 1)]
    stuck = {0: [MetaStep(0, F, 0), MetaStep(0, BR, 0), MetaStep(0, FS, 0), MetaStep(0, B, 0)], 1: last}
    with caplog.at_level(logging.ERROR):
        result = validate_pipeline_execution(stuck, chunk_num=1)
    assert result["has_cycle"] and result["problems"] == []
    assert result["cycle_path"] == [name(1, 0, 0), name(0, 1, 0), name(1, 0, 0)]
    assert result["cycle_ranks"] == [f"0 {name(1, 0, 0)} -> {name(0, 1, 0)}", f"1 {name(0, 1, 0)} -> {name(1, 0, 0)}"]
    assert "pipeline order deadlocks" in caplog.text
    fine = {0: [MetaStep(0, F, 0), MetaStep(0, FS, 0), MetaStep(0, BR, 0), MetaStep(0, B, 0)], 1: last}
    result = validate_pipeline_execution(fine, chunk_num=1)
    assert not result["has_cycle"] and result["cycle_path"] is None and result["problems"] == []
    assert result["formatted_operations"] == {"0": [name(0, 1, 0), name(1, 0, 0)], "1": [name(0, 1, 0), name(1, 0, 0)]}


def test_a_transfer_completes_on_both_ends_together_as_upstream_checks_it():
    """Upstream's check reads a transfer as one event of both ranks (a rendezvous): a last rank
    sending microbatch 0's gradient before receiving microbatch 1's activation deadlocks against a
    first rank sending microbatch 1 before receiving that gradient; posting the receive first is
    how upstream's orders avoid it."""
    send_first = [MetaStep(0, FR, 1), MetaStep(0, F, 1), MetaStep(0, B, 1), MetaStep(0, BS, 1),
                  MetaStep(1, FR, 1), MetaStep(1, F, 1), MetaStep(1, B, 1), MetaStep(1, BS, 1)]
    receive_first = [MetaStep(0, FR, 1), MetaStep(0, F, 1), MetaStep(1, FR, 1), MetaStep(0, B, 1),
                     MetaStep(0, BS, 1), MetaStep(1, F, 1), MetaStep(1, B, 1), MetaStep(1, BS, 1)]
    assert validate_pipeline_execution(two_rank_order(send_first), 1)["cycle_path"] == [
        name(0, 1, 1), name(1, 0, 0), name(0, 1, 1)]
    assert not validate_pipeline_execution(two_rank_order(receive_first), 1)["has_cycle"]


@pytest.mark.parametrize("kind, ranks, micro, chunks", [("gpipe", 4, 8, 1), ("1f1b", 2, 2, 1), ("1f1b", 4, 8, 1),
                                                        ("interleaved_1f1b", 2, 4, 2),
                                                        ("interleaved_1f1b", 3, 6, 3)])
def test_agrees_with_this_packages_rendezvous_deadlock_check(kind, ranks, micro, chunks):
    """On this package's schedules the answer is its own check's with sends that wait for their
    receive; the schedules run with sends handed to the transport (buffered), which never deadlock."""
    schedule = build_schedule(kind, ranks, micro, chunks)
    result = validate_pipeline_execution(meta_steps(schedule), chunks)
    assert result["problems"] == []
    try:
        validate_schedule(schedule, sends="rendezvous")
        rendezvous_deadlocks = False
    except ScheduleError as error:
        assert error.rule == "deadlock"
        rendezvous_deadlocks = True
    assert result["has_cycle"] == rendezvous_deadlocks
    validate_schedule(schedule, sends="buffered")


def test_upstreams_scheduler_module_path_gives_these_functions():
    install_hyper_parallel()
    from hyper_parallel.core.pipeline_parallel import scheduler

    assert scheduler.validate_pipeline_execution is validate_pipeline_execution
    assert scheduler.detect_cycle_in_graph is detect_cycle_in_graph
