"""msrun worker of the checkpoint tests: one process of a 4-process job (data 2 x tensor 2, ZeRO-1
over data) loads the 8-device simulated checkpoint OUT/sim8 (model and Adam states), checks that
its shards equal the saved global values, trains two more steps, saves OUT/dist4 and writes what
it holds (arrays and their regions) and its load report. First it tries OUT/broken, a copy of
OUT/sim8 with a file only rank 3 reads corrupted: every rank must refuse it and change nothing.

Usage (under msrun): ckpt_worker.py OUT_DIR
"""
import json
import os
import sys

import numpy as np
import mindspore as ms

ms.set_context(mode=ms.PYNATIVE_MODE)
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper import auto_parallelize  # noqa: E402
from ckpt_models import adam, batches, gpt, megatron  # noqa: E402


def main():
    out = sys.argv[1]
    mh.set_context(mode="distributed", comm_timeout=120.0)
    ms.set_seed(99)  # other initial values than the checkpoint's: the load must replace them
    model = gpt()
    par = auto_parallelize(model, megatron(2, 2, zero=True))
    rank = par.local_ranks[0]
    optimizer = adam(par.optimizer_parameters())
    refused = _load_broken(par, optimizer, os.path.join(out, "broken"))
    report = mh.load_checkpoint(par, os.path.join(out, "sim8"), optimizer=optimizer)
    saved = np.load(os.path.join(out, "sim8_values.npz"))
    loaded_error = max(_held_error(par, optimizer, saved).values())
    losses = [float(par.train_step(optimizer, *batch).asnumpy()) for batch in batches(2, 2)]
    mh.save_checkpoint(par, os.path.join(out, "dist4"), optimizer=optimizer)
    arrays, regions = _held(par, optimizer)
    np.savez(os.path.join(out, f"held_rank{rank}.npz"), **arrays)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "losses": losses, "loaded_error": loaded_error, "regions": regions,
                   "report": report.__dict__, "refused": refused}, f)


def _load_broken(par, optimizer, directory):
    """Load a checkpoint only some ranks find corrupt: (error message, whether anything changed)."""
    before, _ = _held(par, optimizer)
    try:
        mh.load_checkpoint(par, directory, optimizer=optimizer)
        message = None
    except mh.checkpoint.CheckpointError as exc:
        message = str(exc)
    after, _ = _held(par, optimizer)
    return {"message": message, "changed": [n for n in before if not np.array_equal(before[n], after[n])]}


def _held(par, optimizer):
    """What this process holds: name -> array, name -> region ([start, stop] per dimension)."""
    arrays, regions = {}, {}
    params = dict(par.network.parameters_and_names())
    for row in par.table:
        arrays[row.name] = params[row.name].asnumpy()
        regions[row.name] = [[s.start, s.stop] for s in par.held_region(row.name)]
    names = {p.name for p in optimizer.parameters}
    mine = {id(p) for p in optimizer.parameters}
    for name, p in optimizer.parameters_and_names():
        if id(p) in mine:
            continue
        key = "opt:" + name
        arrays[key] = p.asnumpy()
        owner = max((n for n in names if name.endswith("." + n)), key=len, default=None)
        region = par.held_region(owner, optimizer=True) if owner else tuple(slice(0, n) for n in p.shape)
        regions[key] = [[s.start, s.stop] for s in region]
    return arrays, regions


def _held_error(par, optimizer, saved):
    """name -> max |held - saved global value in the held region|."""
    arrays, regions = _held(par, optimizer)
    return {name: float(np.abs(arrays[name] - saved[name][tuple(slice(a, b) for a, b in regions[name])]).max())
            if arrays[name].size else 0.0 for name in arrays}


if __name__ == "__main__":
    main()
