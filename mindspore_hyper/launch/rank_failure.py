"""A rank's failure, reported by the rank itself to the console of `mindspore-hyper run --processes`.

msrun stops the other workers about a second after one exits non-zero, but then waits for its
scheduler, which notices the dead worker only when its heartbeat times out (MindSpore 2.10: about
30 s), and a worker whose exit hangs is not noticed at all before that. So a worker that fails
(the script raised, or exited with a non-zero status) writes `failed_rank<R>.txt` into the job's
log folder, after printing its traceback to its log; the console (`worker_console.py`) polls the
folder with the logs and ends the job at once with that rank's error, not at a timeout.
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass
from typing import Optional

__all__ = ["RankFailure", "error_text", "write_rank_failure", "find_rank_failure", "clear_rank_failures"]

_NAME = "failed_rank{rank}.txt"
_PATTERN = re.compile(r"failed_rank(\d+)\.txt$")


@dataclass(frozen=True)
class RankFailure:
    """One rank's failure: its job rank and its error (`Type: message`, the message's first line)."""

    rank: int
    error: str

    def describe(self) -> str:
        return f"rank {self.rank} failed: {self.error}"


def error_text(error: BaseException) -> str:
    """`Type: first line of the message` (a MindSpore error's C++ stack, after it, is left out)."""
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0]}" if message else type(error).__name__


def write_rank_failure(log_dir: str, rank: int, error: str) -> str:
    """Write rank `rank`'s failure `error` into `log_dir` (whole or not at all: written aside,
    then renamed); returns the file's path."""
    path = os.path.join(log_dir, _NAME.format(rank=rank))
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as f:
        f.write(error)
    os.replace(partial, path)
    return path


def find_rank_failure(log_dir: str) -> Optional[RankFailure]:
    """The failure a rank wrote into `log_dir` (the earliest written, if several), or None."""
    found = []
    for path in glob.glob(os.path.join(log_dir, "failed_rank*.txt")):
        match = _PATTERN.search(os.path.basename(path))
        if match is None:  # not a rank's report (failed_rankX.txt)
            continue
        try:
            with open(path, encoding="utf-8") as f:
                found.append((os.path.getmtime(path), int(match.group(1)), f.read()))
        except FileNotFoundError:  # cleared meanwhile
            continue
    if not found:
        return None
    _, rank, error = min(found)
    return RankFailure(rank, error)


def clear_rank_failures(log_dir: str) -> None:
    """Remove the failures an earlier job left in `log_dir`."""
    for path in glob.glob(os.path.join(log_dir, "failed_rank*.txt*")):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
