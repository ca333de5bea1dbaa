"""A pipeline stage's StrategyTable is sliced from the job's (the strategy resolved once per job):
the same layouts as resolving the stage's own strategy, the job's sources, refusals named."""
import math

import pytest
from mindspore import nn

import mindspore_hyper as mh
from mindspore_hyper.shard import Layout
from mindspore_hyper.shard.model_strategy import Strategy
from mindspore_hyper.strategy.resolve import resolve_strategy
from mindspore_hyper.strategy.stage_table import stage_table

JOB = Layout((2, 2, 2), ("data", "tensor", "pipeline"))
STAGE = Layout((2, 2), ("data", "tensor"))


def _chain():
    """Dense 8->8->6->3: dimension 3 does not divide by the tensor axis (the default map leaves it whole)."""
    return nn.SequentialCell([nn.Dense(8, 8), nn.Dense(8, 6), nn.Dense(6, 3)])


@pytest.mark.parametrize("optimizer_state", ["data", "pipeline", None])
def test_the_slice_equals_resolving_the_stage_strategy(optimizer_state):
    model = _chain()
    strategy = JOB(tensor_map=("tensor",), optimizer_state=optimizer_state, overrides={"1.weight": (None, "tensor")})
    job = resolve_strategy(model, strategy, optimizer_states=1)
    names = ["1.weight", "1.bias", "2.weight", "2.bias"]  # the stage of the last two layers
    sliced = stage_table(job, names, STAGE, "pipeline")
    # what the pipeline did before: the stage's own strategy (pipeline axis dropped), resolved again
    own = Strategy(STAGE, ("tensor",), optimizer_state if optimizer_state != "pipeline" else None,
                   overrides={"1.weight": (None, "tensor")})
    assert sliced.names() == names and sliced.mesh is STAGE and sliced.optimizer_states == 1
    assert sliced.strategy.overrides == own.overrides and sliced.strategy.optimizer_state == own.optimizer_state
    for row in sliced:
        want = own.param_placement(row.name, row.global_shape)
        assert (row.layout, row.optimizer_layout, row.local_shape) == (want.layout, want.optimizer_layout,
                                                                        want.local_shape)
        assert row.source == job[row.name].source and row.notes == job[row.name].notes
        assert row.devices == STAGE.ranks and row.stage is None
        # float32 (4 bytes), one optimizer state per parameter element of the state's shard
        assert row.param_bytes == math.prod(row.local_shape) * 4
        assert row.optimizer_bytes == math.prod(row.optimizer_layout.local_shape(row.global_shape)) * 4
    assert sliced["2.weight"].layout.tensor_map == (None, None) and sliced["2.weight"].notes  # 3 rows: left whole
    if optimizer_state == "pipeline":  # ZeRO-1 along the pipeline axis means nothing inside a stage
        assert all(row.optimizer_layout == row.layout for row in sliced)
        assert job["1.weight"].optimizer_layout != job["1.weight"].layout


def test_the_slice_refuses_what_is_no_stage_of_the_job():
    job = resolve_strategy(_chain(), JOB(tensor_map=("tensor",)))
    with pytest.raises(ValueError, match=r"axis='cp' is not an axis of the job mesh"):
        stage_table(job, ["0.bias"], STAGE, "cp")
    with pytest.raises(ValueError, match=r"stage_mesh .* is not the job mesh .* without axis 'pipeline'"):
        stage_table(job, ["0.bias"], Layout((4,), ("data",)), "pipeline")
    with pytest.raises(ValueError, match=r"parameters \['head.weight'\] are not in the job's strategy table"):
        stage_table(job, ["0.bias", "head.weight"], STAGE, "pipeline")
    split = resolve_strategy(_chain(), JOB(tensor_map=("pipeline",)))  # the pipeline build refuses this strategy
    with pytest.raises(ValueError, match=r"parameter '0.weight': its layout \('pipeline', None\) splits along the "
                                         r"pipeline axis 'pipeline'"):
        stage_table(split, ["0.weight"], STAGE, "pipeline")


def test_a_pipelined_job_resolves_its_strategy_once(monkeypatch):
    """Each parameter is placed once, by the job's resolution; the stages slice that table."""
    placed = []
    original = Strategy.param_placement

    def counting(self, name, shape):
        placed.append(name)
        return original(self, name, shape)

    monkeypatch.setattr(Strategy, "param_placement", counting)
    mh.set_context(mode="simulation", device_num=4)
    model = nn.WithLossCell(nn.SequentialCell([nn.Dense(8, 8), nn.ReLU(), nn.Dense(8, 4)]), nn.MSELoss())
    parallel = mh.auto_parallelize(model, Layout((2, 2), ("data", "pipeline"))(tensor_map=()),
                                   pipeline=dict(schedule="1f1b", microbatches=2))
    names = [n for n, _ in model.parameters_and_names()]
    assert sorted(placed) == sorted(names)  # once each: no stage resolved the strategy again
    stage_rows = {row.name: row for m in parallel.stage_models.values() for row in m.table}
    assert sorted(stage_rows) == sorted(names)
    assert all(row.layout.mesh is parallel.stage_mesh and row.tensor_map == parallel.table[name].tensor_map
               for name, row in stage_rows.items())
