"""MoE layers inside pipeline stages (simulation): every stage's router auxiliary loss joins the
loss and its gradient; losses and parameters after 5 Adam steps equal one device accumulating
the same microbatches, pipeline alone and with an expert axis inside each stage (under msrun:
test_moe_pipeline_msrun.py)."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn

import mindspore_hyper as mh
from mindspore_hyper import Layout
from mindspore_hyper.moe import MoEBlock
from mindspore_hyper.pipeline import PipelineModel

from moe_models import MICROBATCHES, MoEChain, chain_data as _data, copy_weights, one_device_accumulating as _one_device
from tolerances import assert_adam_training_close, reduction_length, training_rtol

pytestmark = pytest.mark.usefixtures("pynative")


@pytest.fixture(scope="module")
def reference():
    ms.set_seed(0)
    model = MoEChain()
    init = {p.name: p.asnumpy().copy() for p in model.trainable_params()}
    losses = _one_device(model, _data())
    return init, losses, {p.name: p.asnumpy().copy() for p in model.trainable_params()}


MESHES = {"pipeline2": ((2,), ("pipeline",)), "pipeline2-expert2": ((2, 2), ("pipeline", "expert"))}


# every schedule kind asked for on the pipeline alone; with experts split inside the stages the
# two 1f1b-family schedules (full and split backward; the split one with the hierarchical
# dispatch over 2 expert groups), to keep the suite fast
CASES = [("pipeline2", "gpipe", {}), ("pipeline2", "1f1b", {}), ("pipeline2", "zb_h1", {}),
         ("pipeline2-expert2", "1f1b", {}),
         ("pipeline2-expert2", "zb_h1", {"dispatch": "hierarchical", "expert_groups": 2})]


@pytest.mark.parametrize("mesh,kind,moe_options", CASES)
def test_moe_stages_train_like_one_device(mesh, kind, moe_options, reference):
    init, ref_losses, ref_params = reference
    matrix, names = MESHES[mesh]
    mh.set_context(mode="simulation", device_num=int(np.prod(matrix)))
    model = MoEChain(**moe_options)
    for p in model.trainable_params():
        p.set_data(Tensor(init[p.name]))
    strategy = Layout(matrix, names)(tensor_map=())
    if "expert" in names:
        strategy.override("*.experts.*", "expert")
    parallel = mh.auto_parallelize(model, strategy, pipeline=dict(schedule=kind, microbatches=MICROBATCHES,
                                                                  layers_per_stage=(2, 3)))
    assert isinstance(parallel, PipelineModel)
    assert all(any(isinstance(c, MoEBlock) for c in parallel.stage_cells[s].cells()) for s in (0, 1))
    opt = nn.Adam(parallel.optimizer_parameters(), learning_rate=1e-2)
    losses = [float(parallel.train_step(opt, x, t).asnumpy()) for x, t in _data()]
    reduction = reduction_length(model.trainable_params(), 64)  # Adam-aware bounds: tests/tolerances.py
    np.testing.assert_allclose(losses, ref_losses, rtol=training_rtol(reduction, len(losses)))
    for p in model.trainable_params():
        assert_adam_training_close(p.asnumpy(), ref_params[p.name], 1e-2, len(losses), reduction, err_msg=p.name)
    # every stage's auxiliary loss was collected (one per microbatch forward) and is part of the loss
    assert [len(parallel.computations[s].aux_losses) for s in (0, 1)] == [MICROBATCHES, MICROBATCHES]
    assert all(a > 0 for s in (0, 1) for a in parallel.computations[s].aux_losses)
    if moe_options:  # the two-level exchange ran inside the stages
        assert model.block1.moe.parallel().last_stats["dispatch_link_bytes"]["inter_group"] > 0


def test_aux_loss_gradient_reaches_the_first_stage_router():
    """Without the first stage's auxiliary loss its router would get a different gradient: the
    pipeline's first step equals the reference only with it."""
    ms.set_seed(0)
    with_aux, without = MoEChain(), MoEChain(aux_loss_coef=0.0, z_loss_coef=0.0)
    copy_weights(with_aux, without)
    mh.set_context(mode="simulation", device_num=2)
    x, t = _data(1)[0]
    grads = {}
    for name, model in (("with", with_aux), ("without", without)):
        parallel = mh.auto_parallelize(model, Layout((2,), ("pipeline",))(tensor_map=()),
                                       pipeline=dict(schedule="1f1b", microbatches=MICROBATCHES,
                                                     layers_per_stage=(2, 3)))
        parallel.train_step(nn.SGD(parallel.optimizer_parameters(), learning_rate=0.0), x, t)
        grads[name] = parallel.last_gradients["block1.moe.router.weight"]
    assert not np.allclose(grads["with"], grads["without"], atol=1e-7)


def test_evaluation_forward_adds_the_aux_losses():
    ms.set_seed(0)
    model = MoEChain()
    mh.set_context(mode="simulation", device_num=2)
    x, t = _data(1)[0]
    expect = float(model(x, t).asnumpy())
    parallel = mh.auto_parallelize(model, Layout((2,), ("pipeline",))(tensor_map=()),
                                   pipeline=dict(schedule="1f1b", microbatches=MICROBATCHES, layers_per_stage=(2, 3)))
    assert abs(float(parallel(x, t).asnumpy()) - expect) < 1e-6


def test_aux_loss_without_a_collector_is_refused():
    block = MoEBlock(16, 24, 4)
    with pytest.raises(RuntimeError, match="MoEBlock adds an auxiliary loss but nothing collects it"):
        block(Tensor(np.ones((4, 16), np.float32)))
