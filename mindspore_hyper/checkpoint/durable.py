"""Durable small-file I/O: a file written and fsynced, and a directory fsynced (so the names
created, renamed or removed in it survive a power loss)."""
from __future__ import annotations

import os
from typing import Tuple

from mindspore_hyper import _core

__all__ = ["write_durably", "fsync_directory"]


def write_durably(path: str, data: bytes) -> Tuple[int, int]:
    """Write a new file and fsync it; returns its (bytes, crc32c)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(data), int(_core.crc32c(data))


def fsync_directory(path: str) -> None:
    """fsync a directory, so the names created, renamed or removed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
