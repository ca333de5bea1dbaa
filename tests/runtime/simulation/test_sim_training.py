"""Simulation mode training: 5 optimizer steps equal single-device training."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn

import mindspore_hyper as mh
from mindspore_hyper.shard import Layout
from mindspore_hyper.runtime.simulation import simulate

from sim_models import TinyLM, copy_weights
from tolerances import assert_adam_training_close, reduction_length, training_rtol

RNG = np.random.default_rng(3)



def train(net, optimizer, batches):
    step = ms.value_and_grad(net, None, optimizer.parameters)
    losses = []
    for ids, labels in batches:
        loss, grads = step(ids, labels)
        optimizer(grads)
        losses.append(float(loss.asnumpy()))
    return losses


# Adam's default learning rate. Gradients agree to float32 summation order; Adam's normalisation
# turns that into parameter differences proportional to the learning rate (tests/tolerances.py).
OPTIMIZERS = {
    "Adam": lambda p: nn.Adam(p, learning_rate=1e-3),
    "AdamWeightDecay": lambda p: nn.AdamWeightDecay(p, learning_rate=1e-3, weight_decay=0.01),
    "SGD": lambda p: nn.SGD(p, learning_rate=0.1, momentum=0.9),
}


@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_five_steps_match_single_device(opt_name):
    mesh = Layout((2, 4), ("data", "tensor"))
    mh.set_context(device_num=8)
    ref_model, par_model = TinyLM(), TinyLM()
    copy_weights(ref_model, par_model)
    strategy = mesh(tensor_map=(), optimizer_state="data")
    for name in ("attn.q", "attn.k", "attn.v", "mlp.up"):
        strategy.override(f"*{name}.*", "tensor")
    for name in ("attn.proj", "mlp.down"):
        strategy.override(f"*{name}.weight", None, "tensor")
    strategy.override("embed.*", "tensor")
    sim = simulate(par_model, strategy)

    batch = (Tensor(RNG.integers(0, 64, (8, 8)).astype(np.int32)),
             Tensor(RNG.integers(0, 64, (8, 8)).astype(np.int32)))
    batches = [batch] * 5  # one batch, so the loss must fall if training works
    ref_losses = train(ref_model, OPTIMIZERS[opt_name](ref_model.trainable_params()), batches)
    par_opt = OPTIMIZERS[opt_name](par_model.trainable_params())
    par_losses = train(sim, par_opt, batches)

    # bounds from the computation (tests/tolerances.py): normwise for the longest float32 reduction
    # over 5 steps; Adam's elements also within its displacement bound (noise-level gradients)
    reduction = reduction_length(ref_model.trainable_params(), 64)
    rtol = training_rtol(reduction, len(batches))
    np.testing.assert_allclose(par_losses, ref_losses, rtol=rtol)
    assert ref_losses[-1] < ref_losses[0]  # training actually moved the weights
    for (name, p), (_, q) in zip(ref_model.parameters_and_names(), par_model.parameters_and_names()):
        a, b = p.asnumpy().astype(np.float64), q.asnumpy().astype(np.float64)
        if opt_name.startswith("Adam"):
            assert_adam_training_close(b, a, 1e-3, len(batches), reduction, err_msg=name)
        else:
            rel = np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-12)  # relative error in the 2-norm
            assert rel <= rtol, f"{name}: relative error {rel:.2e} > {rtol:.2e} after 5 steps"

    # the optimizer states are sharded along 'data' in the memory report (ZeRO-1)
    report = sim.report(par_opt)
    state_count = {"Adam": 2, "AdamWeightDecay": 2, "SGD": 2}[opt_name]  # m, v / accum, stat
    expected = 0
    for row in sim.table:
        local = row.optimizer_layout.local_shape(row.global_shape)
        expected += state_count * int(np.prod(local)) * 4
    assert report.memory[0]["optimizer_states"] == expected
    assert expected < state_count * sum(row.param_bytes for row in sim.table)


def test_global_parameters_are_kept_for_checkpoints(tmp_path):
    mesh = Layout((2, 4), ("data", "tensor"))
    mh.set_context(device_num=8)
    model = TinyLM()
    params_before = {n: id(p) for n, p in model.parameters_and_names()}
    sim = simulate(model, mesh(tensor_map=("tensor",)))
    assert {n: id(p) for n, p in sim.parameters_and_names()} == params_before
    path = str(tmp_path / "lm.ckpt")
    ms.save_checkpoint(sim, path)
    fresh = TinyLM()
    ms.load_param_into_net(fresh, ms.load_checkpoint(path))
    for (n, p), (_, q) in zip(model.parameters_and_names(), fresh.parameters_and_names()):
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy(), err_msg=n)
