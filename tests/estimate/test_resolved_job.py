"""`job_strategy_of`: the JobStrategy read off a resolved strategy equals the one it was laid out from.

The GPT of examples/models.py is laid out by `gpt_parallel_config` for each JobStrategy, resolved
(`resolve_strategy`, tables only: no model step runs), and the derived sizes and ZeRO stage must
give back the JobStrategy; strategies that sizes cannot describe are refused by name.
"""
import os
import sys

import pytest

from mindspore_hyper import Layout
from mindspore_hyper.estimate import JobStrategy, gpt_parallel_config
from mindspore_hyper.estimate.resolved_job import job_strategy_of
from mindspore_hyper.strategy.resolve import resolve_strategy

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from models import GPT  # noqa: E402  examples/models.py


def _gpt():
    return GPT(vocab=128, hidden=64, heads=4, layers=2, seq=16)


@pytest.mark.parametrize("strategy", [
    JobStrategy(), JobStrategy(data=2), JobStrategy(data=4, zero_stage=1), JobStrategy(data=4, zero_stage=3),
    JobStrategy(tensor=4), JobStrategy(data=2, tensor=2, zero_stage=1),
    JobStrategy(data=2, pipeline=2, zero_stage=1), JobStrategy(data=2, tensor=2, pipeline=2, zero_stage=3),
])
def test_the_gpt_layout_resolves_back_to_its_job_strategy(strategy):
    table = resolve_strategy(_gpt(), gpt_parallel_config(strategy))
    assert job_strategy_of(table) == strategy


def test_other_fields_pass_through_and_derived_ones_are_refused():
    table = resolve_strategy(_gpt(), gpt_parallel_config(JobStrategy(data=2)))
    assert job_strategy_of(table, recompute="full") == JobStrategy(data=2, recompute="full")
    with pytest.raises(ValueError, match="data, zero_stage come from the table"):
        job_strategy_of(table, data=2, zero_stage=1)


def test_a_second_splitting_axis_is_refused():
    mesh = Layout((2, 2), ("rows", "cols"))
    strategy = mesh(tensor_map=())
    strategy.override("blocks.*.fc1.weight", "rows", "cols")
    with pytest.raises(ValueError, match=r"split along \['cols', 'rows'\]; a JobStrategy has one tensor axis"):
        job_strategy_of(resolve_strategy(_gpt(), strategy))


def test_an_unused_mesh_axis_is_refused():
    strategy = Layout((2, 2), ("data", "extra"))(tensor_map=())
    with pytest.raises(ValueError, match="mesh axis 'extra' of size 2 is none of data"):
        job_strategy_of(resolve_strategy(_gpt(), strategy))


def test_crosscheck_refuses_a_layout_that_resolves_to_another_strategy(monkeypatch):
    from mindspore_hyper.estimate import crosscheck, preset

    # a layout of ZeRO-1 handed in for a ZeRO-0 strategy: refused before any step runs
    monkeypatch.setattr(crosscheck, "gpt_parallel_config", lambda s: gpt_parallel_config(s.with_(zero_stage=1)))
    with pytest.raises(ValueError, match="not the strategy's: zero_stage=0 asked, 1 laid out"):
        crosscheck.crosscheck_gpt(GPT, preset("gpt-example"), JobStrategy(data=2))
