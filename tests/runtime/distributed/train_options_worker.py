"""Worker of test_train_options_msrun.py: the DenseNorm model (tests/train_helpers.py) trained on a
2 x 2 (data x tensor) mesh with ZeRO-1 by train_step(max_grad_norm, accumulation_steps, loss_scale),
against the single-device loop with ops.clip_by_global_norm on the whole batch.

Usage (under msrun, 4 workers): train_options_worker.py OUT_DIR options; the tests run the case
through dist_worker.py, in its 4-process job (conftest.py).
"""
from mindspore_hyper.launch import exit_if_msrun_scheduler  # noqa: E402

exit_if_msrun_scheduler()  # before MindSpore's import: msrun's scheduler has nothing to do with shm
import io
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import nn, ops

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
ms.set_context(mode=ms.PYNATIVE_MODE)
import mindspore_hyper as mh  # noqa: E402
from msrun_cases import run_cases_and_write_results  # noqa: E402
from train_helpers import BATCH, batch, strategy, twins  # noqa: E402
from mindspore_hyper.train import Telemetry  # noqa: E402

STEPS, LR, MAX_NORM, ACCUMULATION, SCALE = 2, 0.1, 0.05, 2, 2.0 ** 8


def run_case(case: str):
    ref, net = twins()
    par = mh.auto_parallelize(net, strategy("zero"))
    rank = par.local_ranks[0]
    opt = nn.SGD(par.optimizer_parameters(), LR)
    out = {"rank": rank, "losses": [], "norms": []}
    lines = io.StringIO()
    telemetry = Telemetry(stream=lines, all_ranks=True)  # every process logs (default: rank 0's only)
    telemetry.start()
    for seed in range(STEPS):
        loss = par.train_step(opt, *batch(seed), max_grad_norm=MAX_NORM, accumulation_steps=ACCUMULATION,
                              loss_scale=SCALE)
        out["losses"].append(float(loss.asnumpy()))
        out["norms"].append(par.last_grad_norm)
        telemetry.step(par, loss, tokens=BATCH, optimizer=opt)  # the global batch: one token per sample
    telemetry.close()
    out["skipped"] = par.last_step_skipped
    last = par.report(opt)  # the last step's, before clip_grad_norm below adds its own all-reduce
    out["step_comm_backward"] = last.comm_backward  # its gradient sync: compared with simulated_comm_backward()
    out["telemetry"] = {"records": [r.to_dict() for r in telemetry.records], "lines": lines.getvalue().splitlines(),
                        "report_total": last.memory[rank]["total"], "report_ranks": sorted(last.memory),
                        "report_parameters": last.memory[rank]["parameters"],
                        "report_comm_bytes": sum(v["bytes"] for comm in (last.comm, last.comm_backward)
                                                 for axes in comm.values() for v in axes.values()),
                        "local_parameter_bytes": sum(p.asnumpy().nbytes for p in net.trainable_params()),
                        "global_parameter_bytes": sum(p.asnumpy().nbytes for p in ref.trainable_params())}
    # MindSpore's own clipping on this process's shards sees only them: its norm (what the docs warn of)
    grads = [ms.Tensor(par.last_gradients[p.name]) for p in net.trainable_params()]
    squares = ops.addn([ops.square(g).sum().reshape((1,)) for g in grads])
    out["mindspore_local_norm"] = float(ops.sqrt(squares).asnumpy()[0])
    out["package_norm_of_same"] = mh.clip_grad_norm(par, grads, 1e9)[1]
    report = par.report(opt)
    out["comm_backward"], out["comm_causes"] = report.comm_backward, report.comm_causes
    local = {p.name: p.asnumpy() for p in net.trainable_params()}
    regions = {row.name: row.layout.rank_slices(rank, row.global_shape) for row in par.table}

    def reference() -> dict:
        ref_opt = nn.SGD(ref.trainable_params(), LR)
        figures = {"losses": [], "norms": [], "last_norm_of_grads": None}
        for seed in range(STEPS):
            loss, g = ms.value_and_grad(ref, None, ref.trainable_params())(*batch(seed))
            figures["losses"].append(float(loss))
            figures["norms"].append(float(np.sqrt(sum(np.sum(x.asnumpy().astype(np.float64) ** 2) for x in g))))
            ref_opt(ops.clip_by_global_norm(g, MAX_NORM))
        figures["params"] = {p.name: p.asnumpy() for p in ref.trainable_params()}
        return figures

    def finish(expected: dict) -> dict:
        out["ref_losses"], out["ref_norms"] = expected["losses"], expected["norms"]
        out["param_error"] = {name: [float(np.linalg.norm(local[name] - want[regions[name]])),
                                     float(np.linalg.norm(want[regions[name]]))]
                              for name, want in expected["params"].items()}
        return out

    return reference, finish


def simulated_comm_backward() -> dict:
    """The options case's steps simulated on 4 devices in this process (the same model, strategy,
    batches and options): the last step's backward collectives (JSON-shaped), the figures each
    process's report of its last step must equal byte for byte."""
    import json

    _, net = twins()
    mh.set_context(mode="simulation", device_num=4)
    par = mh.auto_parallelize(net, strategy("zero"))
    opt = nn.SGD(par.optimizer_parameters(), LR)
    for seed in range(STEPS):
        par.train_step(opt, *batch(seed), max_grad_norm=MAX_NORM, accumulation_steps=ACCUMULATION, loss_scale=SCALE)
    return json.loads(json.dumps(par.report(opt).comm_backward))


if __name__ == "__main__":
    run_cases_and_write_results(run_case)
