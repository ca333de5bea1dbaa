"""Distributed mode launched as a plain `python script.py`: a job of one process (world size 1)."""
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn

import mindspore_hyper as mh
from mindspore_hyper import Layout, auto_parallelize
from mindspore_hyper.runtime.distributed import DistributedModel, world

from sim_models import MLP

X = Tensor(np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32))


def test_world_of_one_process_trains_like_the_plain_model(clean_context):
    clean_context.set_context(mode="distributed")
    assert (world().rank, world().size) == (0, 1)
    ms.set_seed(0)
    reference, model = MLP(), MLP()
    for p, q in zip(reference.get_parameters(), model.get_parameters()):
        q.set_data(p.data.copy())
    parallel = auto_parallelize(model, Layout((1,), ("data",))(tensor_map=(), optimizer_state="data"))
    assert isinstance(parallel, DistributedModel) and parallel.local_ranks == (0,)
    optimizer = nn.Adam(parallel.optimizer_parameters(), learning_rate=1e-2)
    ref_optimizer = nn.Adam(reference.trainable_params(), learning_rate=1e-2)
    ref_step = ms.value_and_grad(lambda x: (reference(x) ** 2).mean(), None, ref_optimizer.parameters)

    class Loss(nn.Cell):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def construct(self, x):
            return (self.net(x) ** 2).mean()

    loss_model = auto_parallelize(Loss(MLP()), Layout((1,), ("data",))(tensor_map=()))
    for p, q in zip(reference.get_parameters(), loss_model.network.net.get_parameters()):
        q.set_data(p.data.copy())
    loss_optimizer = nn.Adam(loss_model.optimizer_parameters(), learning_rate=1e-2)
    for _ in range(3):
        loss = loss_model.train_step(loss_optimizer, X)
        ref_loss, grads = ref_step(X)
        ref_optimizer(grads)
        np.testing.assert_allclose(loss.asnumpy(), ref_loss.asnumpy(), rtol=1e-6)
    for p, q in zip(reference.get_parameters(), loss_model.network.net.get_parameters()):
        np.testing.assert_allclose(q.asnumpy(), p.asnumpy(), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(parallel(X).asnumpy(), model(X).asnumpy(), rtol=1e-6)
    report = loss_model.report(loss_optimizer)
    assert list(report.memory) == [0] and not report.simulated
    assert "device 0 of this process" in str(report)
