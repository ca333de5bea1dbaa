"""Activations saved for backward inside chosen Cells go to the store (``ms.saved_tensors_hooks``)
and come back, prefetched in the order the trace shows, when backward needs them."""
from __future__ import annotations

import fnmatch
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import mindspore as ms
from mindspore import Parameter, Tensor, nn

from mindspore_hyper.offload.offload_unit import OffloadPolicy
from mindspore_hyper.offload.residency import Residency
from mindspore_hyper.offload.store import CapacityError, OffloadStore, TensorRef

__all__ = ["ActivationSwap"]


class ActivationSwap:
    """Swaps the activations saved inside the policy's `activation_cells` through the stores.

    Args:
        model: the network.
        policy: which Cells (`activation_cells`) and from what size (`min_activation_bytes`).
        stores: one per device.
        residency: scrubbed to make room when an activation cannot come back otherwise.
        running_ranks: in simulation, the devices the current op runs for (None: all).
    """

    def __init__(self, model: nn.Cell, policy: OffloadPolicy, stores: Sequence[OffloadStore],
                 residency: Residency, running_ranks: Callable[[], Optional[List[int]]]):
        self.policy = policy
        self.stores = list(stores)
        self.residency = residency
        self._running_ranks = running_ranks
        # A stable slot per (cell, index in the step), per holding device: the same blocks every
        # step, so the prefetch trace stays valid.
        self.refs: Dict[Tuple[str, int], Dict[int, TensorRef]] = {}
        self._counter: Dict[str, int] = {}
        self._contexts = []
        self.handles = []
        for name, cell in model.cells_and_names():
            if name and any(fnmatch.fnmatchcase(name, p) for p in policy.activation_cells):
                self.handles.append(cell.register_forward_pre_hook(self._make_enter(name)))
                self.handles.append(cell.register_forward_hook(self._make_exit(name)))

    def begin_step(self) -> None:
        """A new step: activations are numbered from 0 again."""
        self._counter.clear()

    def remove(self) -> None:
        """Removes every hook."""
        for h in self.handles:
            h.remove()
        self.handles.clear()

    def _make_enter(self, name: str):
        def hook(cell, inputs):
            ctx = ms.saved_tensors_hooks(self._make_pack(name), self._unpack)
            ctx.__enter__()
            self._contexts.append(ctx)
        return hook

    def _make_exit(self, name: str):
        def hook(cell, inputs, output):
            self._contexts.pop().__exit__(None, None, None)
        return hook

    def _holders(self) -> List[int]:
        """The devices holding the activation being saved: in simulation, the devices the op
        producing it runs for (its replicas each keep a copy); otherwise device 0."""
        if len(self.stores) == 1:
            return [0]
        return self._running_ranks() or list(range(len(self.stores)))

    def _make_pack(self, name: str):
        def pack(tensor):
            if isinstance(tensor, Parameter) or not isinstance(tensor, Tensor):
                return ("keep", tensor)
            array = tensor.asnumpy()
            if array.nbytes < self.policy.min_activation_bytes or array.nbytes == 0:
                return ("keep", tensor)
            index = self._counter.get(name, 0)
            self._counter[name] = index + 1
            slots = self.refs.setdefault((name, index), {})
            ranks = self._holders()
            for rank in ranks:
                store, ref = self.stores[rank], slots.get(rank)
                if ref is not None and (ref.shape != array.shape or ref.dtype != array.dtype):
                    store.erase(ref)
                    ref = None
                if ref is None:
                    slots[rank] = store.put(array)
                else:
                    store.update(ref, array)
            return ("store", [(self.stores[r], slots[r]) for r in ranks])
        return pack

    def _unpack(self, packed):
        kind, obj = packed
        if kind == "keep":
            return obj
        held = []
        try:
            for store, ref in obj:  # every holder brings its copy back to its device tier
                try:
                    store.acquire(ref.blocks)
                except CapacityError:  # parameters kept in place for later (deferred, ready) hold the tier
                    self.residency.scrub_all()
                    store.acquire(ref.blocks)
                held.append((store, ref))
            store, ref = obj[0]
            return Tensor.from_numpy(store.get(ref, pinned_tier="device"))
        finally:
            for store, ref in held:
                store.release(ref.blocks)
