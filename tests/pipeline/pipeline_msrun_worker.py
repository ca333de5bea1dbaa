"""msrun worker: 5 pipelined Adam steps of pipeline_models.dense_chain; each rank writes its
losses, its stages' parameters and (rank 0) the measured and simulated timelines to OUT/rank<r>.npz.

Usage: msrun ... pipeline_msrun_worker.py RUN [RUN ...], each RUN a JSON object, run one after
another in the same processes (a launch costs every process's MindSpore start-up):
  "kind", "microbatches", "out": the schedule, its micro-batches and the folder for rank<r>.npz;
  "mesh": "pipeline" (default) or "data" / "tensor": that axis 2 x pipeline;
  "model": "gpt": the examples' GPT instead (see gpt_main);
  "clip": N: train_step(max_grad_norm=N); each rank writes every step's `last_grad_norm` (the
    global norm over all stages and shards) too;
  "rebalance": true: start from the split (1, 6) with rebalancing on, the planner fed fixed
    per-layer costs (test_pipeline_rebalance.LAYER_COSTS) for this process's stages; the applied
    plans and migrated bytes are written too.
"""
from mindspore_hyper.launch import exit_if_msrun_scheduler  # noqa: E402

exit_if_msrun_scheduler()  # before MindSpore's import (~3 s): msrun's scheduler has nothing to do with shm
import json
import os
import sys

import mindspore as ms
import numpy as np
from mindspore import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mindspore_hyper as mh  # noqa: E402
from mindspore_hyper import Layout  # noqa: E402
from pipeline_models import batch, dense_chain  # noqa: E402


def gpt_main(kind, m, out):
    """PIPELINE_TEST_MODEL=gpt: examples/models.py GPT (a mask side input to every block)
    pipelined through its construct; each rank writes its losses and its stages' parameters."""
    from pipeline_models import gpt, tokens

    ms.set_context(mode=ms.PYNATIVE_MODE)
    mh.set_context(mode="distributed", comm_timeout=60.0)
    size = int(os.environ.get("MS_WORKER_NUM", "1"))
    model = gpt(layers=2)
    ids, labels = tokens()
    parallel = mh.auto_parallelize(model, Layout((size,), ("pipeline",))(tensor_map=()),
                                   pipeline={"schedule": kind, "microbatches": m})
    optimizer = nn.Adam(parallel.optimizer_parameters(), 1e-3)
    losses = [float(parallel.train_step(optimizer, ids, labels).asnumpy()) for _ in range(5)]
    arrays = {f"param:{name}": p.asnumpy() for s in parallel.held_stages()
              for name, p in parallel.stage_cells[s].parameters_and_names()}
    arrays["losses"] = np.array(losses)
    np.savez(os.path.join(out, f"rank{parallel.world.rank}.npz"), **arrays)


def main(run: dict):
    kind, m, out = run["kind"], int(run["microbatches"]), run["out"]
    if run.get("model") == "gpt":
        return gpt_main(kind, m, out)
    width, depth, n, steps = 16, 4, 8, 5
    ms.set_context(mode=ms.PYNATIVE_MODE)
    mh.set_context(mode="distributed", comm_timeout=60.0)
    size = int(os.environ.get("MS_WORKER_NUM", "1"))
    model = dense_chain(width, depth)
    x, y = batch(n)
    mesh_kind = run.get("mesh", "pipeline")  # or "data" / "tensor": that axis 2 x pipeline
    if mesh_kind == "pipeline":
        strategy = Layout((size,), ("pipeline",))(tensor_map=())
    else:
        strategy = Layout((2, size // 2), (mesh_kind, "pipeline"))(tensor_map=(mesh_kind,) if mesh_kind == "tensor" else ())
    options = {"schedule": kind, "microbatches": m}
    rebalance = bool(run.get("rebalance"))
    if rebalance:
        from mindspore_hyper.pipeline.pipeline_model import PipelineModel
        from test_pipeline_rebalance import LAYER_COSTS

        def fixed_stage_times(self):
            bounds = np.cumsum((0,) + self.split)
            return tuple(float(sum(LAYER_COSTS[bounds[s]:bounds[s + 1]])) if s in self.held_stages() else 0.0
                         for s in range(len(self.split)))

        PipelineModel.stage_times = fixed_stage_times
        options.update(rebalance=True, layers_per_stage=(1, 6))
    parallel = mh.auto_parallelize(model, strategy, pipeline=options)
    optimizer = nn.Adam(parallel.optimizer_parameters(), 1e-2)
    clip = run.get("clip")
    losses, norms = [], []
    timelines = []
    for _ in range(steps):
        losses.append(float(parallel.train_step(optimizer, x, y, max_grad_norm=clip).asnumpy()))
        norms.append(parallel.last_grad_norm)
        measured = parallel.measured_timeline()  # collective: every rank calls it
        timelines.append(measured)
    rank = parallel.world.rank
    if mesh_kind == "tensor":  # the last training step's memory rows and series of this process's device
        # (before the forward-only call below, after which the report has no step series)
        report = parallel.report(optimizer)
        step_memory = json.dumps({"step_memory": report.step_memory, "memory": report.memory,
                                  "norm_row": report.comm_backward["AllReduce"]["tensor+pipeline"],
                                  "norm_causes": report.comm_causes["backward"]["AllReduce"]["tensor+pipeline"]})
    eval_loss = float(parallel(x, y).asnumpy())  # forward only, every process

    arrays = {f"param:{p.name}": p.asnumpy() for p in parallel.optimizer_parameters()}
    if mesh_kind == "tensor":  # shards: write where each came from
        arrays = {}
        for s in parallel.held_stages():
            model_s = parallel.stage_models[s]
            for p in model_s.network.trainable_params():
                region = model_s.held_region(model_s.rows[id(p)].name)
                arrays[f"param:{p.name}"] = p.asnumpy()
                arrays[f"region:{p.name}"] = np.array([[r.start, r.stop] for r in region])
    if mesh_kind == "tensor":
        arrays["step_memory"] = np.array(step_memory)
    arrays["losses"] = np.array(losses)
    arrays["grad_norms"] = np.array(norms)
    arrays["eval_loss"] = np.array(eval_loss)
    if rebalance:
        arrays["plans"] = np.array(json.dumps([[list(p.before), list(p.after)] for p in parallel.rebalance_log]))
        arrays["migrated_bytes"] = np.array(parallel.migrated_bytes)
        arrays["held"] = np.array(parallel.held_stages())
        arrays = {k: v for k, v in arrays.items() if not k.startswith("param:")}
        for s in parallel.held_stages():  # the Parameters this process owns now
            for p in parallel.stage_cells[s].trainable_params():
                arrays[f"param:{p.name}"] = p.asnumpy()
    if rank == 0:
        figures = []
        for t in timelines:
            sim = parallel.simulated_timeline(t)
            figures.append({"measured_makespan": t.makespan, "measured_bubble": t.bubble_fraction,
                            "simulated_makespan": sim.makespan, "simulated_bubble": sim.bubble_fraction,
                            "costs": {f"{k.value}:{s}": v for (k, s), v in t.mean_costs().items()}})
        arrays["timelines"] = np.array(json.dumps(figures))
        timelines[-1].to_chrome_trace(os.path.join(out, "measured_trace.json"))
    np.savez(os.path.join(out, f"rank{rank}.npz"), **arrays)


if __name__ == "__main__":
    from mindspore_hyper.pipeline.pipeline_model import PipelineModel

    stage_times = PipelineModel.stage_times
    for arg in sys.argv[1:]:
        main(json.loads(arg))
        PipelineModel.stage_times = stage_times  # a rebalancing run fixed the layer costs
