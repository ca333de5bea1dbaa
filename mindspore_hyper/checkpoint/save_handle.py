"""SaveHandle: a save whose writing and commit run in a background thread (`blocking=False`).

The process keeps at most one save in flight: the next save, a load of the same directory and
the interpreter's exit wait for it first (with `snapshot="background"`, the copy is the thread's
first task; `wait_snapshot()` waits for it alone, see `snapshot.py`). An error surfaces on the
handle (`wait()`, `error`) and, unless `wait()` already raised it, at the next save; at exit a
pending save is waited for (with a line on stderr saying so) and a failure is printed, never
dropped silently.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import List, Optional

from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.checkpoint.manifest import Manifest
from mindspore_hyper.checkpoint.save_job import SaveJob
from mindspore_hyper.checkpoint.staging import give_back

__all__ = ["SaveHandle", "wait_for_saves"]

WRITER_NICE = 19  # the background writer's nice value (Linux: per thread)
_pending: List["SaveHandle"] = []
_lock = threading.Lock()


class SaveHandle:
    """A save of `step` into `path` in progress (or finished).

    Attributes:
        step: the step saved.
        path: the step directory it commits (`<directory>/step_<N>`).
    """

    def __init__(self, job: SaveJob):
        self._job = job
        self.step = job.step
        self.path = job.final
        self._manifest: Optional[Manifest] = None
        self._error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None

    def run(self) -> None:
        """Do the save in this thread (a blocking save, or the background thread's body)."""
        try:
            manifest = self._job.run()
            self._manifest = manifest if manifest is not None else Manifest.read(self.path)
        except BaseException as exc:  # kept for wait(); the thread must not die with it unreported
            self._error = exc
        finally:
            if self._job.snapshot is not None:
                self._job.snapshot.release()  # never leave the optimizer's fence closed
                give_back(self._job.snapshot.buffers)

    def _run_in_background(self) -> None:
        try:  # yield the cores to training: the save takes longer, the training steps do not
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
        except OSError:
            pass
        self.run()

    def start(self) -> "SaveHandle":
        """Run the save in a background thread; registered so later saves and the exit wait for it."""
        self._thread = threading.Thread(target=self._run_in_background, name=f"mindspore_hyper save step {self.step}",
                                        daemon=True)
        with _lock:
            _pending.append(self)
        self._thread.start()
        return self

    def done(self) -> bool:
        """Whether the save has finished (committed or failed)."""
        return self._thread is None or not self._thread.is_alive()

    @property
    def error(self) -> Optional[BaseException]:
        """The save's error once it failed (None while it runs or after it committed)."""
        return self._error if self.done() else None

    def wait_snapshot(self) -> None:
        """Wait until the snapshot is taken (with `snapshot="background"`, the copies made in
        the background; otherwise it was taken in the call): from then on the Parameters may
        change in any way. Returns also when the save failed before or while copying (`wait()`
        raises that error).
        """
        if self._job.snapshot is not None:
            self._job.snapshot.wait()
            self._job.snapshot.remove_fences()

    def wait(self) -> Manifest:
        """Wait until the step is committed; returns its Manifest.

        Raises:
            CheckpointError: the save failed (the step was not committed).
        """
        if self._thread is not None:
            self._thread.join()
        if self._job.snapshot is not None:
            self._job.snapshot.remove_fences()
        with _lock:
            if self in _pending:
                _pending.remove(self)
        if self._error is not None:
            if isinstance(self._error, CheckpointError):
                raise self._error
            raise CheckpointError(f"save_checkpoint of step {self.step} failed: {self._error}") from self._error
        return self._manifest

    def __repr__(self) -> str:
        state = "running" if not self.done() else ("failed" if self._error is not None else "committed")
        return f"SaveHandle(step={self.step}, path={self.path!r}, {state})"


def wait_for_saves(directory: Optional[str] = None) -> None:
    """Wait for this process's saves in flight (only those into `directory` or a directory
    containing it, when given).

    Raises:
        CheckpointError: one of them failed (and its handle's `wait()` had not raised it yet).
    """
    with _lock:
        handles = [h for h in _pending if directory is None or _within(directory, h._job.root)]
    for handle in handles:  # a handle whose wait() raised is no longer pending
        try:
            handle.wait()
        except CheckpointError as exc:
            raise CheckpointError(f"the asynchronous save of step {handle.step} into {handle.path!r} failed: "
                                      f"{exc}") from exc


def _within(path: str, root: str) -> bool:
    """Whether `path` is `root` or inside it (a step directory of it)."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    return path == root or path.startswith(root + os.sep)


def _wait_at_exit() -> None:
    with _lock:
        handles = list(_pending)
    for handle in handles:
        if not handle.done():
            print(f"mindspore_hyper: waiting for the asynchronous checkpoint save of step {handle.step} "
                  f"({handle.path}) to commit before exiting", file=sys.stderr, flush=True)
        try:
            handle.wait()
        except CheckpointError as exc:
            print(f"mindspore_hyper: the asynchronous checkpoint save of step {handle.step} failed, the step was not "
                  f"committed: {exc}", file=sys.stderr, flush=True)


atexit.register(_wait_at_exit)
