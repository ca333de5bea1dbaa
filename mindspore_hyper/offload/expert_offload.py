"""An MoE layer's experts trained from the hot-expert cache (HyperOffload for experts).

`hyper_offload` of a model with `MoE` layers gives each layer an `ExpertOffload`: every
expert's slices of the batched weights (`w_gate`, `w_up`, `w_down`) and its optimizer states
live in a `HotExpertCache` (a tiered store whose device tier holds `capacity` experts, routing
statistics as priority hints), and the batched Parameters hold a one-element placeholder.
A training step then:

1. routes (the layer's router), and `bring`s only the experts it routed tokens to: they are
   pinned on the device tier (a cold fetch if not there) and the Parameters hold their stacked
   weights, [U, H, F] in expert order, for the forward and the backward;
2. after the backward, `apply` updates every expert with the user's optimizer, one expert at a
   time in a small workspace: the used ones with their gradient rows, the others with a zero
   gradient (so stateful optimizers such as Adam update them exactly as one optimizer over the
   whole batched Parameters would). An expert on the device tier is updated there in place
   (pinned while written, so its device copy stays valid); a cold one is read and written where
   it lives (host DRAM or disk) without coming to the device tier. Then the experts are
   unpinned and the Parameters hold the placeholder again.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mindspore_hyper.offload.expert_cache import ExpertCacheConfig, HotExpertCache

__all__ = ["ExpertOffload", "attach_expert_offloads"]


class ExpertOffload:
    """One MoE layer's experts in a hot-expert cache (see module docstring).

    Args:
        name: the layer's name in the model (messages, stats).
        moe: the `MoE` layer.
        optimizer: factory ``params -> nn.Optimizer`` (element-wise: Adam, SGD, ...), called once
            on one expert's three weights.
        config: policy, device-tier capacity in experts, routing-count decay.

    Raises:
        ValueError: a capacity larger than the layer's experts.
        NotImplementedError: experts with biases or the clamped SwiGLU (gpt-oss's).
    """

    def __init__(self, name: str, moe: nn.Cell, optimizer: Callable[[list], nn.Cell], config: ExpertCacheConfig):
        from mindspore_hyper.offload.workspace import Workspace

        experts = moe.experts
        if experts.has_bias or experts.clamp is not None:
            raise NotImplementedError(f"expert_cache for MoE layer '{name}': its experts have biases or the clamped "
                                      "SwiGLU (gpt-oss's); the offloaded expert cache holds bias-free SwiGLU experts")
        self.name, self.moe = name, moe
        self.params: List[Parameter] = [experts.w_gate, experts.w_up, experts.w_down]
        values = [p.asnumpy() for p in self.params]
        self.num_experts = values[0].shape[0]
        capacity = config.capacity if config.capacity is not None else self.num_experts
        if capacity > self.num_experts:
            raise ValueError(f"expert_cache.capacity={capacity} for MoE layer '{name}': expected at most its "
                             f"{self.num_experts} experts")
        per_expert = [[np.ascontiguousarray(v[e]) for v in values] for e in range(self.num_experts)]
        self.workspace = Workspace(per_expert[0], optimizer, f"_moe_{id(self)}")
        states = self.workspace.initial_states
        state_bytes = sum(-(-s.nbytes // 64) * 64 for s in states)  # each 64-byte aligned
        self.cache = HotExpertCache(per_expert, capacity, config.policy, config.decay,
                                    extra_bytes_per_expert=state_bytes)
        store = self.cache.store
        self.state_refs = []
        for _ in range(self.num_experts):  # every expert its own optimizer states, in host DRAM
            store.close_pack()
            self.state_refs.append([store.put(s) for s in states])
        store.close_pack()
        self.shapes = [v.shape for v in values]
        self.used: Optional[List[int]] = None  # experts brought (in the Parameters) now
        self.in_step = False
        self.steps = 0
        self.cold_per_step: List[int] = []
        self._placeholders()
        moe.expert_offload = self

    # -- a step ---------------------------------------------------------------------------
    def begin_step(self) -> None:
        """A training step's forward + backward begins (the layer may bring experts once)."""
        self._scrub()
        self.in_step = True

    def end_step(self) -> None:
        """A step ended without `apply` (its backward failed): the experts are released."""
        self._scrub()
        self.in_step = False

    def bring(self, counts: np.ndarray) -> List[int]:
        """Puts the experts with routed copies (`counts` [E] > 0) into the Parameters, stacked
        in expert order; returns them (the batched weights' rows are these experts).

        Raises:
            RuntimeError: a second call in one training step (the layer ran twice).
            ValueError: the step uses more experts than the device tier holds.
        """
        if self.in_step and self.used is not None:
            raise RuntimeError(f"MoE layer '{self.name}' ran twice in one offloaded training step: its experts "
                               "are brought once per step (call the layer once per step, or do not offload it)")
        self._scrub()
        used = [int(e) for e in np.flatnonzero(np.asarray(counts) > 0)]
        cold = self.cache.pin(used)
        try:
            rows = [self.cache.read(e) for e in used]
            for i, p in enumerate(self.params):
                stacked = np.stack([r[i] for r in rows]) if rows else np.zeros((0, *self.shapes[i][1:]), np.float32)
                p.set_data(Tensor.from_numpy(stacked), slice_shape=True)
        except BaseException:
            self.cache.unpin()
            self._placeholders()
            raise
        self.cache.observe(counts)
        self.used = used
        if self.in_step:
            self.cold_per_step.append(cold)
        return used

    def apply(self, grads: Sequence[Tensor]) -> None:
        """Updates every expert from the step's gradients of the three Parameters ([U, ...]
        rows of the brought experts; None or a mismatched shape when the layer did not run),
        then releases the experts."""
        from mindspore_hyper.offload.fence import KernelFence

        self.in_step = False
        used = self.used or []
        rows = {e: j for j, e in enumerate(used)}
        g = [None if t is None else t.asnumpy() for t in grads]
        if used and any(x is None or x.shape[0] != len(used) for x in g):
            raise ValueError(f"MoE layer '{self.name}': expected gradients with {len(used)} expert rows, got "
                             f"{[None if x is None else x.shape for x in g]}")
        ws = self.workspace
        n = len(self.params)
        targets = [*ws.params, *ws.states]
        for e in range(self.num_experts):
            held = self.cache.hold(e)  # a resident expert is updated in place on the device tier
            try:
                values = self.cache.read(e) + [self.cache.store.get(r) for r in self.state_refs[e]]
                for value, view, target in zip(values, ws.views, targets):
                    if ws.shared:
                        np.copyto(view, value)
                    else:
                        ops.assign(target, Tensor.from_numpy(value))
                for i, buf in enumerate(ws.grad_buffers):
                    if e in rows:
                        np.copyto(buf, g[i][rows[e]])
                    else:
                        buf.fill(0)
                ws.optimizer(ws.grads)
                KernelFence().wait()  # the optimizer has run: its results are in the workspace
                results = ws.results()
                self.cache.write(e, results[:n])
                for ref, value in zip(self.state_refs[e], results[n:]):
                    self.cache.store.update(ref, value)
            finally:
                if held:
                    self.cache.let_go(e)
        self.steps += 1
        self._scrub()

    # -- values ---------------------------------------------------------------------------
    def values(self) -> List[np.ndarray]:
        """The batched weights [E, ...] from the store."""
        self._scrub()
        rows = [self.cache.read(e) for e in range(self.num_experts)]
        return [np.stack([r[i] for r in rows]) for i in range(len(self.params))]

    def restore(self) -> None:
        """Puts the batched weights back into the Parameters and detaches from the layer."""
        for p, v in zip(self.params, self.values()):
            p.set_data(Tensor(v), slice_shape=True)
        self.moe.expert_offload = None

    def stats(self) -> dict:
        return {"layer": self.name, "policy": self.cache.policy, "capacity": self.cache.capacity,
                "experts": self.num_experts, "fetches": self.cache.fetches, "cold_fetches": self.cache.cold_fetches,
                "cold_per_step": list(self.cold_per_step)}

    def close(self) -> None:
        self.cache.close()

    def _scrub(self) -> None:
        if self.used is not None:
            self.cache.unpin()
            self.used = None
        self._placeholders()

    def _placeholders(self) -> None:
        for p in self.params:
            p.set_data(Tensor(np.zeros((1,), np.float32)), slice_shape=True)


def attach_expert_offloads(model: nn.Cell, optimizer: Callable[[list], nn.Cell],
                           config: Optional[ExpertCacheConfig]) -> List[ExpertOffload]:
    """An `ExpertOffload` for every `MoE` layer of `model` (config None: the context flags)."""
    from mindspore_hyper.moe.layer import MoE

    layers = [(n, c) for n, c in model.cells_and_names() if isinstance(c, MoE)]
    if not layers:
        return []
    config = config or ExpertCacheConfig.from_context()
    out = []
    try:
        for name, layer in layers:
            out.append(ExpertOffload(name, layer, optimizer, config))
    except BaseException:
        for off in out:
            off.restore()
            off.close()
        raise
    return out
