"""Fault injection: a process saving a checkpoint is SIGKILLed at every named point of the save
(before, inside, between and after each rank file, during the commit, during retention) and at
random moments, in blocking and asynchronous saves. Afterwards the directory always loads, with
exactly the values of one complete save (the previous step or the new one), never a mix; the
leftovers are ignored, and the next save removes them (checked after three kinds of leftover).

Each kill costs one fork of this process (the MindSpore import and the model are paid once): the
parent plans the save (`plan_save`, the MindSpore part: snapshot of the host arrays), the child
only runs the SaveJob (numpy and file I/O) until it is killed."""
import dataclasses
import os
import random
import shutil
import signal
import time

import numpy as np
import pytest

import mindspore_hyper as mh
from mindspore_hyper.checkpoint import committed_steps
from mindspore_hyper.checkpoint.directory import leftovers
from mindspore_hyper.checkpoint.faults import set_fault_hook
from mindspore_hyper.checkpoint.save import plan_save
from mindspore_hyper.checkpoint.save_handle import SaveHandle
from ckpt_models import adam, dense_batches, dense_stack, global_values, simulated_dense

RANDOM_KILLS = 12
# kills whose leftovers differ in kind (a torn rank file, a complete temporary step with its
# record, a step half-way through retention), each followed by a save that must remove them
FOLLOW_UP = ("file_partial:rank_3/checkpoint_rank3.safetensors", "before_rename", "retention_renamed:0")


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    """A pristine directory holding step 0 (state A of MindSpore layers on 8 simulated devices,
    data 2 x tensor 4, ZeRO-1 Adam) and the planned saves of the next two training steps (B:
    step 1, C: step 2, both keep_last=1), with the global values of A, B and C."""
    root = tmp_path_factory.mktemp("faults")
    model, par, optimizer = simulated_dense(8, 2, 4, seed=5)
    pristine = root / "pristine"
    mh.save_checkpoint(par, pristine, optimizer=optimizer)
    values, jobs = [global_values(model, optimizer)], []
    for step, batch in zip((1, 2), dense_batches(0, 2)):
        par.train_step(optimizer, *batch)
        jobs.append(plan_save(par, pristine, optimizer, step=step, keep_last=1))  # snapshot copies
        values.append(global_values(model, optimizer))
    mh.reset_context()
    yield pristine, jobs, values


def run_child(job, hook=None, asynchronous=False):
    """Fork a child that runs `job` (under `hook`); returns its pid."""
    pid = os.fork()
    if pid == 0:  # the child: no MindSpore call, no pytest teardown, exit at once
        code = 0
        try:
            set_fault_hook(hook)
            handle = SaveHandle(job)
            if asynchronous:
                handle.start().wait()
            else:
                handle.run()
                handle.wait()
        except BaseException:
            code = 3
        os._exit(code)
    return pid


def kill_at(name):
    def hook(point):
        if point == name:
            os.kill(os.getpid(), signal.SIGKILL)
    return hook


def fresh(pristine, tmp_path, job):
    """A copy of the pristine directory at tmp_path/ckpt, and `job` retargeted there."""
    target = tmp_path / "ckpt"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(pristine, target)
    return target, dataclasses.replace(job, root=str(target))


def recorder(path):
    def hook(point):
        with open(path, "a") as f:
            f.write(point + "\n")
    return hook


class Loader:
    """Loads a directory into one single-device model and tells which saved state it holds."""

    def __init__(self, values):
        self.values = values
        self.model = dense_stack()
        self.optimizer = adam(self.model.trainable_params())
        self.loads = 0

    def state(self, root):
        """The index into `values` of what a load of `root` gives; fails on anything else (a mix)."""
        mh.load_checkpoint(self.model, root, optimizer=self.optimizer)
        self.loads += 1
        got = global_values(self.model, self.optimizer)
        matches = [i for i, v in enumerate(self.values) if all(np.array_equal(got[k], v[k]) for k in v)]
        assert len(matches) == 1, f"the load of {root} gives no single saved state (a mix?): matches {matches}"
        return matches[0]


def check_next_save_cleans(root, job, loader):
    """A complete save (in this process) after the kill commits, removes every leftover, and loads."""
    SaveHandle(job).run()
    assert leftovers(str(root)) == [] and sorted(committed_steps(str(root))) == [job.step]
    assert loader.state(root) == 2


def test_kill_at_every_point_and_at_random_times_leaves_one_complete_save(states, tmp_path):
    pristine, (save_b, save_c), values = states
    loader = Loader(values)
    # the points a save passes, recorded by a complete run
    record = tmp_path / "points"
    root, job = fresh(pristine, tmp_path, save_b)
    pid = run_child(job, recorder(record))
    assert os.waitpid(pid, 0)[1] == 0
    points = record.read_text().split()
    files = [p.split(":", 1)[1] for p in points if p.startswith("file_synced:")]
    assert len(files) == 8 and len(points) == 1 + 8 * 4 + 7, points  # 4 points per rank file
    assert points[-7:] == ["all_written", "manifest_written", "before_rename", "after_rename", "committed",
                           "retention_renamed:0", "done"]

    outcome = {0: 0, 1: 0}
    for point in points:
        root, job = fresh(pristine, tmp_path, save_b)
        status = os.waitpid(run_child(job, kill_at(point)), 0)[1]
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (point, status)
        state = loader.state(root)
        # before the rename the previous step is what loads; from the rename on, the new one
        assert state == (1 if points.index(point) >= points.index("after_rename") else 0), (point, state)
        outcome[state] += 1
        if point in FOLLOW_UP:
            check_next_save_cleans(root, dataclasses.replace(save_c, root=str(root)), loader)

    # killed at random moments (uniform over the time a save takes), blocking and asynchronous saves
    root, job = fresh(pristine, tmp_path, save_b)
    start = time.perf_counter()
    SaveHandle(job).run()
    duration = time.perf_counter() - start
    rng = random.Random(0)
    random_outcome = {0: 0, 1: 0}
    for i in range(RANDOM_KILLS):
        root, job = fresh(pristine, tmp_path, save_b)
        pid = run_child(job, asynchronous=i % 2 == 1)
        time.sleep(rng.uniform(0, duration))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        random_outcome[loader.state(root)] += 1
    print(f"\nfault injection: {len(points) + RANDOM_KILLS} SIGKILLs ({len(points)} at every named point of a save "
          f"of 8 rank files, {RANDOM_KILLS} at random times within {duration * 1e3:.0f} ms, half of them "
          f"asynchronous saves); {loader.loads} loads verified bit for bit against the saved states: named points -> "
          f"previous step {outcome[0]}, new step {outcome[1]}; random -> previous {random_outcome[0]}, new "
          f"{random_outcome[1]}; {len(FOLLOW_UP)} follow-up saves removed every leftover")
    assert loader.loads == len(points) + len(FOLLOW_UP) + RANDOM_KILLS
