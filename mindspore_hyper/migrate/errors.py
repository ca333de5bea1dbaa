"""Errors of the PyTorch -> MindSpore migration: each names what failed and where."""
from __future__ import annotations

from typing import List, Sequence

__all__ = ["MigrationError", "UnsupportedOpError", "StateDictMismatchError", "TraceFailedError",
           "CustomBackwardError"]


class MigrationError(Exception):
    """Base class of every migration error."""


class TraceFailedError(MigrationError):
    """Neither torch.fx nor torch.export could trace the model (both reasons are in the message)."""


class CustomBackwardError(MigrationError):
    """A torch.autograd.Function with its own backward gives other gradients than the converted Cell (which
    differentiates the Function's forward): the message names the Function, where it ran and the difference."""


class UnsupportedOpError(MigrationError):
    """Torch ops or modules without a MindSpore mapping; nothing is dropped silently.

    Attributes:
        problems: one line per unsupported op: what it is, why, and where in the torch source.
        report: the ConversionReport built so far (every mapping that did succeed).
    """

    def __init__(self, problems: Sequence[str], report=None):
        self.problems: List[str] = list(problems)
        self.report = report
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} torch op(s) cannot be converted to MindSpore:\n{lines}")


class StateDictMismatchError(MigrationError):
    """A state_dict does not fit a Cell: every unplaced entry, shape mismatch and missing parameter.

    Attributes:
        unplaced: torch names with no Cell parameter to go to (and the names tried).
        mismatched: torch name -> Cell name pairs whose shapes differ beyond the layout rules.
        missing: Cell parameters no torch entry fills.
    """

    def __init__(self, unplaced: Sequence[str], mismatched: Sequence[str], missing: Sequence[str]):
        self.unplaced, self.mismatched, self.missing = list(unplaced), list(mismatched), list(missing)
        parts = []
        if self.unplaced:
            parts.append("torch entries with no Cell parameter:\n" + "\n".join(f"  - {u}" for u in self.unplaced))
        if self.mismatched:
            parts.append("shape mismatches:\n" + "\n".join(f"  - {m}" for m in self.mismatched))
        if self.missing:
            parts.append("Cell parameters no torch entry fills:\n" + "\n".join(f"  - {m}" for m in self.missing))
        super().__init__("state_dict does not fit the Cell\n" + "\n".join(parts))
