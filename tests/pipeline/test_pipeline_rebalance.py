"""Stage rebalancing between steps (scheduler: dynamic): the planner's layer moves are applied
(layers change stage with their parameters and optimizer states) and training numerics stay
those of one device."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

import mindspore_hyper as mh
from mindspore_hyper import Layout
from pipeline_models import assert_same_training, batch, single_device_run


def heavy_tail(seed: int = 4):
    """A cheap first layer, then wide layers: a (1, 6) split loads stage 1 far more."""
    ms.set_seed(seed)
    layers = [nn.Dense(8, 8), nn.Dense(8, 512), nn.ReLU(), nn.Dense(512, 512), nn.Tanh(), nn.Dense(512, 512),
              nn.Dense(512, 4)]
    return nn.WithLossCell(nn.SequentialCell(layers), nn.MSELoss())


pytestmark = pytest.mark.usefixtures("pynative")


LAYER_COSTS = (1.0, 2.0, 0.5, 4.0, 0.5, 4.0, 1.0)  # seconds per layer and step, made up but fixed


def fixed_stage_times(self):
    """Stage times from LAYER_COSTS: on a tiny CPU model PyNative's per-op overhead dominates
    the measured times, so a test that needs a move feeds the planner a fixed load instead."""
    bounds = np.cumsum((0,) + self.split)
    return tuple(float(sum(LAYER_COSTS[bounds[s]:bounds[s + 1]])) for s in range(len(self.split)))


def test_dynamic_scheduler_moves_layers_and_keeps_numerics(monkeypatch):
    from mindspore_hyper.pipeline.pipeline_model import PipelineModel

    monkeypatch.setattr(PipelineModel, "stage_times", fixed_stage_times)
    x, y = batch()
    losses_ref, params_ref = single_device_run(heavy_tail(), x, y)
    model = heavy_tail()
    config = {"parallel_config": {"device_matrix": [2], "alias_names": ["pipeline"],
                                  "module_level": [{"name": "_backbone.*", "strategy": {"pipeline": 2}}]},
              "scheduler": "dynamic"}
    mh.set_context(mode="simulation", device_num=2)
    parallel = mh.auto_parallelize(model, mh.load_parallel_config(config),
                                   pipeline={"schedule": "1f1b", "microbatches": 2, "layers_per_stage": (1, 6)})
    optimizer = nn.Adam(parallel.optimizer_parameters(), 1e-2)
    losses, splits = [], []
    for _ in range(5):
        losses.append(float(parallel.train_step(optimizer, x, y).asnumpy()))
        splits.append(parallel.split)
    assert parallel.rebalance_log, "the planner moved nothing although stage 1 holds almost all the work"
    first = parallel.rebalance_log[0]
    assert first.before == (1, 6) and first.after[0] > 1
    assert all(move.source_stage == 1 and move.target_stage == 0 for move in first.moves)
    assert splits[0] == (1, 6)  # the first step's times (graph building) are not used
    assert first.after in splits[1:]
    moved = {name for move in first.moves for name in move.parameters}
    assert moved  # layers with parameters changed stage
    if parallel.split == first.after:
        assert moved <= {name for name, _ in parallel.stage_cells[0].parameters_and_names()}
    assert parallel.split != (1, 6)
    assert_same_training(model, losses, (losses_ref, params_ref))


def test_static_scheduler_keeps_the_split():
    x, y = batch()
    mh.set_context(mode="simulation", device_num=2)
    parallel = mh.auto_parallelize(heavy_tail(), Layout((2,), ("pipeline",))(tensor_map=()),
                                   pipeline={"schedule": "1f1b", "microbatches": 2, "layers_per_stage": (1, 6)})
    optimizer = nn.Adam(parallel.optimizer_parameters(), 1e-2)
    for _ in range(2):
        parallel.train_step(optimizer, x, y)
    assert parallel.split == (1, 6) and not parallel.rebalance_log


@pytest.mark.msrun
def test_rebalancing_under_msrun_migrates_parameters_and_optimizer_states(pipeline_2_processes):
    """2 processes start from (1, 6); the planner's move sends the moved layers' Parameters and
    Adam states to the new owner; the 5-step training still equals one device (the 2-process job
    of test_pipeline_msrun.py's GPT test, conftest.py's `pipeline_2_processes`)."""
    import json

    from pipeline_models import dense_chain

    folder, _ = pipeline_2_processes["rebalance"]
    x, y = batch()
    from tolerances import assert_adam_training_close, reduction_length, training_rtol

    model = dense_chain()
    losses, params = single_device_run(model, x, y)
    reduction = reduction_length(model.trainable_params(), 64)  # Adam-aware, see tests/tolerances.py
    owned = {}
    for rank in range(2):
        out = np.load(folder / f"rank{rank}.npz")
        plans = json.loads(str(out["plans"]))
        assert plans and plans[0][0] == [1, 6] and plans[0][1][0] > 1, plans
        assert int(out["migrated_bytes"]) > 0
        np.testing.assert_allclose(out["losses"], losses, rtol=training_rtol(reduction, len(losses)))
        for key in out.files:
            if key.startswith("param:"):
                owned.setdefault(key[6:], []).append(rank)
                assert_adam_training_close(out[key], params[key[6:]], 1e-2, len(losses), reduction, err_msg=key)
    assert sorted(owned) == sorted(params) and all(len(r) == 1 for r in owned.values()), owned
