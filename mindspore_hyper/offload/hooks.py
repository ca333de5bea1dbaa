"""The hooks that tell `Residency` when an offload unit is used: its Cell's forward, and the
backward of each of its calls. They also record the step's order of uses (`forward_uses`,
`backward_uses`: unit names), which the report compares with the dry run's model of the backward
(the forward's uses in reverse: `offload/backward_order.py`)."""
from __future__ import annotations

from typing import Callable, List, Sequence

from mindspore import Parameter, Tensor, nn
from mindspore.graph.api import _pynative_executor

from mindspore_hyper.offload.offload_unit import OffloadUnit
from mindspore_hyper.offload.residency import Residency

__all__ = ["UseHooks", "watch_cell_backward"]


def watch_cell_backward(cell: nn.Cell, before: Callable[[], None], after: Callable[[], None]) -> List:
    """Registers MindSpore's Cell backward hooks on `cell`: `before()` as its backward starts,
    `after()` once it is done.

    Each call of the Cell then runs MindSpore's `CellBackwardHook` op over its Tensor inputs
    (the backward hook's) and twice over its Tensor outputs (the backward hook's, then the
    backward pre-hook's): identity ops whose outputs are new tensors of the inputs' and outputs'
    shapes, made in the forward. The simulation counts them as activations like every tensor a
    training forward makes; a dry run registers the same hooks so it makes and counts the same
    tensors (`dry_run_offload.py`). On a device each is a view of its input (MindSpore 2.10),
    sharing its storage unless that input is itself a view, which is copied (the second wrap of
    an output always is): counting every wrap is an upper bound by the first wraps of non-views.

    Args:
        cell: the Cell to watch.
        before: called when the backward of a call of `cell` starts.
        after: called when it is done.

    Returns:
        The two hook handles (`remove()` each to unregister).
    """
    return [cell.register_backward_pre_hook(lambda c, grad_output: before()),
            cell.register_backward_hook(lambda c, grad_input, grad_output: after())]


def _flat_tensors(obj):
    """The Tensors in a (nested) tuple/list."""
    if isinstance(obj, Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _flat_tensors(o)


class UseHooks:
    """Brings a unit's parameters for each forward and backward use of its Cell, drops them after.

    Args:
        units: the offload units.
        residency: what brings and drops them.
        cell_backward_hooks: track backward uses with MindSpore's Cell backward hooks from the
            start (a SimulatedModel: DTensors between Cells take no tensor hooks).
    """

    def __init__(self, units: Sequence[OffloadUnit], residency: Residency, cell_backward_hooks: bool):
        self.units = list(units)
        self.residency = residency
        self.handles = []  # removed by `remove`
        self._tensor_hooks = []  # this step's hooks on Cell inputs/outputs (removed after backward)
        self.forward_uses: List[str] = []  # this step's uses (unit names, in order; see `begin_step`)
        self.backward_uses: List[str] = []
        for u in self.units:
            self.handles.append(u.cell.register_forward_pre_hook(self._make_bring(u)))
            self.handles.append(u.cell.register_forward_hook(self._make_drop(u)))
            if cell_backward_hooks:
                self._use_cell_backward_hooks(u)

    def remove(self) -> None:
        """Removes every hook."""
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def begin_step(self) -> None:
        """A new forward + backward: the recorded uses start again."""
        self.forward_uses, self.backward_uses = [], []

    def end_backward(self) -> None:
        """After backward: every unit's use is over (also those whose inputs got no gradient)."""
        hooks, self._tensor_hooks = self._tensor_hooks, []
        for h in hooks:
            h.remove()
        for u in self.units:
            if u.resident_depth > 0:
                u.resident_depth = 1
                self.residency.drop(u)
        self.residency.scrub_all()

    def _make_bring(self, u: OffloadUnit):
        def hook(cell, inputs):
            if self.residency.in_step:
                self.forward_uses.append(u.name)
            self.residency.bring(u)
        return hook

    def _backward_bring(self, u: OffloadUnit) -> None:
        self.backward_uses.append(u.name)
        self.residency.bring(u)

    def _make_drop(self, u: OffloadUnit):
        def hook(cell, inputs, output):
            self.residency.drop(u)
            if _pynative_executor.requires_grad() and not u.cell_backward_hooks:
                if not self._hook_backward_use(u, inputs, output):
                    self._use_cell_backward_hooks(u)
        return hook

    def _hook_backward_use(self, u: OffloadUnit, inputs, output) -> bool:
        """Brings the unit's parameters back for this call's backward and drops them after it.

        Tensor hooks instead of Cell backward (pre-)hooks: the first gradient reaching one of the
        call's outputs brings the parameters (before MindSpore launches the Cell's backward, as a
        backward pre-hook would), and the gradients of all its (non-Parameter) Tensor inputs
        being complete drops them (as a backward hook would). MindSpore's Cell backward hooks
        wrap inputs and outputs in CellBackwardHook ops (views, copies of views: see
        `watch_cell_backward`) that wait for the forward pipeline; measured on this model they
        cost more than the offloading's own work. A call
        whose inputs get no gradient (e.g. the first layer's data) is dropped when the backward
        ends (`end_backward`). False if no output takes a hook."""
        outs = list(_flat_tensors(output))
        if not outs:
            return True
        ins = [t for t in _flat_tensors(inputs) if not isinstance(t, Parameter)]
        use = {"brought": False, "left": len(ins)}

        def on_output_grad(grad):
            if not use["brought"]:
                use["brought"] = True
                self._backward_bring(u)

        def on_input_grad(grad):
            use["left"] -= 1
            if use["left"] == 0 and use["brought"]:
                use["brought"] = False
                self.residency.drop(u)

        hooked = 0
        for t in outs:
            try:
                self._tensor_hooks.append(t.register_hook(on_output_grad))
                hooked += 1
            except RuntimeError:  # a Tensor outside autograd (e.g. a DTensor of the simulation)
                pass
        if not hooked:
            return False
        for t in ins:
            try:
                self._tensor_hooks.append(t.register_hook(on_input_grad))
            except RuntimeError:
                use["left"] -= 1  # gets no gradient: dropped when the backward ends
        return True

    def _use_cell_backward_hooks(self, u: OffloadUnit) -> None:
        """MindSpore's Cell backward hooks, for a Cell whose call's outputs take no tensor hooks
        (the simulation passes DTensors between Cells; their shards carry the autograd): from the
        start for a SimulatedModel, else from the first such call on. Registered from the forward
        hook, the pre-hook already wraps this call's output; the inputs were not wrapped, so this
        call's use ends with the backward."""
        u.cell_backward_hooks = True
        self.handles += watch_cell_backward(u.cell, lambda: self._backward_bring(u), lambda: self.residency.drop(u))

