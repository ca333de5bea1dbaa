"""Which part of each offloaded parameter each device's store holds.

Single device: one device holding every tensor whole. In simulation mode each virtual device
holds its parameter shard (the parameter's layout) and updates the part of it its optimizer
states cover (the optimizer layout: with ZeRO-1 a slice of the shard along the data axis), as a
real device of the cluster would.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

Region = Tuple[slice, ...]

__all__ = ["DeviceShard", "single_device", "from_strategy_rows", "local_region", "assemble"]


@dataclass(frozen=True)
class DeviceShard:
    """One device's part of a global parameter, in global coordinates.

    Attributes:
        rank: the device.
        param_region: the parameter shard the device keeps.
        update_region: the part it updates (a sub-region of `param_region`); its gradient and
            optimizer states have this shape.
    """

    rank: int
    param_region: Region
    update_region: Region

    def update_in_param(self) -> Region:
        """`update_region` relative to the device's parameter shard."""
        return local_region(self.update_region, self.param_region)

    def update_of_shard(self, shard_value: np.ndarray) -> np.ndarray:
        """The part of the device's parameter shard it updates (C-contiguous; the shard itself
        when it updates all of it)."""
        if self.update_region == self.param_region:
            return shard_value
        return np.ascontiguousarray(shard_value[self.update_in_param()])

    def update_of_global(self, value: np.ndarray) -> np.ndarray:
        """The part of a global tensor (e.g. the reduced gradient) the device updates
        (C-contiguous; no copy when that is all of a contiguous tensor)."""
        return np.require(value[(*self.update_region, ...)], requirements="C")


def local_region(inner: Region, outer: Region) -> Region:
    """`inner` (global coordinates) relative to the start of `outer`, which contains it."""
    return tuple(slice(i.start - o.start, i.stop - o.start) for i, o in zip(inner, outer))


def single_device(shape: Sequence[int]) -> List[DeviceShard]:
    """Device 0 holds and updates the whole tensor."""
    whole = tuple(slice(0, int(n)) for n in shape)
    return [DeviceShard(0, whole, whole)]


def from_strategy_rows(rows: Dict[int, object], device_num: int) -> Dict[int, List[DeviceShard]]:
    """Per parameter id, every device's shard, from the simulation's resolved strategy rows
    (`ParamRow`: `layout`, `optimizer_layout`, `global_shape`)."""
    out = {}
    for pid, row in rows.items():
        shape = tuple(row.global_shape)
        shards = []
        for r in range(device_num):
            param, update = row.layout.rank_slices(r, shape), row.optimizer_layout.rank_slices(r, shape)
            if any(u.start < p.start or u.stop > p.stop for u, p in zip(update, param)):
                raise ValueError(f"parameter '{row.name}': device {r}'s optimizer-state slice {update} is not "
                                 f"inside its parameter shard {param}; an optimizer layout must refine the "
                                 f"parameter layout (add axes after the parameter's own)")
            shards.append(DeviceShard(r, param, update))
        out[pid] = shards
    return out


def assemble(shape: Sequence[int], dtype, pieces) -> np.ndarray:
    """The global array from (region, array) pieces that together cover it."""
    out = np.empty(tuple(shape), dtype=dtype)
    for region, value in pieces:
        out[region] = value
    return out
