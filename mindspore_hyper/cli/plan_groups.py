"""`mindspore-hyper plan` for a config that declares device groups (HyperMPMD).

Such a config runs each group as its own program on a mesh of its own ranks, so the plan is the
built MPMD job's: `auto_parallelize` with `hyper_mpmd` on resolves every group's Cells once into
the job's StrategyTable (`strategy/group_table.py`), one simulated step runs through the model
protocol (`train_step`), and the table (each group's mesh and rows) and the report (its MPMD
section) are what `plan` prints. The config-level table would show the grouped parameters on the
job mesh, which is not where they run.
"""
from __future__ import annotations

from typing import Callable, Sequence, Tuple

__all__ = ["simulate_groups"]


def simulate_groups(model, config, inputs: Sequence, optimizer: Callable, backward: bool = True) -> Tuple:
    """Build `model`'s MPMD job for `config` in simulation and run one step.

    Args:
        model: the nn.Cell; every Cell with parameters belongs to one of the config's groups.
        config: a ParallelConfig with device groups (`config.groups` not empty).
        inputs: the model's global inputs.
        optimizer: factory ``params -> nn.Optimizer`` whose real states the report counts.
        backward: run `train_step` (the model must return a scalar loss), else the forward only.

    Returns:
        (the job's StrategyTable holding every group's mesh and rows, the step's StepReport).

    Raises:
        ValueError: what the MPMD build and step refuse, naming the group and its config field (a
            modules pattern matching no Cell, a parameter outside every group, a group's batch
            that does not fit its ranks or its declared `batch_size`).
    """
    import mindspore as ms

    import mindspore_hyper as mh

    ms.set_context(mode=ms.PYNATIVE_MODE)
    mh.set_context(mode="simulation", device_num=config.mesh.size, hyper_mpmd=True)
    parallel = mh.auto_parallelize(model, config)
    states = optimizer(parallel.optimizer_parameters())
    if backward:
        parallel.train_step(states, *inputs)
    else:
        parallel(*inputs)
    return parallel.table, parallel.report(states)
