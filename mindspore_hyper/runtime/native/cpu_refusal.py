"""Native mode's step refuses to run on CPU, where it would be no parallel run.

MindSpore 2.10's semi-auto parallel (`Primitive.shard`, `AutoParallel`) does not compile on CPU
("Invalid backend: CPU"), and in one plain PyNative process the `AutoParallel` step runs anyway:
the whole model on one device, every `shard()` ignored, no error and no warning (checked
2026-12-07: the README's block returned a loss). So the step `apply_native` returns refuses its
first call on CPU, naming what runs the strategy here instead. Building the step and reading
its translation (`hyper_native_plan`) stay allowed on CPU: that is what checks the strategies
(`tests/runtime/native/`).
"""
from __future__ import annotations

import functools

__all__ = ["native_step_type", "refuse_on_cpu"]


def refuse_on_cpu(devices: int) -> None:
    """Raise when MindSpore targets CPU, where the native step would run on one device.

    Args:
        devices: the devices of the strategy's mesh (named in the message).

    Raises:
        RuntimeError: MindSpore's device target is CPU; the message names mode="simulation" and
            mode="distributed" under msrun.
    """
    import mindspore as ms

    target = ms.get_context("device_target")
    if target == "CPU":
        raise RuntimeError(
            f"native mode does not run on CPU: MindSpore's semi-auto parallel (Primitive.shard, AutoParallel) "
            f"needs Ascend or GPU (MindSpore refuses to compile it on CPU), and in one process this step would "
            f"run the whole model on one device, not on the strategy's {devices}. On CPU use "
            f"mh.set_context(mode='simulation', device_num={devices}) ({devices} virtual devices in this "
            f"process) or mode='distributed' under msrun (one process per device: `mindspore-hyper msrun "
            f"--worker_num={devices} --local_worker_num={devices} ... script.py`). The translation itself "
            f"stays readable here: step.hyper_native_plan")


@functools.lru_cache(maxsize=None)
def native_step_type() -> type:
    """`mindspore.parallel.auto_parallel.AutoParallel` whose call first runs `refuse_on_cpu`
    (made on first use: importing this module does not import MindSpore)."""
    from mindspore.parallel.auto_parallel import AutoParallel

    class NativeStep(AutoParallel):
        """MindSpore's AutoParallel around the native training step; refuses to run on CPU."""

        def __call__(self, *args, **kwargs):
            refuse_on_cpu(self.hyper_strategy_table.mesh.size)
            return super().__call__(*args, **kwargs)

    return NativeStep
