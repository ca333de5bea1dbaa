"""Record: copy-with-changes and mapping round trips for the estimator's frozen dataclasses."""
from __future__ import annotations

from dataclasses import asdict, fields, replace
from typing import Any, Dict, Type, TypeVar

T = TypeVar("T", bound="Record")


class Record:
    """Mixin for frozen dataclasses whose __post_init__ validates every field."""

    def with_(self: T, **changes: Any) -> T:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls: Type[T], values: Dict[str, Any], where: str) -> T:
        """Build from a mapping (a YAML section); an unknown key is an error naming `where`.key."""
        known = {f.name for f in fields(cls)}
        unknown = [k for k in values if k not in known]
        if unknown:
            raise ValueError(f"{where}.{unknown[0]}: unknown key; expected one of {', '.join(sorted(known))}")
        return cls(**values)
