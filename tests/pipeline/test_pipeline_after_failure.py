"""A forward that failed inside a gradient function leaves no trace: a pipeline trained
afterwards in the same process still trains like one device (mindspore_hyper.autodiff)."""
import numpy as np
import pytest
from mindspore import Tensor, nn

import mindspore_hyper as mh
from mindspore_hyper import Layout
from mindspore_hyper.autodiff import value_and_grad
from pipeline_models import assert_same_training, batch, dense_chain, single_device_run


class FailingForward(nn.Cell):
    """Fails half-way through its forward, as a refusal or a user's shape error would."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 4)

    def construct(self, x):
        self.dense(x)
        raise ValueError("refused half-way through the forward")


def test_pipeline_trains_like_one_device_after_a_failed_gradient():
    x, y = batch()
    reference = single_device_run(dense_chain(), x, y)
    failing = FailingForward()
    with pytest.raises(ValueError, match="half-way"):
        value_and_grad(lambda a: failing(a).sum(), None, failing.trainable_params())(Tensor(np.ones((2, 4), np.float32)))
    model = dense_chain()
    mh.set_context(mode="simulation", device_num=2)
    parallel = mh.auto_parallelize(model, Layout((2,), ("pipeline",))(tensor_map=()), pipeline=dict(schedule="1f1b", microbatches=4))
    optimizer = nn.Adam(parallel.optimizer_parameters(), 1e-2)
    losses = [float(parallel.train_step(optimizer, x, y).asnumpy()) for _ in range(5)]
    assert_same_training(model, losses, reference)
