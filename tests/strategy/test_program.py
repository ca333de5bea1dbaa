"""`program_of`: the shape a resolved strategy runs as (SPMD, pipeline stages, MPMD groups), decided once."""
import pytest
from mindspore import nn

import mindspore_hyper as mh
from mindspore_hyper import Layout
from mindspore_hyper.strategy.program import Program, program_of
from mindspore_hyper.strategy.resolve import resolve_strategy


def _table(pipeline_stages=None):
    config = {"parallel_config": {"device_matrix": [2, 2], "alias_names": ["data", "pipeline"]}}
    if pipeline_stages:
        config["parallel_config"]["module_level"] = [{"name": "*", "strategy": {"pipeline": pipeline_stages}}]
    return resolve_strategy(nn.SequentialCell(nn.Dense(4, 4), nn.Dense(4, 4)), mh.load_parallel_config(config))


def test_pipeline_when_asked_or_configured_and_the_opt_out():
    spmd = resolve_strategy(nn.Dense(4, 4), Layout((2,), ("data",))(tensor_map=()))
    assert program_of(spmd).shape == "spmd"
    assert program_of(spmd, pipeline={"microbatches": 2}).shape == "pipeline"
    staged = _table(pipeline_stages=2)
    assert staged.pipeline_stages == 2
    assert program_of(staged).shape == "pipeline"
    assert program_of(staged, pipeline=False).shape == "spmd"
    assert program_of(staged).without_pipeline().shape == "spmd"


def test_unknown_shape_is_refused_by_name():
    with pytest.raises(ValueError, match=r"Program.shape='graph': expected one of \('spmd', 'pipeline', 'mpmd'\)"):
        Program("graph", _table())
