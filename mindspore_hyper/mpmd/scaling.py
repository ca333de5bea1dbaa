"""Shrink a config's device groups to fewer devices, keeping their proportions (CPU-sized runs).

The seed's multimodal config names 193 devices; `scale_groups(config, 7)` gives the same three
groups on 7 devices (text_encoder 4, vision_encoder 2, fusion_layer 1) so the same program runs
in simulation on a laptop.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.strategy.config import ParallelConfig

__all__ = ["scale_groups", "for_processes"]


def scale_groups(config: ParallelConfig, device_num: int) -> ParallelConfig:
    """The config with its groups on `device_num` devices: each group keeps at least one device,
    the rest are shared in proportion to the groups' sizes (largest remainders), and groups get
    consecutive ranks in config order. The mesh becomes data parallel over `device_num`.

    Raises:
        ValueError: no groups, or `device_num` smaller than the number of groups.
    """
    groups = config.groups
    if not groups:
        raise ValueError("scale_groups: the config has no device groups")
    if isinstance(device_num, bool) or not isinstance(device_num, int) or device_num < len(groups):
        raise ValueError(f"device_num={device_num!r}: expected an int >= the number of groups ({len(groups)})")
    total = sum(g.size for g in groups)
    spare = device_num - len(groups)
    exact = [spare * g.size / total for g in groups]
    sizes = [1 + math.floor(e) for e in exact]
    left = device_num - sum(sizes)
    for i in sorted(range(len(groups)), key=lambda i: exact[i] - math.floor(exact[i]), reverse=True)[:left]:
        sizes[i] += 1
    scaled, first = [], 0
    for group, size in zip(groups, sizes):
        scaled.append(replace(group, ranks=tuple(range(first, first + size))))
        first += size
    return replace(config, groups=scaled, mesh=Layout([device_num], ["data"]), mesh_inferred=True,
                   data_axis="data")


def for_processes(config: ParallelConfig, processes: int, hardware: str = "CPU",
                  scheduler: Optional[str] = "static") -> ParallelConfig:
    """The config's groups on `processes` msrun processes of this host: `scale_groups`, then
    every group on `hardware`, and ZeRO-1 off (refused inside groups under msrun).

    Args:
        config: a config with device groups.
        processes: the msrun process count.
        hardware: what the processes run on ("NPU", "GPU" or "CPU").
        scheduler: every group's scheduler: "static" (MPMDModel under msrun refuses device moves),
            "dynamic" (PPOTrainer under msrun moves microbatch shares), or None to keep the config's.

    Raises:
        ValueError: as scale_groups; a bad `hardware` or `scheduler`.
    """
    if hardware not in ("NPU", "GPU", "CPU"):
        raise ValueError(f"hardware={hardware!r}: expected 'NPU', 'GPU' or 'CPU'")
    if scheduler not in ("static", "dynamic", None):
        raise ValueError(f"scheduler={scheduler!r}: expected 'static', 'dynamic' or None")
    scaled = scale_groups(config, processes)
    groups = [replace(g, hardware=hardware, scheduler=scheduler or g.scheduler) for g in scaled.groups]
    return replace(scaled, groups=groups, optimizer_sharding=None, scheduler=scheduler or scaled.scheduler)
