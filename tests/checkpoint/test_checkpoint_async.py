"""Asynchronous saves (`blocking=False`): the call returns after the snapshot while the writing
and the commit run in the background; training goes on meanwhile and the step holds the values
of the snapshot; a second save waits for the first; an error surfaces on the handle and at the
next save; the interpreter's exit waits for a save in flight (and says so)."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import mindspore as ms

import mindspore_hyper as mh
from mindspore_hyper import auto_parallelize
from mindspore_hyper.checkpoint import CheckpointError, committed_steps
from mindspore_hyper.checkpoint.directory import leftovers
from mindspore_hyper.checkpoint.faults import set_fault_hook
from ckpt_models import adam, dense_batches, dense_stack, dense_strategy, global_values
from paths import REPO_ROOT


@pytest.fixture
def hook():
    """Install a fault hook for the test; removed afterwards."""
    yield set_fault_hook
    set_fault_hook(None)


def held_until(event, point="start", seen=None):
    """A hook that blocks the save's thread at `point` until `event` is set (recording points)."""
    def at(name):
        if seen is not None:
            seen.append(name)
        if name == point:
            event.wait()
    return at


def test_training_goes_on_while_the_save_runs_and_the_step_holds_the_snapshot(tmp_path, hook, clean_context):
    mh.set_context(device_num=4)
    ms.set_seed(2)
    model = dense_stack()
    par = auto_parallelize(model, dense_strategy(2, 2))
    optimizer = adam(par.optimizer_parameters())
    snapshot = global_values(model, optimizer)
    release = threading.Event()
    hook(held_until(release))
    handle = mh.save_checkpoint(par, tmp_path, optimizer=optimizer, blocking=False)
    assert not handle.done() and handle.error is None and "running" in repr(handle)
    for batch in dense_batches(0, 2):  # while the save waits in its thread
        par.train_step(optimizer, *batch)
    assert committed_steps(str(tmp_path)) == {}
    release.set()
    manifest = handle.wait()
    assert manifest.step == 0 and handle.done() and "committed" in repr(handle)
    single = dense_stack()
    single_opt = adam(single.trainable_params())
    mh.load_checkpoint(single, tmp_path, optimizer=single_opt)
    loaded = global_values(single, single_opt)
    trained = global_values(model, optimizer)
    for name, value in snapshot.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    assert not np.array_equal(trained["_backbone.0.weight"], snapshot["_backbone.0.weight"])


def test_a_second_save_waits_for_the_first(tmp_path, hook):
    model = dense_stack()
    release, seen = threading.Event(), []
    hook(held_until(release, seen=seen))
    first = mh.save_checkpoint(model, tmp_path, blocking=False)
    states = []

    def release_later():
        states.append(first.done())  # still blocked when the second save begins waiting
        release.set()

    timer = threading.Timer(0.2, release_later)
    timer.start()
    second = mh.save_checkpoint(model, tmp_path, blocking=False)
    assert first.done() and states == [False]
    assert second.wait().step == 1
    timer.join()
    assert seen.count("start") == 2 and seen.index("done") < seen.index("start", seen.index("start") + 1)  # one after
    # the other (an asynchronous save's snapshot is taken in its call, before the second "start")


def test_an_error_surfaces_on_the_handle_and_at_the_next_save(tmp_path, hook):
    model = dense_stack()

    def fail(point):
        if point.startswith("file_written:"):
            raise OSError(28, "No space left on device")
    hook(fail)
    handle = mh.save_checkpoint(model, tmp_path, blocking=False)
    with pytest.raises(CheckpointError, match="rank 0 failed to write its shards of step 0: .*No space left"):
        handle.wait()
    assert isinstance(handle.error, CheckpointError) and isinstance(handle.error.__cause__, OSError)
    handle = mh.save_checkpoint(model, tmp_path, blocking=False)  # not waited for
    with pytest.raises(CheckpointError, match="the asynchronous save of step 0 into .* failed: .*No space left"):
        mh.save_checkpoint(model, tmp_path)
    hook(None)
    assert mh.save_checkpoint(model, tmp_path).step == 0  # nothing was committed; no leftover stays
    assert leftovers(str(tmp_path)) == [] and sorted(committed_steps(str(tmp_path))) == [0]


EXITING = """
import sys, time
sys.path.insert(0, {tests!r})
import mindspore_hyper as mh
from mindspore_hyper.checkpoint.faults import set_fault_hook
from ckpt_models import dense_stack
set_fault_hook(lambda point: time.sleep(0.5) if point == "start" else None)
handle = mh.save_checkpoint(dense_stack(), {root!r}, blocking=False)
print("returned before the commit:", not handle.done(), flush=True)
"""  # ... and the script ends with the save in flight


def test_the_exit_waits_for_a_save_in_flight(tmp_path):
    script = EXITING.format(tests=os.path.dirname(os.path.abspath(__file__)), root=str(tmp_path / "ckpt"))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "returned before the commit: True" in proc.stdout
    assert "waiting for the asynchronous checkpoint save of step 0" in proc.stderr
    assert sorted(committed_steps(str(tmp_path / "ckpt"))) == [0]
    mh.load_checkpoint(dense_stack(), tmp_path / "ckpt")
