"""Named points inside a save where a test can inject a fault (e.g. SIGKILL the process there).

`fault_point(name)` calls the hook installed by `set_fault_hook`; without one (always, outside
the fault-injection tests) it does nothing. The names say where the save is, e.g.
"file_written:rank_3/checkpoint_rank3.safetensors" or "before_rename".
"""
from __future__ import annotations

from typing import Callable, Optional

__all__ = ["fault_point", "set_fault_hook"]

_hook: Optional[Callable[[str], None]] = None


def set_fault_hook(hook: Optional[Callable[[str], None]]) -> Optional[Callable[[str], None]]:
    """Install `hook` (called with each point's name; None removes it); returns the previous one."""
    global _hook
    previous, _hook = _hook, hook
    return previous


def fault_point(name: str) -> None:
    """Mark the point `name` of a save (the hook, if any, may kill the process here)."""
    if _hook is not None:
        _hook(name)
