"""Train a chain of MindSpore layers with pipeline parallelism and check it against one device.

The same script runs in both CPU modes:

    .venv/bin/python examples/pipeline_training.py      # simulation: data 2 x pipeline 2 (4 virtual devices)
    MS_HYPER_MODE=distributed .venv/bin/mindspore-hyper msrun --worker_num=2 --local_worker_num=2 \\
        --master_port=8119 --log_dir=msrun_log --join=True examples/pipeline_training.py
                                                         # one process per pipeline rank (shared-memory p2p)

The model is `nn.WithLossCell(nn.SequentialCell([...Dense, ReLU...]), nn.MSELoss())`: its layers
are cut into stages (balanced by parameter count), each batch is split into microbatches, and
the schedule (env PIPELINE_SCHEDULE, default 1f1b; any of gpipe, 1f1b, interleaved_1f1b, zb_h1,
zb_v, dualpipe_v) moves activations and gradients between stages; one optimizer step per batch.
Under msrun the mesh is the pipeline alone (data/tensor axes with pipeline run in simulation).
Env PIPELINE_TRACE=path.json writes the step's timeline as a chrome trace.
"""
from mindspore_hyper.launch import exit_if_msrun_scheduler  # noqa: E402

exit_if_msrun_scheduler()  # before MindSpore's import (~3 s): msrun's scheduler has nothing to do with shm
import os

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

import mindspore_hyper as mh
from mindspore_hyper import Layout, auto_parallelize

STEPS = 5


def build_model() -> nn.Cell:
    ms.set_seed(7)
    layers = [nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 32), nn.Tanh(), nn.Dense(32, 32), nn.ReLU(),
              nn.Dense(32, 32), nn.Tanh(), nn.Dense(32, 4)]
    return nn.WithLossCell(nn.SequentialCell(layers), nn.MSELoss())


def main():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    mode = mh.get_context("mode")
    kind = os.environ.get("PIPELINE_SCHEDULE", "1f1b")
    if mode == "distributed":
        ranks = int(os.environ.get("MS_WORKER_NUM", "1"))
        mesh = Layout((ranks,), ("pipeline",))
    else:
        mesh = Layout((2, 2), ("data", "pipeline"))
        mh.set_context(device_num=mesh.size)
    rng = np.random.default_rng(0)
    batches = [(Tensor(rng.standard_normal((16, 16)).astype(np.float32)),
                Tensor(rng.standard_normal((16, 4)).astype(np.float32))) for _ in range(STEPS)]

    reference = build_model()
    ref_step = nn.TrainOneStepCell(reference, nn.Adam(reference.trainable_params(), 1e-2))
    ref_losses = [float(ref_step(x, y).asnumpy()) for x, y in batches]

    model = build_model()
    parallel = auto_parallelize(model, mesh(tensor_map=()), pipeline={"schedule": kind, "microbatches": 4})
    optimizer = nn.Adam(parallel.optimizer_parameters(), 1e-2)
    losses = [float(parallel.train_step(optimizer, x, y).asnumpy()) for x, y in batches]
    timeline = parallel.measured_timeline() if mode == "distributed" else None  # every process calls it

    print(f"mode {mode}, schedule {kind}, mesh {dict(zip(mesh.alias_names, mesh.device_matrix))}, "
          f"layers per stage {list(parallel.split)}, this process runs stages {list(parallel.held_stages())}")
    print("step  single-device   pipeline     rel.diff")
    for i, (a, b) in enumerate(zip(ref_losses, losses)):
        print(f"{i:4d}  {a:13.6f}  {b:10.6f}  {abs(a - b) / abs(a):9.2e}")
    report = parallel.report(optimizer)
    print()
    print(report)
    if timeline is not None:
        simulated = parallel.simulated_timeline(timeline)
        print(f"measured step: makespan {timeline.makespan * 1e3:.1f} ms, bubble {timeline.bubble_fraction:.1%}; "
              f"simulated with the measured costs: {simulated.makespan * 1e3:.1f} ms, {simulated.bubble_fraction:.1%}")
    trace = os.environ.get("PIPELINE_TRACE")
    if trace:
        (timeline or report.timeline).to_chrome_trace(trace)
    worst = max(abs(a - b) / abs(a) for a, b in zip(ref_losses, losses))
    reference_params = {p.name: p.asnumpy() for p in reference.trainable_params()}
    worst_param = max(float(np.abs(p.asnumpy() - reference_params[p.name]).max())
                      for p in parallel.optimizer_parameters())
    if worst > 1e-5 or worst_param > 1e-5:
        raise SystemExit(f"pipeline training differs from one device: losses {worst:.2e}, parameters {worst_param:.2e}")
    print(f"\nOK: {STEPS} pipelined steps match single-device training (losses {worst:.1e}, "
          f"parameters {worst_param:.1e})")


if __name__ == "__main__":
    main()
