"""Device groups: rank ranges such as `[0-127]`, and the named groups of a multimodal/MPMD config.

A device group is a set of global ranks that runs its own program (HyperMPMD): a multimodal
encoder (`process_groups:` in YAML) or a `module_level` entry with `strategy: mpmd`. Groups
never share a rank. Parsing reports errors as `ConfigError` naming the YAML path.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["ConfigError", "DeviceGroup", "parse_ranks", "parse_process_groups", "check_disjoint",
           "check_within", "HARDWARE", "SCHEDULERS"]

HARDWARE = ("NPU", "GPU", "CPU")
SCHEDULERS = ("static", "dynamic")
GROUP_KEYS = ("ranks", "hardware", "batch_size", "scheduler", "modules")

_RANGE_RE = re.compile(r"^\s*(-?\d+)\s*-\s*(-?\d+)\s*$")


class ConfigError(ValueError):
    """A bad field in a parallel config; `path` is the YAML path of the field.

    Args:
        path: the field's YAML path, e.g. "parallel_config.module_level[1].devices".
        message: what is wrong and what was expected.
    """

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(f"{path}: {message}")


@dataclass(frozen=True)
class DeviceGroup:
    """A named set of ranks running its own program.

    Attributes:
        name: the group name (a process_groups key, or the module pattern of an mpmd entry).
        ranks: the global ranks, ascending.
        modules: Cell-name pattern (fnmatch) of the modules this group runs.
        path: YAML path of the group's definition, e.g. "process_groups.text_encoder" or
            "parallel_config.module_level[1]" (used in messages).
        hardware: "NPU", "GPU" or "CPU".
        batch_size: the group's batch size, if given.
        scheduler: "static" or "dynamic" (load rebalancing between groups).
        kind: "process_group" or "mpmd".
    """

    name: str
    ranks: Tuple[int, ...]
    modules: str
    path: str
    hardware: str = "NPU"
    batch_size: Optional[int] = None
    scheduler: str = "static"
    kind: str = "process_group"

    @property
    def ranks_path(self) -> str:
        """YAML path of the ranks field ("...devices" for an mpmd entry, "...ranks" for a process group)."""
        return f"{self.path}.devices" if self.kind == "mpmd" else f"{self.path}.ranks"

    @property
    def size(self) -> int:
        return len(self.ranks)

    def to_dict(self) -> dict:
        return {"name": self.name, "ranks": list(self.ranks), "modules": self.modules, "hardware": self.hardware,
                "batch_size": self.batch_size, "scheduler": self.scheduler, "kind": self.kind}


def parse_ranks(value: Any, path: str) -> Tuple[int, ...]:
    """Parse a rank specification into sorted, unique ranks.

    Accepted: an int (`192`), a range string (`"0-127"`, `"[0-127]"`), or a list mixing both
    (`[0-63]` in YAML is a list holding the string "0-63"; `[0, 2, 4-7]`). Ranges are inclusive.

    Args:
        value: the YAML value.
        path: YAML path for error messages.

    Raises:
        ConfigError: a non-integer, a negative rank, a reversed range like "64-0", a repeated rank
            or an empty specification.
    """
    items = value if isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ConfigError(path, "empty rank list; expected ranks like [0-63] or a single int")
    ranks: List[int] = []
    for i, item in enumerate(items):
        where = f"{path}[{i}]" if isinstance(value, (list, tuple)) else path
        ranks.extend(_parse_rank_item(item, where))
    if len(set(ranks)) != len(ranks):
        twice = sorted({r for r in ranks if ranks.count(r) > 1})
        raise ConfigError(path, f"rank {twice[0]} listed more than once")
    return tuple(sorted(ranks))


def _parse_rank_item(item: Any, path: str) -> List[int]:
    if isinstance(item, bool):
        raise ConfigError(path, f"{item!r} is not a rank; expected an int or a range like '0-63'")
    if isinstance(item, int):
        if item < 0:
            raise ConfigError(path, f"rank {item} is negative")
        return [item]
    if isinstance(item, str):
        text = item.strip()
        if text.startswith("[") and text.endswith("]"):
            text = text[1:-1]
        parts = [p for p in text.split(",")] if "," in text else [text]
        out: List[int] = []
        for part in parts:
            part = part.strip()
            if re.fullmatch(r"\d+", part):
                out.append(int(part))
                continue
            match = _RANGE_RE.match(part)
            if not match:
                raise ConfigError(path, f"{item!r} is not a rank or a range; expected an int or 'first-last' "
                                        "such as '0-63'")
            first, last = int(match.group(1)), int(match.group(2))
            if first < 0 or last < 0:
                raise ConfigError(path, f"range {item!r} has a negative rank")
            if first > last:
                raise ConfigError(path, f"range {item!r} is reversed: first rank {first} > last rank {last}")
            out.extend(range(first, last + 1))
        return out
    raise ConfigError(path, f"{item!r} is not a rank; expected an int or a range like '0-63'")


def check_disjoint(groups: Sequence[DeviceGroup]) -> None:
    """Raise ConfigError (naming the later group's path) when two groups share a rank."""
    owner: Dict[int, DeviceGroup] = {}
    for group in groups:
        for rank in group.ranks:
            if rank in owner:
                other = owner[rank]
                raise ConfigError(
                    group.ranks_path, f"ranks overlap with {other.ranks_path} (group {other.name!r}): rank {rank} is in both; "
                                "device groups must be disjoint")
        for rank in group.ranks:
            owner[rank] = group


def check_within(group: DeviceGroup, world: int, mesh_text: str) -> None:
    """Raise ConfigError when the group names a rank outside range(world)."""
    if group.ranks and group.ranks[-1] >= world:
        raise ConfigError(group.ranks_path, f"rank {group.ranks[-1]} is outside the mesh: {mesh_text} has {world} devices "
                                      f"(ranks 0-{world - 1})")


def parse_process_groups(raw: Any, default_scheduler: str, path: str = "process_groups") -> List[DeviceGroup]:
    """Parse the `process_groups:` mapping of the multimodal example.

    Each entry: `name: {ranks: [0-127], hardware: NPU, batch_size: 32, scheduler: dynamic,
    modules: text_encoder*}`; `ranks` is required, `modules` defaults to the group name and
    `scheduler` to the top-level `scheduler`.

    Raises:
        ConfigError: unknown keys, bad values, bad ranks, or overlapping groups.
    """
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(path, "expected a mapping of group name -> {ranks, hardware, batch_size, scheduler}")
    groups = []
    for name, body in raw.items():
        where = f"{path}.{name}"
        if not isinstance(name, str) or not name:
            raise ConfigError(where, "a group name must be a non-empty string")
        if not isinstance(body, dict):
            raise ConfigError(where, f"expected a mapping with keys {GROUP_KEYS}, got {body!r} (a top-level "
                                     "'scheduler:' belongs next to process_groups, not inside it)")
        unknown = [k for k in body if k not in GROUP_KEYS]
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}", f"unknown key; expected one of {GROUP_KEYS}")
        if "ranks" not in body:
            raise ConfigError(f"{where}.ranks", "missing; expected ranks like [0-127] or a single int")
        ranks = parse_ranks(body["ranks"], f"{where}.ranks")
        hardware = body.get("hardware", "NPU")
        if hardware not in HARDWARE:
            raise ConfigError(f"{where}.hardware", f"{hardware!r}; expected one of {HARDWARE}")
        batch_size = body.get("batch_size")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size <= 0):
            raise ConfigError(f"{where}.batch_size", f"{batch_size!r}; expected a positive int")
        scheduler = body.get("scheduler", default_scheduler)
        if scheduler not in SCHEDULERS:
            raise ConfigError(f"{where}.scheduler", f"{scheduler!r}; expected one of {SCHEDULERS}")
        modules = body.get("modules", name)
        if not isinstance(modules, str) or not modules:
            raise ConfigError(f"{where}.modules", f"{modules!r}; expected a Cell-name pattern such as 'text_encoder*'")
        groups.append(DeviceGroup(name=name, ranks=ranks, modules=modules, path=where, hardware=hardware,
                                  batch_size=batch_size, scheduler=scheduler, kind="process_group"))
    check_disjoint(groups)
    return groups
