"""Converted Cells run under mindspore_hyper.auto_parallelize in simulation mode with the outputs
(and gradients) of the converted Cell on one device."""
import numpy as np
import pytest
import torch
import mindspore as ms

from mindspore_hyper import Layout, auto_parallelize
from mindspore_hyper.migrate import convert
from mindspore_hyper.migrate.compare import cell_outputs, relative_error, to_mindspore

from migrate_models import TOL, gpt2, resnet


pytestmark = pytest.mark.usefixtures("pynative")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def single_and_simulated(cell, x, strategy, mh):
    ref = cell_outputs(cell(x))
    mh.set_context(mode="simulation", device_num=strategy.mesh.size)
    simulated = auto_parallelize(cell, strategy)
    return simulated, ref, cell_outputs(simulated(x))


def test_gpt2_on_data_by_tensor_mesh(clean_context):
    cell, _ = convert(gpt2().eval(), torch.randint(0, 101, (4, 8)))
    x = to_mindspore(torch.randint(0, 101, (4, 8)))
    layout = Layout((2, 2), ("data", "tensor"))
    strategy = layout(tensor_map=("tensor",))  # first dimension of every parameter split over "tensor"
    simulated, ref, got = single_and_simulated(cell, x, strategy, clean_context)
    assert relative_error(got, ref) <= TOL
    # gradients too
    params = cell.trainable_params()
    want = ms.grad(lambda a: cell(a).sum(), None, params)(x)
    grads = ms.grad(lambda a: simulated(a).sum(), None, params)(x)
    scale = max(float(np.abs(g.asnumpy()).max()) for g in want)
    for p, g, w in zip(params, grads, want):
        np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=TOL, atol=TOL * scale, err_msg=p.name)
    sharded = [r for r in simulated.table if r.layout.sharded_axes()]
    assert sharded, "some parameters are really split over the tensor axis"


@pytest.mark.parametrize("training", [False, True])
def test_resnet_data_parallel(clean_context, training):
    cell, _ = convert(resnet().train(training), torch.randn(4, 3, 32, 32))
    x = to_mindspore(torch.randn(4, 3, 32, 32))
    strategy = Layout((4,), ("data",))(tensor_map=())
    if training:  # the single-device reference run moves the statistics: compare from the same start
        start = {n: p.value().copy() for n, p in cell.parameters_and_names() if not p.requires_grad}
    ref = cell_outputs(cell(x))
    if training:
        after_single = {n: p.asnumpy().copy() for n, p in cell.parameters_and_names() if n in start}
        params = dict(cell.parameters_and_names())
        for n, v in start.items():
            params[n].set_data(v)
    clean_context.set_context(mode="simulation", device_num=4)
    got = cell_outputs(auto_parallelize(cell, strategy)(x))
    assert relative_error(got, ref) <= TOL
    if training:
        for n, p in cell.parameters_and_names():
            if n in after_single:
                np.testing.assert_allclose(p.asnumpy(), after_single[n], rtol=TOL, atol=1e-7, err_msg=n)
