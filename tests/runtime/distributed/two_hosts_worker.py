"""msrun worker of the two-host test: one msrun per "host" (network namespace), two processes each.

With dist_transport="hybrid" it trains MindSpore layers (`dense_stack`, data 2 x tensor 2, ZeRO-1
Adam) for STEPS steps, writing what it held before and after (OUT/<when><r>.npz/.json), saves
the trained model's checkpoint asynchronously (the commit coordinated through the file system
both hosts share), and writes OUT/rank<r>.json: its hostname, every rank's host digest, the
transport of each of its groups, its losses. Then it keeps all-reducing over the whole job until
the job fails: the test kills the other host.

Usage (under msrun, in a namespace): two_hosts_worker.py OUT_DIR
"""
import json
import os
import socket
import sys
import time

import numpy as np
import mindspore as ms

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "checkpoint"))
ms.set_context(mode=ms.PYNATIVE_MODE)
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper import auto_parallelize  # noqa: E402
from mindspore_hyper.runtime.distributed import world  # noqa: E402
from ckpt_models import adam, dense_batches, dense_stack, dense_strategy, held  # noqa: E402

STEPS = 3


def main():
    out = sys.argv[1]
    mh.set_context(mode="distributed", dist_transport="hybrid", comm_timeout=float(os.environ["TEST_COMM_TIMEOUT"]))
    ms.set_seed(3)
    par = auto_parallelize(dense_stack(), dense_strategy(2, 2))
    optimizer = adam(par.optimizer_parameters())
    w = world()
    _dump(out, f"initial{w.rank}", par, optimizer)
    losses = [float(par.train_step(optimizer, *batch).asnumpy()) for batch in dense_batches(0, STEPS)]
    _dump(out, f"trained{w.rank}", par, optimizer)
    mh.save_checkpoint(par, os.path.join(out, "ckpt"), optimizer=optimizer, blocking=False).wait()
    result = {"hostname": socket.gethostname(), "hosts": list(w.hosts), "losses": losses,
              "groups": {",".join(map(str, ranks)): type(c).__name__ for ranks, c in w._communicators.items()}}
    with open(os.path.join(out, f"rank{w.rank}.json.part"), "w") as f:
        json.dump(result, f)
    os.replace(os.path.join(out, f"rank{w.rank}.json.part"), os.path.join(out, f"rank{w.rank}.json"))
    everyone = w.communicator(tuple(range(w.size)))
    while True:  # until the other host is killed and this job fails
        everyone.all_reduce(np.ones(4, np.float32))
        time.sleep(0.05)


def _dump(out, name, par, optimizer):
    arrays, regions = held(par, optimizer)
    np.savez(os.path.join(out, name + ".npz"), **arrays)
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(regions, f)


if __name__ == "__main__":
    main()
