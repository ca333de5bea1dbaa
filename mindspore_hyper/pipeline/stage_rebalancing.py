"""StageRebalancing: a PipelineModel's layers moved between stages between steps (scheduler: dynamic).

Every stage's measured compute time feeds the planner (schedule/rebalance); a planned move re-cuts
the stages at the new boundaries. In one process the optimizer holds every Parameter and its
states, so nothing else moves; under msrun each moved layer's Parameters and optimizer states are
sent from the process that ran it to every process (`migrate`), and every process plans from the
same all-gathered times, so all apply the same plan.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

__all__ = ["StageRebalancing"]


class StageRebalancing:
    """The rebalancing state of one PipelineModel.

    Attributes:
        log: the StageMovePlans applied so far.
        migrated_bytes: under msrun, bytes of Parameters and optimizer states moved by rebalancing.
    """

    def __init__(self):
        self.log: List[object] = []
        self.migrated_bytes = 0
        self._rebalancer = None

    @staticmethod
    def active(model) -> bool:
        """Whether `model`'s layers move between steps: `pipeline.rebalance`, else the config's
        `scheduler: dynamic`."""
        options, table = model.options, model.table
        if options.rebalance is not None:
            return options.rebalance
        return table is not None and table.config is not None and table.config.scheduler == "dynamic"

    def rebalance(self, model, optimizer: nn.Optimizer) -> None:
        """Feed PipelineModel `model`'s last step's stage times to the planner; apply a planned
        move (module docstring)."""
        from mindspore_hyper.schedule.rebalance import LayerSpec, StageRebalancer

        if self._rebalancer is None:
            weights = model.layers.weights(model.network)
            specs = [LayerSpec(name, w, params) for name, w, params in
                     zip(model.layers.names, weights, model.layers.parameters)]
            self._rebalancer = StageRebalancer(specs, model.split)
        plan = self._rebalancer.observe(_all_stage_times(model))
        if plan.is_empty:
            return
        if not model.in_one_process:
            self.migrate(model, plan, optimizer)
        model.build_stages(plan.after)
        self._rebalancer.commit(plan)
        self.log.append(plan)

    def migrate(self, model, plan, optimizer: nn.Optimizer) -> None:
        """Bring each moved layer's Parameters and optimizer states (the optimizer's state
        Parameters named `<state>.<parameter name>`) from the process of its old stage to every
        process; counts the bytes in `migrated_bytes`."""
        states: Dict[str, List[Parameter]] = {}
        for _, state in optimizer.parameters_and_names():
            prefix, _, pname = state.name.partition(".")
            if pname and prefix:
                states.setdefault(pname, []).append(state)
        for move in plan.moves:
            src = model.schedule.stage_to_rank[move.source_stage]
            if src == model.schedule.stage_to_rank[move.target_stage]:
                continue
            for param in model.layers.cells[move.layer].trainable_params():
                for tensor in [param] + states.get(param.name, []):
                    value = model.runtime.broadcast_values(np.ascontiguousarray(tensor.asnumpy()), src)
                    # in place: after set_data, MindSpore's optimizer kernels keep updating the old buffer
                    ops.assign(tensor, Tensor(value, dtype=tensor.dtype))
                    self.migrated_bytes += int(value.nbytes)


def _all_stage_times(model) -> Tuple[float, ...]:
    """Every stage's compute seconds of the last step, over all processes."""
    times = np.asarray(model.stage_times(), dtype=np.float64)
    if not model.in_one_process and model.world.size > 1:
        times = model.runtime.gather_values(times).sum(axis=0)
    return tuple(float(t) for t in times)

