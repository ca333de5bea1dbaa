"""Worker of the MoE msrun test: trains MoENet expert parallel in distributed mode and the same
model on one device (once per case, see `run_cases_and_write_results`); writes per rank the
relative errors of its gradients and parameters to JSON.

Usage (under msrun): moe_msrun_worker.py OUT_DIR CASE [CASE ...],
CASE = "<data>x<expert>x<tensor>[+bits][+overlap][+place][+hier][+tiny][+deepseek][+gptoss]" (1-bit routing metadata;
2 overlap chunks; after 2 steps, experts re-placed by rebalance_experts with 4 extra replicas;
hierarchical dispatch over 2 expert groups; batches of 4 tokens, so some exchanges carry no rows;
DeepSeek-V3's sigmoid routing with a score correction bias, top-2-sum groups and a scaling factor;
gpt-oss's biased router and biased clamped-SwiGLU experts),
or "pipeline:<case>", a case of moe_pipeline_msrun_worker.py (one job for every 4-process MoE test).
"""
from mindspore_hyper.launch import exit_if_msrun_scheduler  # noqa: E402

exit_if_msrun_scheduler()  # before MindSpore's import (~3 s): msrun's scheduler has nothing to do with shm
import copy
import os
import sys

import numpy as np
import mindspore as ms
from mindspore import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: msrun_cases
ms.set_context(mode=ms.PYNATIVE_MODE)
from mindspore_hyper import Layout, auto_parallelize  # noqa: E402
from mindspore_hyper.moe.eplb import rebalance_experts  # noqa: E402
from mindspore_hyper.moe.expert_placement import ExpertPlacement, apply_placement  # noqa: E402
from msrun_cases import run_cases_and_write_results, train_reference  # noqa: E402
from moe_models import DEEPSEEK, GPT_OSS, MoENet, batches, copy_weights, expert_strategy, randomise_biases  # noqa: E402
from moe_msrun_cases import EXPERT_PARALLEL_CASES, PIPELINE_PREFIX  # noqa: E402
from mindspore_hyper.hyper_parallel.autograd_compat import (  # noqa: E402
    disable_mindspore_backward_compat, enable_mindspore_backward_compat,
)

STEPS = 3  # the third step runs on the re-placed experts of the +place case


def relative(local, expected):
    return float(np.linalg.norm(local - expected) / max(np.linalg.norm(expected), 1e-30))


def backward_error(par, params, batch) -> float:
    """`loss.backward()` (`enable_mindspore_backward_compat`, MindFormers' Trainer) through the
    expert exchange, the collectives and the parameter gradient sums vs `value_and_grad` on the
    same parameters and batch: the largest relative difference of a parameter's gradient."""
    _, grads = ms.value_and_grad(par, None, params)(*batch)
    enable_mindspore_backward_compat()
    try:
        par(*batch).backward()
        return max(relative(p.grad.asnumpy(), g.asnumpy()) for p, g in zip(params, grads))
    finally:
        disable_mindspore_backward_compat()


def run_case(case: str):
    dims, *extra = case.split("+")
    data, expert, tensor = (int(v) for v in dims.split("x"))
    ms.set_seed(0)
    routing = DEEPSEEK if "deepseek" in extra else GPT_OSS if "gptoss" in extra else {}
    ref = MoENet(shared=8 if tensor > 1 else 0, **routing)
    model = MoENet(shared=8 if tensor > 1 else 0, routing_bits="bits" in extra,
                   overlap_chunks=2 if "overlap" in extra else 1,
                   **(dict(dispatch="hierarchical", expert_groups=2) if "hier" in extra else {}), **routing)
    if "deepseek" in extra:  # a score correction bias that changes the choice, read by every process's routing
        ref.moe.router.score_bias.set_data(ms.Tensor((0.3 * np.random.default_rng(5).normal(size=8)).astype(np.float32)))
    if "gptoss" in extra:  # non-zero router and expert biases
        randomise_biases(ref)
    copy_weights(ref, model)
    mesh = Layout((data, expert, tensor), ("data", "expert", "tensor"))
    par = auto_parallelize(model, expert_strategy(mesh, tensor=tensor > 1))
    rank = par.local_ranks[0]
    opt = nn.Adam(par.optimizer_parameters(), learning_rate=1e-2)
    out = {"rank": rank, "losses": []}
    data = batches(STEPS, batch=1, seq=4) if "tiny" in extra else batches(STEPS)
    for i, (x, t) in enumerate(data):
        if i == 2 and "place" in extra:
            phy2log, _, logcnt = rebalance_experts(model.moe.last_expert_counts[None, :], 12, 1, 1, expert)
            apply_placement(model.moe, ExpertPlacement.from_eplb(phy2log))
            out["replicas"] = logcnt[0].tolist()
        loss = par.train_step(opt, x, t)
        if i == 0:
            grads = {name: np.array(g) for name, g in par.last_gradients.items()}
        out["losses"].append(float(loss.asnumpy()))
    local = {n: p.asnumpy() for n, p in model.parameters_and_names()}
    held = {row.name: row.layout.rank_slices(rank, row.global_shape) for row in par.table}
    out["held_expert_shape"] = list(local["moe.experts.w_gate"].shape)
    out["stats"] = copy.deepcopy(model.moe.parallel().last_stats)
    # the last step's expert ops, this process's own (moe/expert_ops.py), before backward_error's forwards
    out["expert_ops"] = sorted([op, flops, nbytes, calls] for (op, flops, nbytes), calls in par.accounting.compute.items()
                               if op.startswith("Expert"))
    if case in EXPERT_PARALLEL_CASES:
        out["backward_error"] = backward_error(par, model.trainable_params(), data[0])

    def reference() -> dict:
        return train_reference(ref, nn.Adam(ref.trainable_params(), learning_rate=1e-2), data)

    def finish(expected: dict) -> dict:
        out["ref_losses"] = expected["losses"]
        out["grad_error"] = {name: relative(g, expected["grads"][name][held[name]])
                             for name, g in grads.items() if name in held}
        out["param_error"] = {name: relative(local[name], expected["params"][name][held[name]])
                              for name in held if name in local}
        return out

    return reference, finish


def run_job_case(case: str):
    """A case of the shared job: this worker's, or moe_pipeline_msrun_worker.py's (PIPELINE_PREFIX)."""
    if case.startswith(PIPELINE_PREFIX):
        from moe_pipeline_msrun_worker import run_case as run_pipeline_case

        return run_pipeline_case(case[len(PIPELINE_PREFIX):])
    return run_case(case)


if __name__ == "__main__":
    run_cases_and_write_results(run_job_case)
