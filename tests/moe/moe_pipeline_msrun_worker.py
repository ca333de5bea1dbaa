"""Worker of the MoE-in-pipeline msrun test: MoEChain pipelined over 2 stages (one MoEBlock per
stage) for 3 Adam steps per case, and the same model on one device accumulating the same
microbatches in the same process; writes per rank, per case, both losses, evaluation losses and
this process's stage parameters (expert shards: with their slices of the reference) to JSON.

Usage (under msrun): moe_pipeline_msrun_worker.py OUT_DIR CASE [CASE ...],
CASE = "<kind>" (2 processes, pipeline-only mesh, each stage's experts local) or
"<kind>+expert" (4 processes, pipeline 2 x expert 2: each stage's experts split over its 2
processes) or "<kind>+expert+hier" (also the hierarchical dispatch over 2 expert groups).
"""
import os
import sys

import mindspore as ms
from mindspore import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ms.set_context(mode=ms.PYNATIVE_MODE)
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper import Layout  # noqa: E402
from moe_models import (MICROBATCHES, MoEChain, chain_data, copy_weights, one_device_accumulating,  # noqa: E402
                        run_cases_and_write_results)

STEPS = 3


def run_case(case: str) -> dict:
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
    ref_losses = one_device_accumulating(ref, data)
    x, t = data[0]
    expected = {p.name: p.asnumpy() for p in ref.trainable_params()}
    params, ref_params = {}, {}
    for s in parallel.held_stages():
        stage = parallel.stage_models.get(s)
        for p in parallel.stage_cells[s].trainable_params():
            region = () if stage is None else tuple(slice(r.start, r.stop)
                                                    for r in stage.held_region(stage.rows[id(p)].name))
            params[p.name] = p.asnumpy().tolist()
            ref_params[p.name] = expected[p.name][region].tolist()
    return {"rank": parallel.world.rank, "losses": losses, "ref_losses": ref_losses,
            "eval_loss": float(parallel(x, t).asnumpy()), "ref_eval_loss": float(ref(x, t).asnumpy()),
            "aux_losses": [a for c in parallel.computations.values() for a in c.aux_losses],
            "params": params, "ref_params": ref_params,
            "stats": [block.moe.parallel().last_stats if block.moe._parallel is not None else None
                      for block in (model.block1, model.block2)]}




if __name__ == "__main__":
    run_cases_and_write_results(run_case)
