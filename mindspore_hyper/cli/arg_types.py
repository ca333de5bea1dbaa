"""argparse value types: each parses one flag's text or raises ArgumentTypeError saying what is expected."""
from __future__ import annotations

import argparse
import json
from typing import Any, Dict, List

from mindspore_hyper.context import parse_bytes

__all__ = ["positive_int", "nonnegative_int", "byte_size", "is_terminal", "json_object", "int_list", "size_list"]


def _int_at_least(low: int, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= {low}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected an int >= {low}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An int >= 1."""
    return _int_at_least(1, text)


def nonnegative_int(text: str) -> int:
    """An int >= 0."""
    return _int_at_least(0, text)


def is_terminal(stream) -> bool:
    """Whether `stream` is a terminal: progress bars go there only, never into piped or captured output."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def byte_size(text: str) -> int:
    """A byte count: 1048576, 512MiB, 64GiB, 4KiB (binary) or 64GB (decimal, 10^9), as the context flags."""
    try:
        value = parse_bytes(text.strip(), "size")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a byte size such as 512MiB, 64GiB (binary), 64GB (decimal, "
                                         f"10^9 bytes) or 1048576, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a byte size >= 1, got {text!r}")
    return value


def json_object(text: str) -> Dict[str, Any]:
    """A JSON object, e.g. '{"hidden": 64, "layers": 2}'."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"hidden\": 64}}': {exc.msg}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"hidden\": 64}}', got {text!r}")
    return value


def int_list(text: str) -> List[int]:
    """Comma-separated ints >= 0, e.g. 2,4,8."""
    try:
        return [nonnegative_int(part) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints >= 0 such as 2,4,8, got {text!r}") from None


def size_list(text: str) -> List[int]:
    """Comma-separated sizes, e.g. 4K,8K,16K or 32MB,64MB (K/M/G = binary multiples); or
    FIRST:LAST for the doubling series from FIRST to LAST, e.g. 4K:128K."""
    try:
        if ":" in text:
            first, last = (_size(part) for part in text.split(":"))
            if last < first:
                raise ValueError
            values = [first]
            while values[-1] * 2 <= last:
                values.append(values[-1] * 2)
            return values
        return [_size(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated sizes such as 4K,8K,16K or a doubling range "
                                         f"such as 4K:128K, got {text!r}") from None


def _size(text: str) -> int:
    text = text.strip().upper()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1:] in units:
        return int(text[:-1]) * units[text[-1]]
    value = parse_bytes(text, "size")
    if value < 1:
        raise ValueError(text)
    return value
