"""fully_shard of weights whose rows the shard count does not divide: a (5, 4) and a (7, 3) weight
(with their biases) over 2 and 4 simulated devices. Each device's piece is its torch.chunk rows,
unpadded, as upstream's fully_shard (ceil-chunk geometry) and torch's FSDP2 show them (5 rows over
2: 3, 2; over 4: 2, 2, 1, 0; 7 rows over 2: 4, 3; over 4: 2, 2, 2, 1); the padding lives only inside
the gathers and reduce-scatters. Gradients, 3 Adam steps and the optimizer's states equal one
device's; the state dict's checkpoint holds exactly those pieces and loads back. In simulation the
global Parameter (so its gradient and the optimizer's states) stands for every device's piece; under
msrun each process holds its own piece (rank_checks.py, in test_msrun.py's 4-process job)."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn

from mindspore_hyper.hyper_parallel import init_device_mesh, laid_out_parameters
from mindspore_hyper.hyper_parallel.autograd_compat import (
    disable_mindspore_backward_compat, enable_mindspore_backward_compat,
)
from mindspore_hyper.hyper_parallel.checkpoint import load, save
from mindspore_hyper.hyper_parallel.fully_shard import fully_shard
from mindspore_hyper.hyper_parallel.session import reset_session
from two_weights import TwoWeights

# torch.chunk rows of a 5-row and a 7-row tensor over 2 and 4 devices
PIECES = {2: {5: [3, 2], 7: [4, 3]}, 4: {5: [2, 2, 1, 0], 7: [2, 2, 2, 1]}}
RNG = np.random.RandomState(0)
X, Z, Y = (Tensor(RNG.randn(6, n).astype(np.float32)) for n in (4, 3, 12))




def _twins():
    ms.set_seed(0)
    model, reference = TwoWeights(), TwoWeights()
    for p, q in zip(model.trainable_params(), reference.trainable_params()):
        q.set_data(Tensor(p.asnumpy()))
    return model, reference


def _loss_and_grads(model, params):
    return ms.value_and_grad(lambda x, z, y: ((model(x, z) - y) ** 2).mean(), None, params)(X, Z, Y)


def _adam_steps(model, steps=3):
    optimizer = nn.Adam(model.trainable_params(), learning_rate=1e-2)
    losses = []
    for _ in range(steps):
        loss, grads = _loss_and_grads(model, optimizer.parameters)
        optimizer(grads)
        losses.append(float(loss.full_tensor() if hasattr(loss, "full_tensor") else loss))
    return optimizer, losses


def _sharded(devices):
    model, reference = _twins()
    fully_shard(model, mesh=init_device_mesh("npu", (devices,), mesh_dim_names=("dp",)))
    return model, reference


def _state(model, optimizer):
    return {"model": model.parameters_dict(), "optim": optimizer.parameters_dict()}


def _values(model, optimizer):
    return {f"{section}.{name}": p.asnumpy().copy() for section, params in _state(model, optimizer).items()
            for name, p in params.items()}


@pytest.mark.parametrize("devices", [2, 4])
def test_pieces_are_unpadded_and_train_like_one_device(fresh_session, devices):
    fresh_session.set_context(device_num=devices)
    model, reference = _sharded(devices)
    whole = dict(reference.parameters_and_names())
    for name, value in laid_out_parameters(model).items():
        rows = PIECES[devices][value.shape[0]]
        local = value.to_local()
        assert [local.local_shard(r).shape for r in range(devices)] == [(n,) + value.shape[1:] for n in rows], name
        np.testing.assert_array_equal(value.full_tensor().asnumpy(), whole[name].asnumpy(), err_msg=name)
    # the gradient: float32 sums over the 6 batch rows (and <= 4 features) reordered by the split:
    # ~6 eps (7e-7) relative; rtol 1e-5 leaves room for that, far below a missing or doubled sum
    loss, grads = _loss_and_grads(model, model.trainable_params())
    ref_loss, ref_grads = _loss_and_grads(reference, reference.trainable_params())
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
    enable_mindspore_backward_compat()  # torch-style loss.backward(): .grad is the same (one autograd graph)
    try:
        ((model(X, Z) - Y) ** 2).mean().backward()
        backward_grads = [p.grad.asnumpy() for p in model.trainable_params()]
        model.zero_grad()
    finally:
        disable_mindspore_backward_compat()
    for p, g, b, r in zip(model.trainable_params(), grads, backward_grads, ref_grads):
        assert g.shape == b.shape == p.shape == r.shape  # simulation: the global Parameter stands for every piece
        np.testing.assert_array_equal(b, g.asnumpy(), err_msg=p.name)
        np.testing.assert_allclose(g.asnumpy(), r.asnumpy(), rtol=1e-5, atol=1e-7, err_msg=p.name)
    # 3 Adam steps: each moves a weight by ~lr = 1e-2; float32 rounding of the reordered sums (~1e-7
    # relative) stays far below 1e-5, a wrong gradient moves weights by O(lr)
    optimizer, losses = _adam_steps(model)
    ref_optimizer, ref_losses = _adam_steps(reference)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for (name, p), (_, q) in zip(model.parameters_and_names(), reference.parameters_and_names()):
        np.testing.assert_allclose(laid_out_parameters(model)[name].full_tensor().asnumpy(), q.asnumpy(), atol=1e-5,
                                   err_msg=name)
    states, ref_states = optimizer.parameters_dict(), ref_optimizer.parameters_dict()
    for name, state in states.items():  # the moments: sums of (squared) gradients, the same rounding
        assert state.shape == ref_states[name].shape, name
        np.testing.assert_allclose(state.asnumpy(), ref_states[name].asnumpy(), rtol=1e-4, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("devices", [2, 4])
def test_state_dict_checkpoint_holds_the_pieces_and_loads_back(fresh_session, tmp_path, devices):
    fresh_session.set_context(device_num=devices)
    model, _ = _sharded(devices)
    optimizer, _ = _adam_steps(model, steps=1)  # moments not zero
    values, output = _values(model, optimizer), model(X, Z).asnumpy()
    manifest = save(_state(model, optimizer), checkpoint_id=tmp_path / "ckpt")
    for name in ("model.five.weight", "model.seven.weight", "model.five.bias", "optim.moment1.five.weight",
                 "optim.moment2.seven.bias"):
        entry = manifest.parameters[name]
        rows = PIECES[devices][entry.global_shape[0]]
        starts = np.cumsum([0] + rows)
        expected = [(int(starts[r]), int(starts[r + 1]), r) for r in range(devices) if rows[r]]  # no empty piece
        assert [(s.box.start[0], s.box.stop[0], s.writer) for s in entry.shards] == expected, name
    # back into a fresh fully_shard model and Adam on as many devices, and into one device:
    # copied bytes, so exact
    for shard in (True, False):
        reset_session()
        fresh_session.set_context(device_num=devices)
        fresh = TwoWeights()
        if shard:
            fully_shard(fresh, mesh=init_device_mesh("npu", (devices,), mesh_dim_names=("dp",)))
        fresh_optimizer = nn.Adam(fresh.trainable_params(), learning_rate=1e-2)
        load(_state(fresh, fresh_optimizer), checkpoint_id=tmp_path / "ckpt")
        got = _values(fresh, fresh_optimizer)
        assert got.keys() == values.keys()
        for name, value in values.items():
            np.testing.assert_array_equal(got[name], value, err_msg=f"{name} (sharded: {shard})")
        np.testing.assert_array_equal(fresh(X, Z).asnumpy(), output)
