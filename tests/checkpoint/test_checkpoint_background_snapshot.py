"""Asynchronous saves with `snapshot="background"`: the call returns before the copy; the copy runs
in the save's thread while the next forward/backward read the Parameters; the optimizer's next
call (its forward pre-hook, the fence), `wait_snapshot()` and a load wait for it. The step holds
the state at the call, bitwise; a Parameter changed outside the fence before its copy fails the
save (naming it) instead of mixing two states.

The ordering checks are deterministic: the save's thread is held at "snapshot_start" until the
training thread reaches the fence ("fence_wait"), and the test records when the optimizer runs.
"""
import threading

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn

import mindspore_hyper as mh
from mindspore_hyper import auto_parallelize
from mindspore_hyper.checkpoint import CheckpointError, committed_steps
from mindspore_hyper.checkpoint.directory import leftovers
from mindspore_hyper.checkpoint.faults import set_fault_hook
from ckpt_models import LR, adam, dense_batches, dense_stack, dense_strategy, global_values

HOLD_S = 120  # a broken fence would otherwise hold the save's thread forever (the test then fails on the order)


@pytest.fixture
def seen():
    """Points reached, in order; the save's thread waits at "snapshot_start" until a fence waits."""
    points, fenced = [], threading.Event()

    def at(name):
        points.append(name)
        if name == "fence_wait":
            fenced.set()
        elif name == "snapshot_start":
            fenced.wait(HOLD_S)
    set_fault_hook(at)
    yield points
    set_fault_hook(None)


def record_calls(optimizer, points):
    """Record "optimizer_runs" when `optimizer` runs (a pre-hook registered after the fence's)."""
    return optimizer.register_forward_pre_hook(lambda cell, inputs: points.append("optimizer_runs"))


def loaded(root, optimizer_class=None):
    single = dense_stack()
    opt = (optimizer_class or adam)(single.trainable_params())
    mh.load_checkpoint(single, root, optimizer=opt)
    return global_values(single, opt)


def assert_same(got, want):
    assert got.keys() == want.keys()
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_simulated_training_goes_on_and_the_optimizer_waits_for_the_copy(tmp_path, seen, clean_context):
    mh.set_context(device_num=4)
    ms.set_seed(2)
    model = dense_stack()
    par = auto_parallelize(model, dense_strategy(2, 2))
    optimizer = adam(par.optimizer_parameters())
    at_call = global_values(model, optimizer)
    handle = mh.save_checkpoint(par, tmp_path, optimizer=optimizer, blocking=False, snapshot="background")
    hook = record_calls(optimizer, seen)
    for batch in dense_batches(0, 2):  # forward/backward read while the copy is held; the update waits
        par.train_step(optimizer, *batch)
    assert handle.wait().step == 0
    hook.remove()
    assert seen.index("fence_wait") < seen.index("snapshot_done") < seen.index("optimizer_runs")
    assert seen.count("fence_wait") == 1  # the second step's update found the copy done
    assert_same(loaded(tmp_path), at_call)
    assert not np.array_equal(global_values(model)["_backbone.0.weight"], at_call["_backbone.0.weight"])


@pytest.mark.parametrize("optimizer_class", [nn.Adam, nn.AdamWeightDecay])
def test_a_plain_cell_optimizer_called_with_grads_waits(tmp_path, seen, optimizer_class):
    ms.set_seed(3)
    model = dense_stack()
    optimizer = optimizer_class(model.trainable_params(), learning_rate=LR)
    grad = ms.value_and_grad(model, None, optimizer.parameters)
    at_call = global_values(model, optimizer)
    handle = mh.save_checkpoint(model, tmp_path, optimizer=optimizer, blocking=False, snapshot="background")
    hook = record_calls(optimizer, seen)
    _, grads = grad(*dense_batches(0, 1)[0])
    optimizer(grads)
    handle.wait()
    hook.remove()
    assert seen.index("fence_wait") < seen.index("snapshot_done") < seen.index("optimizer_runs")
    assert_same(loaded(tmp_path, lambda p: optimizer_class(p, learning_rate=LR)), at_call)
    assert not np.array_equal(global_values(model)["_backbone.0.weight"], at_call["_backbone.0.weight"])
    assert not optimizer._forward_pre_hook  # the fence was removed by wait()


def test_wait_snapshot_then_set_data(tmp_path, seen):
    model = dense_stack()
    optimizer = adam(model.trainable_params())
    at_call = global_values(model, optimizer)
    handle = mh.save_checkpoint(model, tmp_path, optimizer=optimizer, blocking=False, snapshot="background")
    handle.wait_snapshot()
    assert "snapshot_done" in seen
    weight = model.trainable_params()[0]
    weight.set_data(Tensor(np.full(weight.shape, 7, np.float32)))
    handle.wait()
    assert_same(loaded(tmp_path), at_call)


def test_a_load_waits_for_a_snapshot_of_another_directory(tmp_path, seen):
    model = dense_stack()
    optimizer = adam(model.trainable_params())
    mh.save_checkpoint(model, tmp_path / "other", optimizer=optimizer)
    at_call = global_values(model, optimizer)
    for p in model.trainable_params():  # the state the load brings back differs from the one saved below
        p.set_data(Tensor(np.zeros(p.shape, np.float32)))
    changed = global_values(model, optimizer)
    handle = mh.save_checkpoint(model, tmp_path / "ckpt", optimizer=optimizer, blocking=False,
                                snapshot="background")
    mh.load_checkpoint(model, tmp_path / "other", optimizer=optimizer)
    assert seen.index("fence_wait") < seen.index("snapshot_done")
    handle.wait()
    assert_same(loaded(tmp_path / "ckpt"), changed)
    assert_same(global_values(model, optimizer), at_call)


def test_a_parameter_changed_outside_the_fence_fails_the_save(tmp_path):
    model = dense_stack()
    optimizer = adam(model.trainable_params())
    grad = ms.value_and_grad(model, None, optimizer.parameters)
    go = threading.Event()
    set_fault_hook(lambda name: go.wait(HOLD_S) if name == "snapshot_start" else None)
    try:
        handle = mh.save_checkpoint(model, tmp_path, optimizer=optimizer, blocking=False, snapshot="background")
        model.trainable_params()[2].asnumpy()[0] += 1  # in place, as a forward's statistics update would
        go.set()
        with pytest.raises(CheckpointError, match=r"the tensor '_backbone\.2\.gamma' \(of rank_0/\S+\) changed "
                                                  r"between the call and its copy .*snapshot='call'"):
            handle.wait()
    finally:
        set_fault_hook(None)
    assert committed_steps(str(tmp_path)) == {}
    _, grads = grad(*dense_batches(0, 1)[0])
    optimizer(grads)  # the fence is open after the failure
    assert mh.save_checkpoint(model, tmp_path, optimizer=optimizer).step == 0
    assert leftovers(str(tmp_path)) == []


def test_a_failure_before_the_copy_opens_the_fence(tmp_path):
    model = dense_stack()
    optimizer = adam(model.trainable_params())

    def fail(name):
        if name == "start":
            raise OSError(5, "Input/output error")
    set_fault_hook(fail)
    try:
        handle = mh.save_checkpoint(model, tmp_path, optimizer=optimizer, blocking=False, snapshot="background")
        with pytest.raises(CheckpointError, match="save_checkpoint of step 0 failed: .*Input/output"):
            handle.wait()
    finally:
        set_fault_hook(None)
    assert handle._job.snapshot.done()  # else the optimizer's next call would wait forever
    handle.wait_snapshot()
    assert not optimizer._forward_pre_hook


@pytest.mark.parametrize("kwargs, message", [
    (dict(snapshot="later", blocking=False), r"snapshot: expected one of \['call', 'background'\], got 'later'"),
    (dict(snapshot="background"), r"snapshot='background' needs blocking=False"),
    (dict(snapshot="background", blocking=False, optimizer=None), r"snapshot='background' needs optimizer="),
])
def test_bad_snapshot_arguments(tmp_path, kwargs, message):
    model = dense_stack()
    kwargs.setdefault("optimizer", adam(model.trainable_params()))
    with pytest.raises(CheckpointError, match=message):
        mh.save_checkpoint(model, tmp_path, **kwargs)
    assert not (tmp_path / "step_000000").exists()


@pytest.mark.parametrize("snapshot", ["call", "background"])
@pytest.mark.parametrize("direct", ["on", "off", "refused"])
def test_file_images_written_direct_or_buffered_load_here_and_in_mindspore(tmp_path, snapshot, direct, monkeypatch):
    """O_DIRECT, buffered, and O_DIRECT refused by the file system at its probe (buffered then)."""
    import errno
    import os

    from mindspore_hyper.checkpoint import safetensors_writer

    monkeypatch.setattr(safetensors_writer, "USE_DIRECT_IO", direct != "off")
    probes = []
    if direct == "refused":
        def refuse(fd, data, offset):
            probes.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        monkeypatch.setattr(os, "pwrite", refuse)
    model = dense_stack()
    optimizer = adam(model.trainable_params())
    at_call = global_values(model, optimizer)
    mh.save_checkpoint(model, tmp_path, optimizer=optimizer, blocking=False, snapshot=snapshot).wait()
    assert_same(loaded(tmp_path), at_call)
    path = tmp_path / "step_000000" / "rank_0" / "checkpoint_rank0.safetensors"
    theirs = ms.load_checkpoint(str(path), format="safetensors")
    for name, p in model.parameters_and_names():
        np.testing.assert_array_equal(theirs[name].asnumpy(), at_call[name], err_msg=name)
    assert probes == ([0] if direct == "refused" else [])
