"""The device mesh of a YAML parallel config: declared (`device_matrix`, `alias_names`,
`device_num`) or inferred from the module strategies and the device count.

An inferred mesh is ("data", <the aliases the strategies split, in order>, <pipeline axis>): each
split alias sized by its largest split count, the pipeline axis by the stage count, and the data
axis takes the devices left (`device_num`, or the context's device count, at least the highest
group rank + 1).
"""
from __future__ import annotations

import math
from typing import Dict, List, Tuple

from mindspore_hyper.shard.layout import Layout
from mindspore_hyper.strategy.process_groups import ConfigError, DeviceGroup

__all__ = ["config_mesh", "DEFAULT_ALIASES"]

DEFAULT_ALIASES = ("data", "tensor", "pipeline")  # of a 3-axis device_matrix without alias_names


def config_mesh(pc: dict, raw_modules: List[dict], groups: List[DeviceGroup],
                pipeline_axis: str) -> Tuple[Layout, bool, str]:
    """The mesh of `parallel_config` mapping `pc`.

    Args:
        pc: the `parallel_config` mapping (keys checked).
        raw_modules: the parsed `module_level` entries ("kind" "spmd" with "splits" and
            "pipeline", or "mpmd").
        groups: the device groups (their highest rank bounds an inferred mesh).
        pipeline_axis: the alias of the pipeline axis.

    Returns:
        (mesh, whether it was inferred, how the mesh reads in error messages).

    Raises:
        ConfigError: naming the field (device_num, device_matrix, alias_names, a module's
            pipeline) and what was expected.
    """
    device_num = pc.get("device_num")
    if device_num is not None and (isinstance(device_num, bool) or not isinstance(device_num, int)
                                   or device_num <= 0):
        raise ConfigError("parallel_config.device_num", f"{device_num!r}; expected a positive int")
    has_dm, has_alias = "device_matrix" in pc, "alias_names" in pc
    if has_dm or has_alias:
        if not has_dm:
            raise ConfigError("parallel_config.device_matrix", "missing; alias_names needs a device_matrix")
        dm = pc["device_matrix"]
        aliases = pc.get("alias_names")
        if aliases is None:
            if isinstance(dm, (list, tuple)) and len(dm) == len(DEFAULT_ALIASES):
                aliases = DEFAULT_ALIASES
            else:
                raise ConfigError("parallel_config.alias_names", "missing; give one alias per device_matrix axis")
        try:
            mesh = Layout(list(dm) if isinstance(dm, (list, tuple)) else dm,
                          list(aliases) if isinstance(aliases, (list, tuple)) else aliases)
        except ValueError as exc:
            key = "alias_names" if "alias" in str(exc) else "device_matrix"
            raise ConfigError(f"parallel_config.{key}", str(exc)) from None
        if device_num is not None and device_num != mesh.size:
            raise ConfigError("parallel_config.device_num", f"{device_num} but device_matrix "
                                                            f"{mesh.device_matrix} has {mesh.size} devices")
        return mesh, False, f"device_matrix {mesh.device_matrix}"
    # Inferred mesh: ("data", <aliases named by the strategies in order>, pipeline).
    sizes: Dict[str, int] = {}
    stages = None
    for m in raw_modules:
        if m["kind"] != "spmd":
            continue
        for alias, counts in m["splits"].items():
            if alias != "data":
                sizes[alias] = max(sizes.get(alias, 1), max(counts) if counts else 1)
        if m["pipeline"] is not None:
            if stages is not None and m["pipeline"] != stages:
                raise ConfigError(f"{m['path']}.strategy.pipeline", f"{m['pipeline']} stages, but an earlier entry "
                                                                   f"asks for {stages}; the model has one pipeline")
            stages = m["pipeline"]
    if stages is not None:
        if pipeline_axis in sizes and sizes[pipeline_axis] > 1:
            raise ConfigError("parallel_config.module_level", f"axis {pipeline_axis!r} is both split by a strategy "
                                                              "and used for pipeline stages")
        sizes[pipeline_axis] = stages
    if device_num is not None:
        world, where = device_num, "parallel_config.device_num"
        text = f"device_num {device_num}"
    else:
        from mindspore_hyper.context import get_context

        highest = max((g.ranks[-1] for g in groups if g.ranks), default=-1)
        world = max(int(get_context("device_num")), highest + 1)
        where, text = "parallel_config", f"the device count {world} (context device_num or the highest rank + 1)"
    others = math.prod(sizes.values())
    if world % others:
        raise ConfigError(where, f"the strategies need {others} devices per data-parallel replica "
                                 f"({dict(sizes)}), which does not divide {text}")
    mesh = Layout([world // others] + list(sizes.values()), ["data"] + list(sizes))
    return mesh, True, f"the inferred mesh {mesh.device_matrix}{mesh.alias_names} ({text})"
