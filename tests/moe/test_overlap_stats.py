"""Overlap ratio from exchange and wait timestamps (moe/overlap_stats.py)."""
import pytest

from mindspore_hyper.moe.overlap_stats import merge, overlap_report


def test_merge_joins_overlapping_and_drops_empty_intervals():
    assert merge([(3, 4), (0, 1), (0.5, 2), (5, 5)]) == [(0, 2), (3, 4)]


def test_hidden_is_communication_outside_the_waits():
    # exchanges 0-2 and 3-6; the layer waited 1.5-3.5 (0.5 s exposed on each exchange, 0.5 s queueing)
    r = overlap_report([(0, 2), (3, 6)], [(1.5, 3.5)])
    assert r["comm_seconds"] == pytest.approx(5.0)
    assert r["exposed_seconds"] == pytest.approx(1.0)
    assert r["hidden_seconds"] == pytest.approx(4.0)
    assert r["overlap_ratio"] == pytest.approx(0.8)
    assert r["wait_seconds"] == pytest.approx(2.0)
    assert r["queue_seconds"] == pytest.approx(1.0)


def test_all_exposed_and_no_communication():
    assert overlap_report([(0, 1)], [(0, 1)])["overlap_ratio"] == 0.0
    assert overlap_report([(0, 1)], [])["overlap_ratio"] == 1.0
    assert overlap_report([], [(0, 1)])["overlap_ratio"] == 0.0
