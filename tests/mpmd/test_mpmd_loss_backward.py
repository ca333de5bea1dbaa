"""A whole MPMD training step through torch-style `loss.backward()` (`enable_mindspore_backward_compat`)
and `MPMDModel.optimizer_step`, in simulation: its gradients and 2 Adam steps equal `train_step`'s
(`value_and_grad`) and one device's. (Under msrun: mpmd_worker.py's `backward_training`.)"""
import numpy as np
import pytest
from mindspore import nn

import mindspore_hyper as mh
from mindspore_hyper.hyper_parallel.autograd_compat import (disable_mindspore_backward_compat,
                                                            enable_mindspore_backward_compat)
from mindspore_hyper.strategy.config import load_parallel_config
from mpmd_models import (Multimodal, assert_same_training, make_pair, multimodal_batch, train_by_backward,
                         train_parallel, train_reference)

pytestmark = pytest.mark.usefixtures("pynative")

# the groups of mpmd_worker.py's msrun job, here simulated in one process (static: the same meshes every step)
CONFIG = {"parallel_config": {"device_num": 4},
          "process_groups": {"text_encoder": {"ranks": [0, 1], "batch_size": 32},
                             "vision_encoder": {"ranks": 2}, "fusion_layer": {"ranks": 3}},
          "scheduler": "static"}


@pytest.fixture
def mpmd(clean_context):
    clean_context.set_context(hyper_mpmd=True, device_num=4)
    return clean_context


@pytest.fixture
def compat():
    enable_mindspore_backward_compat()
    yield
    disable_mindspore_backward_compat()


def test_loss_backward_steps_equal_train_step_and_one_device(mpmd):
    net, ref = make_pair(Multimodal)
    by_grad, _ = make_pair(Multimodal)  # the same initial values (same seed)
    batches = [multimodal_batch(seed=s) for s in range(2)]
    by_backward = train_by_backward(mh.auto_parallelize(net, load_parallel_config(CONFIG), mode="simulation"), batches)
    by_value_and_grad = train_parallel(mh.auto_parallelize(by_grad, load_parallel_config(CONFIG), mode="simulation"),
                                       batches)
    # the same recorded ops on the same meshes, differentiated over the same autograd graph
    # (`run_backward` walks the graph `value_and_grad` builds): the same float32 kernels on the same
    # values in the same order, so the two paths agree bit for bit
    assert by_backward[0] == by_value_and_grad[0]
    for got, want in zip(by_backward[1:], by_value_and_grad[1:]):
        assert got.keys() == want.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    # against one device: float32 rounding in another reduction order (mpmd_models.assert_same_training)
    assert_same_training(by_backward, train_reference(ref, batches))


def test_optimizer_step_clips_records_the_step_and_clears_the_gradients(mpmd):
    """max_grad_norm acts as train_step's: a momentum step clipped to 1e-3 (far below the norm)
    equals train_step's bit for bit (as above), and both differ from the unclipped step."""
    net, twin = make_pair(Multimodal)
    unclipped, _ = make_pair(Multimodal)
    batch = multimodal_batch()
    models = [mh.auto_parallelize(n, load_parallel_config(CONFIG), mode="simulation") for n in (net, twin, unclipped)]
    opts = [nn.Momentum(m.optimizer_parameters(), 0.1, 0.9) for m in models]
    enable_mindspore_backward_compat()
    try:
        models[0](*batch).backward()
        models[0].optimizer_step(opts[0], max_grad_norm=1e-3)
    finally:
        disable_mindspore_backward_compat()
    models[1].train_step(opts[1], *batch, max_grad_norm=1e-3)
    models[2].train_step(opts[2], *batch)
    assert models[0].steps == 1 and not models[0].last_step_skipped
    assert models[0].last_grad_norm == models[1].last_grad_norm > 1e-3
    for p, q, r in zip(net.trainable_params(), twin.trainable_params(), unclipped.trainable_params()):
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy(), err_msg=p.name)
    assert any(not np.array_equal(p.asnumpy(), r.asnumpy())
               for p, r in zip(net.trainable_params(), unclipped.trainable_params()))
    assert all(p._grad is None for p in net.trainable_params())  # pylint: disable=protected-access
    labels = [(s.lane, s.label) for s in models[0].report(opts[0]).mpmd.timeline.spans]
    for group in ("text_encoder", "vision_encoder", "fusion_layer"):
        assert (group, f"{group} forward") in labels and (group, f"{group} backward") in labels


def test_optimizer_step_without_a_backward_or_with_bad_arguments_is_refused(mpmd, compat):
    model = mh.auto_parallelize(Multimodal(), load_parallel_config(CONFIG), mode="simulation")
    opt = nn.Adam(model.optimizer_parameters(), learning_rate=1e-2)
    with pytest.raises(RuntimeError, match=r"optimizer_step: no Parameter of the model has a gradient; run "
                                           r"loss\.backward\(\)"):
        model.optimizer_step(opt)
    model(*multimodal_batch()).backward()
    with pytest.raises(ValueError, match="max_grad_norm"):
        model.optimizer_step(opt, max_grad_norm=-1.0)
    with pytest.raises(ValueError, match="optimizer_step: the optimizer updates 2 Parameter.s. that are not this "
                                         "model's"):
        model.optimizer_step(nn.Adam(nn.Dense(2, 2).trainable_params(), learning_rate=1e-2))
    assert model.steps == 0  # nothing was updated
