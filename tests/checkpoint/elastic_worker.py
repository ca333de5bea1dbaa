"""msrun worker of the elastic-restart test, launched by `mindspore_hyper.launch.run_elastic`.

MindSpore layers (`dense_stack`) with data x tensor parallelism and ZeRO-1 (`dense_strategy`),
resized to the job's world size (`elastic_strategy`), resume from the newest committed step of
OUT/ckpt (the first attempt: a step saved by 8 simulated devices) and train to TOTAL steps on
the batches of their step numbers, saving asynchronously after every step (step = steps done,
keep_last=3). In attempt 0 rank KILL_RANK SIGKILLs itself in the middle of writing its rank file
of step KILL_STEP (in the save's background thread). Before that, attempt 0 tries OUT/broken, a
copy of the first step with a file only some ranks read corrupted (when there is one): every
rank must refuse it and change nothing. benchmarks/bench_checkpoint.py runs it too.

Writes under OUT: attempt<a>_rank<r>.json after every step (world size, step resumed from, the
refusal, the load report and the largest difference of the loaded regions from
OUT/start_values.npz, losses, times), a<a>_step<s>_rank<r>.npz/.json (what each rank held when it saved step s), resumed.npz
(attempt >= 1, rank 0: the resumed step loaded into one device), kill.json (the kill's time).

Usage: elastic_worker.py OUT TOTAL KILL_STEP KILL_RANK
"""
from mindspore_hyper.launch import exit_if_msrun_scheduler  # noqa: E402

exit_if_msrun_scheduler()  # before MindSpore's import (~3 s): msrun's scheduler has nothing to do with shm
import json
import os
import signal
import sys
import time

import numpy as np
import mindspore as ms

ms.set_context(mode=ms.PYNATIVE_MODE)
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper import auto_parallelize  # noqa: E402
from mindspore_hyper.checkpoint.faults import set_fault_hook  # noqa: E402
from mindspore_hyper.launch import elastic_strategy  # noqa: E402
from ckpt_models import adam, dense_batches, dense_stack, dense_strategy, global_values, held  # noqa: E402

BATCH = 8


def main():
    out, total, kill_step, kill_rank = sys.argv[1], *map(int, sys.argv[2:5])
    attempt = int(os.environ["MSHYPER_ELASTIC_ATTEMPT"])
    mh.set_context(mode="distributed", comm_timeout=60.0)
    ms.set_seed(7)
    strategy = elastic_strategy(dense_strategy(2, 2), batch_size=BATCH)
    par = auto_parallelize(dense_stack(), strategy)
    rank = par.local_ranks[0]
    optimizer = adam(par.optimizer_parameters())
    ckpt = os.path.join(out, "ckpt")
    record = {"world": strategy.mesh.size, "mesh": list(strategy.mesh.device_matrix), "losses": {},
              "step_done_at": {}}
    if attempt == 0 and os.path.isdir(os.path.join(out, "broken")):
        record["refused"] = _load_broken(par, optimizer, os.path.join(out, "broken"))
    report = mh.load_checkpoint(par, ckpt, optimizer=optimizer)
    start = record["resumed_from"] = report.step
    record["report"] = report.__dict__
    if attempt == 0 and os.path.isfile(os.path.join(out, "start_values.npz")):
        record["loaded_error"] = _largest_error(par, optimizer, np.load(os.path.join(out, "start_values.npz")))
    elif rank == 0:
        single = dense_stack()
        single_opt = adam(single.trainable_params())
        mh.load_checkpoint(single, ckpt, optimizer=single_opt, step=start)
        np.savez(os.path.join(out, "resumed.npz"), **global_values(single, single_opt))
    handle = None
    for step in range(start, total):
        loss = par.train_step(optimizer, *dense_batches(step, 1)[0])
        record["losses"][step] = float(loss.asnumpy())
        record["step_done_at"][step] = time.time()
        if attempt == 0 and rank == kill_rank and step + 1 == kill_step:
            if handle is not None:  # the hook names no step: the previous save must have committed first
                handle.wait()
            set_fault_hook(_kill_at(f"file_partial:rank_{rank}/checkpoint_rank{rank}.safetensors", out))
        handle = mh.save_checkpoint(par, ckpt, optimizer=optimizer, step=step + 1, keep_last=3, blocking=False,
                                    snapshot="background")  # the next train_step's update waits for the copy
        _dump(out, f"a{attempt}_step{step + 1}_rank{rank}", par, optimizer)  # = the snapshot (nothing changed)
        _publish(os.path.join(out, f"attempt{attempt}_rank{rank}.json"), record)  # attempt 0 is killed
    if handle is not None:
        handle.wait()


def _publish(path, record):
    with open(path + ".part", "w") as f:
        json.dump(record, f)
    os.replace(path + ".part", path)


def _load_broken(par, optimizer, directory):
    """Load a checkpoint only some ranks find corrupt: the error message and what changed."""
    before, _ = held(par, optimizer)
    try:
        mh.load_checkpoint(par, directory, optimizer=optimizer)
        message = None
    except mh.checkpoint.CheckpointError as exc:
        message = str(exc)
    after, _ = held(par, optimizer)
    return {"message": message, "changed": [n for n in before if not np.array_equal(before[n], after[n])]}


def _largest_error(par, optimizer, saved):
    """max |held - the saved global value in the held region| over everything this rank holds."""
    arrays, regions = held(par, optimizer)
    return max(float(np.abs(arrays[n] - saved[n][tuple(slice(a, b) for a, b in regions[n])]).max())
               for n in arrays if arrays[n].size)


def _dump(out, name, par, optimizer):
    arrays, regions = held(par, optimizer)
    np.savez(os.path.join(out, name + ".npz"), **arrays)
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(regions, f)


def _kill_at(point, out):
    def hook(name):
        if name == point:
            with open(os.path.join(out, "kill.json"), "w") as f:
                json.dump({"time": time.time()}, f)
            os.kill(os.getpid(), signal.SIGKILL)
    return hook


if __name__ == "__main__":
    main()
