"""What native mode's step refuses before it runs: CPU, fewer processes than the strategy's devices,
and the training options of `ParallelModel.train_step` it does not translate.

MindSpore 2.10's semi-auto parallel (`Primitive.shard`, `AutoParallel`) does not compile on CPU
("Invalid backend: CPU"), and in one plain PyNative process the `AutoParallel` step runs anyway:
the whole model on one device, every `shard()` ignored, no error and no warning (checked
2026-12-07: the README's block returned a loss). On Ascend/GPU it runs one process per device
(msrun); a job with fewer processes than the strategy's mesh has devices is not the strategy's
run either. So the step `apply_native` returns checks both at each call, before MindSpore
compiles anything, naming what runs the strategy instead. Building the step and reading its
translation (`hyper_native_plan`) stay allowed anywhere: that is what checks the strategies
(`tests/runtime/native/`). The process-count refusal was checked here only with the device
target set to Ascend by the test (this project has no Ascend machine).

`max_grad_norm`, `accumulation_steps` and `loss_scale` are not translated (the step is MindSpore's
value_and_grad and update: translate.py's `_train_one_step`); passed to the step's call or to a
`train_step` call they are refused, naming the option, on any device target.
"""
from __future__ import annotations

import functools
import os

__all__ = ["device_target", "job_processes", "check_can_run", "native_step_type", "refuse_training_options",
           "TRAINING_OPTIONS"]


def device_target() -> str:
    """MindSpore's device target ("CPU", "Ascend" or "GPU"): the one place native mode reads it."""
    import mindspore as ms

    return ms.get_context("device_target")


def job_processes() -> int:
    """The job's process count: msrun's MS_WORKER_NUM (or a rank table's RANK_SIZE); 1 outside a job."""
    return int(os.environ.get("MS_WORKER_NUM", os.environ.get("RANK_SIZE", "1")))


def check_can_run(devices: int) -> None:
    """Raise unless this process can run the native step of a strategy on `devices` devices.

    Args:
        devices: the devices of the strategy's mesh (every pipeline stage's), named in the messages.

    Raises:
        RuntimeError: MindSpore's device target is CPU (the message names mode="simulation" and
            mode="distributed" under msrun), or the job has fewer processes than `devices` (the
            message names both counts, msrun --worker_num=`devices` and the simulation on CPU).
    """
    target = device_target()
    hint = (f"mh.set_context(mode='simulation', device_num={devices}) ({devices} virtual devices in this process)")
    if target == "CPU":
        raise RuntimeError(
            f"native mode does not run on CPU: MindSpore's semi-auto parallel (Primitive.shard, AutoParallel) "
            f"needs Ascend or GPU (MindSpore refuses to compile it on CPU), and in one process this step would "
            f"run the whole model on one device, not on the strategy's {devices}. On CPU use {hint} or "
            f"mode='distributed' under msrun (one process per device: `mindspore-hyper msrun "
            f"--worker_num={devices} --local_worker_num={devices} ... script.py`). The translation itself "
            f"stays readable here: step.hyper_native_plan")
    processes = job_processes()
    if processes < devices:
        raise RuntimeError(
            f"native mode on {target}: the strategy's mesh has {devices} devices but this job has {processes} "
            f"process(es) (MS_WORKER_NUM / RANK_SIZE); MindSpore's semi-auto parallel runs one process per device, "
            f"so the step would not run the strategy. Launch one process per device with msrun: `mindspore-hyper "
            f"msrun --worker_num={devices} --local_worker_num=<devices per node> ... script.py`, or run the "
            f"strategy on CPU in simulation: {hint}")


TRAINING_OPTIONS = {
    "max_grad_norm": "global-norm clipping (the native step is MindSpore's value_and_grad and the optimizer's "
                     "update, with no clipping between them)",
    "accumulation_steps": "gradient accumulation (the native step updates once per call on the whole batch; "
                          "MindSpore accumulates only pipeline micro-batches: micro_batches= with pipeline stages)",
    "loss_scale": "loss scaling (the native step has none: MindSpore's TrainOneStepWithLossScaleCell on "
                  "step.hyper_network is the native way)",
}


def refuse_training_options(options: dict) -> None:
    """Raise if `options` holds one of `ParallelModel.train_step`'s training options, which the
    native translation does not translate (so none is accepted and silently ignored).

    Args:
        options: the keyword arguments of the call.

    Raises:
        ValueError: naming the first such option, its value, what native mode lacks and the modes that do it.
    """
    for name, missing in TRAINING_OPTIONS.items():
        if name in options:
            raise ValueError(f"native mode: {name}={options[name]!r} is not translated: {missing}. "
                             f"train_step(..., {name}=...) runs in mode='simulation' and mode='distributed' "
                             f"(msrun)")


@functools.lru_cache(maxsize=None)
def native_step_type() -> type:
    """`mindspore.parallel.auto_parallel.AutoParallel` whose call first runs `check_can_run`
    (made on first use: importing this module does not import MindSpore)."""
    from mindspore.parallel.auto_parallel import AutoParallel

    class NativeStep(AutoParallel):
        """MindSpore's AutoParallel around the native training step; refuses a run that would not be
        the strategy's (CPU, too few processes) and the training options it does not translate."""

        def __call__(self, *args, **kwargs):
            refuse_training_options(kwargs)
            check_can_run(self.hyper_strategy_table.mesh.size)
            return super().__call__(*args, **kwargs)

        def train_step(self, optimizer, *inputs, **options):
            """`ParallelModel.train_step`'s signature, refused: the native step is `step(*batch)`.

            Raises:
                ValueError: an option it does not translate (named, first).
                TypeError: otherwise, naming the call to make instead.
            """
            refuse_training_options(options)
            raise TypeError("native mode: the step auto_parallelize returned is called as step(*batch) (MindSpore's "
                            "compiled training step with the optimizer given to auto_parallelize); it has no "
                            "train_step(optimizer, *inputs)")

    return NativeStep
