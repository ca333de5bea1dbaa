"""Dropout in pipeline stages: a stage's backward recomputes its forward, and the recomputation
must apply the masks the forward drew. The pipeline's gradients are checked against plain
MindSpore gradients of the same model on each microbatch with the very masks the pipeline's
forwards drew (logged by a recorder put in front of each Dropout primitive)."""
import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

import mindspore_hyper as mh
from mindspore_hyper import Layout
from mindspore_hyper.pipeline.dropout_replay import DropoutReplay
from pipeline_models import batch


pytestmark = pytest.mark.usefixtures("pynative")


def dropout_chain(seed=3):
    """Dense / Dropout / ReLU layers (a Dropout in each of the two stages) under MSELoss."""
    ms.set_seed(seed)
    layers = [nn.Dense(8, 16), nn.Dropout(p=0.5), nn.ReLU(), nn.Dense(16, 16), nn.Dropout(p=0.3), nn.Tanh(),
              nn.Dense(16, 4)]
    model = nn.WithLossCell(nn.SequentialCell(layers), nn.MSELoss())
    model.set_train(True)
    return model


class MaskLog:
    """Calls the Dropout primitive and logs every mask it draws (the masks of real forwards)."""

    def __init__(self, primitive):
        self.primitive, self.keep_prob, self.masks = primitive, primitive.keep_prob, []

    def __call__(self, x):
        out, mask = self.primitive(x)
        self.masks.append(mask.asnumpy())
        return out, mask


class FixedMasks:
    """Applies given masks in turn (the reference's dropout)."""

    def __init__(self, masks, keep_prob):
        self.masks, self.keep_prob = list(masks), keep_prob

    def __call__(self, x):
        mask = Tensor(self.masks.pop(0))
        return x * mask / self.keep_prob, mask


def dropouts(model):
    return [c for _, c in model.cells_and_names() if isinstance(c, nn.Dropout)]


@pytest.mark.parametrize("kind", ["1f1b", "zb_h1", "interleaved_1f1b"])
def test_recomputed_stage_forwards_replay_the_forwards_dropout_masks(kind):
    m = 4
    model = dropout_chain()
    logs = []
    for cell in dropouts(model):
        logs.append(MaskLog(cell.dropout))
        object.__setattr__(cell, "dropout", logs[-1])
    mh.set_context(mode="simulation", device_num=2)
    chunks = 2 if kind == "interleaved_1f1b" else 1
    split = (2, 2, 2, 1) if chunks == 2 else (3, 4)
    parallel = mh.auto_parallelize(model, Layout((2,), ("pipeline",))(tensor_map=()), pipeline=dict(
        schedule=kind, microbatches=m, layers_per_stage=split))
    x, y = batch()
    loss = float(parallel.train_step(nn.SGD(parallel.optimizer_parameters(), 0.0), x, y).asnumpy())
    for log in logs:  # one draw per microbatch forward: the recomputations drew nothing
        assert len(log.masks) == m
        assert any((a != b).any() for a, b in zip(log.masks, log.masks[1:]))  # fresh masks per microbatch

    reference = dropout_chain()
    for cell, log in zip(dropouts(reference), logs):
        object.__setattr__(cell, "dropout", FixedMasks(log.masks, log.keep_prob))
    params = reference.trainable_params()
    grad = ms.value_and_grad(reference, None, params)
    losses, grads = [], [np.zeros(p.shape, np.float32) for p in params]
    for xs, ys in zip(np.split(x.asnumpy(), m), np.split(y.asnumpy(), m)):
        value, gs = grad(Tensor(xs), Tensor(ys))
        losses.append(float(value.asnumpy()))
        grads = [a + g.asnumpy() / m for a, g in zip(grads, gs)]
    np.testing.assert_allclose(loss, np.mean(losses), rtol=1e-6)
    names = [n for n, p in model.parameters_and_names() if p.requires_grad]  # the same layers in the same order
    assert len(names) == len(grads)
    for name, want in zip(names, grads):
        np.testing.assert_allclose(parallel.last_gradients[name], want, rtol=1e-5, atol=1e-7, err_msg=name)


def test_a_recomputation_that_calls_dropout_differently_is_refused():
    model = dropout_chain()
    replay = DropoutReplay(model)
    assert replay.count == 2
    x = Tensor(np.ones((2, 8), np.float32))
    with replay.recording(0):
        model(x, Tensor(np.zeros((2, 4), np.float32)))
    with pytest.raises(RuntimeError, match="more often than its forward"):
        with replay.replaying(1):  # microbatch 1 never ran a forward
            model(x, Tensor(np.zeros((2, 4), np.float32)))
    with pytest.raises(RuntimeError, match="input has shape"):
        with replay.replaying(0):
            model(Tensor(np.ones((3, 8), np.float32)), Tensor(np.zeros((3, 4), np.float32)))


def test_outside_a_pipeline_step_the_dropout_draws_as_usual():
    model = dropout_chain()
    DropoutReplay(model)
    x, y = Tensor(np.ones((4, 8), np.float32)), Tensor(np.zeros((4, 4), np.float32))
    assert float(model(x, y).asnumpy()) != float(model(x, y).asnumpy())  # fresh masks each call
