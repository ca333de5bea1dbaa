"""Argument checks shared by the estimator's value types (messages name the field)."""
from __future__ import annotations

from typing import Any, Sequence


def check_int(name: str, value: Any, low: int) -> None:
    """Raise ValueError unless `value` is an int (not a bool) >= `low`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r}: expected an int >= {low}")


def check_choice(name: str, value: Any, choices: Sequence) -> None:
    """Raise ValueError unless `value` is one of `choices`."""
    if value not in choices:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(map(repr, choices))}")


def check_bool(name: str, value: Any) -> None:
    """Raise ValueError unless `value` is a bool."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r}: expected a bool")
