"""Which offload units hold their values in their Parameters: brought in for a use (and the
units predicted to follow), dropped after it, scrubbed once the kernels that read them have run.

Parameter.set_data on a Parameter that launched kernels still read waits (spinning) for them; on
one nothing reads (a placeholder being materialized) it does not (measured). So a used unit is
*deferred*: scrubbed at the next materialization, once the KernelFence launched behind the newest
deferred unit has passed (a wait that sleeps; then set_data has nothing to wait for). A unit is
materialized together with the units the previous step used right after it (up to half the
device tier); docs/offload.md has the measurements behind these choices.
"""
from __future__ import annotations

from collections import deque
from typing import List, Optional, Sequence

import numpy as np

from mindspore import Tensor

from mindspore_hyper.offload.device_shards import assemble
from mindspore_hyper.offload.fence import KernelFence
from mindspore_hyper.offload.offload_unit import OffloadUnit
from mindspore_hyper.offload.store import CapacityError, OffloadStore

__all__ = ["Residency"]


class Residency:
    """Brings offload units' values into their Parameters and takes them out again, following
    the previous step's order of uses to materialize the next units ahead.

    Args:
        units: the offload units.
        stores: one per device (the units' `devices` are parallel to it).
    """

    def __init__(self, units: Sequence[OffloadUnit], stores: Sequence[OffloadStore]):
        self.units = list(units)
        self.materialized_bytes = [0] * len(stores)
        self.peak_materialized = [0] * len(stores)
        # Units whose use ended but whose Parameters still hold their values (and blocks their
        # pins) until the kernels launched before their KernelFence have run; oldest first.
        self._deferred: deque = deque()
        self._ready: List[OffloadUnit] = []  # materialized ahead of their use
        # pinned parameter blocks materialized at once, per device
        self._limit = min(s.device_blocks for s in stores) // 2
        self._uses: List[OffloadUnit] = []  # units in the order this step used them
        self._trace: Optional[List[OffloadUnit]] = None  # the previous step's order
        self._pos: Optional[int] = None  # position in it (None: this step went otherwise)
        self.in_step = False  # inside value_and_grad's forward + backward

    def begin_step(self) -> None:
        """A new forward + backward: the previous step's uses become the trace to follow."""
        self._trace, self._pos, self._uses = self._uses or None, 0, []
        self.in_step = True

    def bring(self, u: OffloadUnit) -> None:
        """A use of `u` begins: its values are put into its Parameters (unless already there)."""
        u.resident_depth += 1
        if u.resident_depth > 1:
            return
        self._record_use(u)
        # Every use is one access in the prefetch trace, however it is served, so the trace is the
        # same in every step (the first one included).
        for i, r in enumerate(self._ready):
            if r is u:  # materialized ahead
                del self._ready[i]
                self._touch_params(u)
                return
        for i, (d, fence) in enumerate(self._deferred):
            if d is u:  # dropped but not scrubbed yet: its values and pins are still in place
                del self._deferred[i]
                fence.abandon()
                self._touch_params(u)
                return
        self._scrub_deferred()
        if self._ready:  # a prediction that did not come true: nothing uses them yet
            self._scrub(self._ready)
            self._ready = []
        try:
            self._materialize(u)
        except BaseException:
            u.resident_depth -= 1  # not brought: nothing to drop
            raise
        budget = self._limit - u.param_blocks
        for h in self._predicted_uses():
            if h is u or any(r is h for r in self._ready) or h.resident_depth > 0 or h.param_blocks > budget:
                break
            try:
                self._materialize(h, record=False)
            except CapacityError:  # the tier is full (e.g. activations held): h is brought when used
                break
            budget -= h.param_blocks
            self._ready.append(h)

    def drop(self, u: OffloadUnit) -> None:
        """A use of `u` ends. PyNative launches kernels asynchronously and a queued kernel reads
        the Parameter's data when it runs, so the placeholder may replace the data only once the
        kernels launched so far have run: a fence kernel marks the point and the unit is scrubbed
        once it has passed, when the next unit is materialized (instead of
        `_pynative_executor.sync()`, which busy-waits and stops Python launching the next Cell)."""
        u.resident_depth -= 1
        if u.resident_depth > 0:
            return
        self._deferred.append((u, KernelFence()))

    def scrub_all(self) -> None:
        """Takes every unit's values out of its Parameters (after their kernels have run)."""
        self._scrub_deferred()
        ready, self._ready = self._ready, []
        self._scrub(ready)

    def gather(self, u: OffloadUnit, i: int, pinned: bool) -> np.ndarray:
        """Parameter `i` of `u`, from every device's shard (one device: its whole tensor)."""
        tier = "device" if pinned else None
        if len(u.devices) == 1:
            return u.devices[0].store.get(u.devices[0].params[i], pinned_tier=tier)
        return assemble(u.shapes[i], u.devices[0].params[i].dtype,
                        ((d.shards[i].param_region, d.store.get(d.params[i], pinned_tier=tier)) for d in u.devices))

    def account(self, rank: int, delta: int) -> None:
        """Counts `delta` bytes more held on device `rank`'s tier (peak kept)."""
        self.materialized_bytes[rank] += delta
        self.peak_materialized[rank] = max(self.peak_materialized[rank], self.materialized_bytes[rank])

    def _touch_params(self, u: OffloadUnit) -> None:
        for dev in u.devices:
            dev.store.touch(dev.param_blocks)

    def _materialize(self, u: OffloadUnit, record: bool = True) -> None:
        """Pins the unit's parameter blocks on every device's tier and puts the values into its
        Parameters (one device: its tensors; simulation: the global tensors its shards form)."""
        acquired = []
        try:
            for dev in u.devices:
                dev.store.acquire(dev.param_blocks, record=record)
                acquired.append(dev)
            for i, p in enumerate(u.params):
                p.set_data(Tensor.from_numpy(self.gather(u, i, pinned=True)), slice_shape=True)
        except BaseException:
            for i, p in enumerate(u.params):
                p.set_data(u.placeholder(i), slice_shape=True)
            for dev in acquired:
                dev.store.release(dev.param_blocks)
            raise
        for rank, dev in enumerate(u.devices):
            self.account(rank, dev.param_bytes)

    def _record_use(self, u: OffloadUnit) -> None:
        if not self.in_step:
            return
        self._uses.append(u)
        if self._trace is not None and self._pos is not None:
            t = self._trace
            self._pos = self._pos + 1 if self._pos < len(t) and t[self._pos] is u else None

    def _predicted_uses(self) -> List[OffloadUnit]:
        """The units the previous step used after the current point (if it has gone alike)."""
        if not self.in_step or self._trace is None or self._pos is None:
            return []
        return self._trace[self._pos:]

    def _scrub_deferred(self) -> None:
        """Scrubs and releases the deferred units once their fences have passed (then no launched
        kernel is left for set_data to spin on)."""
        if not self._deferred:
            return
        for _, fence in self._deferred:  # in launch order: once the newest has passed, all have
            fence.wait()
        units = [u for u, _ in self._deferred]
        self._deferred.clear()
        self._scrub(units)

    def _scrub(self, units) -> None:
        error = None
        for u in units:
            try:
                for i, p in enumerate(u.params):
                    p.set_data(u.placeholder(i), slice_shape=True)
            except BaseException as e:  # still release every unit's pins; report the first error
                error = error or e
            for rank, dev in enumerate(u.devices):
                self.account(rank, -dev.param_bytes)
                dev.store.release(dev.param_blocks)
        if error is not None:
            raise error
