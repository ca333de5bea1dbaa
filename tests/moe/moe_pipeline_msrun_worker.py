"""Worker of the MoE-in-pipeline msrun test: MoEChain pipelined over 2 stages (one MoEBlock per
stage) for 3 Adam steps per case, and the same model on one device accumulating the same
microbatches (once per case, see `run_cases_and_write_results`); writes per rank, per case, both
losses, evaluation losses and this process's stage parameters (expert shards: with their slices
of the reference) to JSON.

Usage (under msrun): moe_pipeline_msrun_worker.py OUT_DIR CASE [CASE ...],
CASE = "<kind>" (2 processes, pipeline-only mesh, each stage's experts local) or
"<kind>+expert" (4 processes, pipeline 2 x expert 2: each stage's experts split over its 2
processes) or "<kind>+expert+hier" (also the hierarchical dispatch over 2 expert groups).
"""
from mindspore_hyper.launch import exit_if_msrun_scheduler  # noqa: E402

exit_if_msrun_scheduler()  # before MindSpore's import (~3 s): msrun's scheduler has nothing to do with shm
import os
import sys

import mindspore as ms
from mindspore import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: msrun_cases
ms.set_context(mode=ms.PYNATIVE_MODE)
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper import Layout  # noqa: E402
from msrun_cases import run_cases_and_write_results  # noqa: E402
from moe_models import MICROBATCHES, MoEChain, chain_data, copy_weights, one_device_accumulating  # noqa: E402

STEPS = 3


def run_case(case: str):
    kind, *extra = case.split("+")
    ms.set_seed(0)
    model = MoEChain(**(dict(dispatch="hierarchical", expert_groups=2) if "hier" in extra else {}))
    ref = MoEChain()
    copy_weights(model, ref)  # every process drew the same initial values (the builder broadcasts rank 0's)
    if "expert" in extra:
        strategy = Layout((2, 2), ("pipeline", "expert"))(tensor_map=())
        strategy.override("*.experts.*", "expert")
    else:
        strategy = Layout((2,), ("pipeline",))(tensor_map=())
    parallel = mh.auto_parallelize(model, strategy,
                                   pipeline=dict(schedule=kind, microbatches=MICROBATCHES, layers_per_stage=(2, 3)))
    data = chain_data(STEPS)
    opt = nn.Adam(parallel.optimizer_parameters(), learning_rate=1e-2)
    losses = [float(parallel.train_step(opt, x, t).asnumpy()) for x, t in data]
    x, t = data[0]
    params, regions = {}, {}
    for s in parallel.held_stages():
        stage = parallel.stage_models.get(s)
        for p in parallel.stage_cells[s].trainable_params():
            regions[p.name] = () if stage is None else tuple(slice(r.start, r.stop)
                                                             for r in stage.held_region(stage.rows[id(p)].name))
            params[p.name] = p.asnumpy().tolist()
    out = {"rank": parallel.world.rank, "losses": losses, "eval_loss": float(parallel(x, t).asnumpy()),
           "aux_losses": [a for c in parallel.computations.values() for a in c.aux_losses], "params": params,
           "stats": [block.moe.parallel().last_stats if block.moe._parallel is not None else None
                     for block in (model.block1, model.block2)]}

    def reference() -> dict:
        losses = one_device_accumulating(ref, data)
        return {"losses": losses, "eval_loss": float(ref(x, t).asnumpy()),
                "params": {p.name: p.asnumpy() for p in ref.trainable_params()}}

    def finish(expected: dict) -> dict:
        out["ref_losses"], out["ref_eval_loss"] = expected["losses"], expected["eval_loss"]
        out["ref_params"] = {name: expected["params"][name][region].tolist() for name, region in regions.items()}
        return out

    return reference, finish


if __name__ == "__main__":
    run_cases_and_write_results(run_case)
