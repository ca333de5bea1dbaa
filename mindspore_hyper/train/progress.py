"""A progress bar on a text stream (stderr by default), without any dependency.

`ProgressBar(total).update(done, text)` redraws one line in place (carriage return) with the bar,
`done/total`, the rate, the time left and a short text (the last loss, tokens/s); `clear()`
erases it so that a log line can be printed above it; `close()` ends the line.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO

__all__ = ["ProgressBar"]


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60:02d}:{rest % 60:02d}"


class ProgressBar:
    """One redrawn line of progress (see module docstring).

    Args:
        total: the number of steps.
        stream: where to draw (default sys.stderr).
        width: characters of the bar itself.
        clock: seconds since some origin (injectable for tests).
    """

    def __init__(self, total: int, stream: Optional[TextIO] = None, width: int = 30,
                 clock: Callable[[], float] = time.perf_counter):
        if isinstance(total, bool) or not isinstance(total, int) or total < 1:
            raise ValueError(f"total={total!r}: expected an int >= 1")
        self.total, self.width, self.clock = total, width, clock
        self.stream = sys.stderr if stream is None else stream
        self.start = clock()
        self._drawn = 0  # characters of the line now shown

    def render(self, done: int, text: str = "") -> str:
        """The line for `done` steps done (no carriage return)."""
        done = max(0, min(done, self.total))
        filled = self.width * done // self.total
        elapsed = self.clock() - self.start
        rate = done / elapsed if elapsed > 0 else 0.0
        left = (self.total - done) / rate if rate > 0 else None
        eta = "--:--" if left is None else _duration(left)
        bar = "#" * filled + "." * (self.width - filled)
        return f"[{bar}] {done}/{self.total} {rate:.2f} it/s eta {eta}" + (f" | {text}" if text else "")

    def update(self, done: int, text: str = "") -> None:
        """Redraw the line for `done` steps."""
        line = self.render(done, text)
        self.stream.write("\r" + line + " " * max(0, self._drawn - len(line)))
        self.stream.flush()
        self._drawn = len(line)

    def clear(self) -> None:
        """Erase the line (to print a log line in its place)."""
        if self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self._drawn = 0

    def close(self) -> None:
        """End the line (the bar stays visible)."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = 0
