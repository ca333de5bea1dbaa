"""The checkpoint directory: one sub-directory per committed step, and the names of work in progress.

```
ckpt/
  step_000120/               committed: renamed into place whole, with its commit record inside
    commit.json              the commit record (step, save id, checksums of manifest.json and strategy.ckpt)
    manifest.json  strategy.ckpt  rank_<r>/checkpoint_rank<r>.safetensors
  .tmp-step_000130-<id>/     a save being written (or a crashed one): never loaded
  .tmp-step_000130-<id>.markers/  its processes' "written" markers (msrun)
  .trash-step_000100-<id>/   a step being deleted by retention (renamed away first, then removed)
```

A step directory is committed when it has its final name and holds `commit.json`; both become
true at once, by the rename of a directory that already holds the record. Everything else is a
leftover, ignored by loads and removed by the next save.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from mindspore_hyper import _core
from mindspore_hyper.checkpoint.durable import fsync_directory
from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.checkpoint.faults import fault_point

__all__ = ["COMMIT_NAME", "CommitRecord", "step_name", "tmp_name", "committed_steps", "leftovers", "resolve_step",
           "newest_step", "remove_leftovers", "retain_last"]

COMMIT_NAME = "commit.json"
COMMIT_FORMAT = "mindspore_hyper.checkpoint.commit"
_STEP = re.compile(r"step_(\d+)$")
_LEFTOVER = re.compile(r"\.(tmp|trash)-step_\d+-[0-9a-f]+(\.markers)?$")


def step_name(step: int) -> str:
    """The directory name of a committed step, e.g. step_000120."""
    return f"step_{step:06d}"


def tmp_name(step: int, save_id: str) -> str:
    """The directory name a save of `step` writes into before its commit."""
    return f".tmp-{step_name(step)}-{save_id}"


@dataclass(frozen=True)
class CommitRecord:
    """`commit.json`: the step, the save's id (every rank file carries it), and the size and
    CRC32C of the step's small files (manifest.json, strategy.ckpt), checked at load.

    Attributes:
        step: the training step saved.
        save_id: the save's random id (hex).
        files: relative name -> (bytes, crc32c).
    """

    step: int
    save_id: str
    files: Dict[str, Tuple[int, int]]

    def to_dict(self) -> dict:
        return {"format": COMMIT_FORMAT, "step": self.step, "save_id": self.save_id,
                "files": {name: {"bytes": n, "crc32c": crc} for name, (n, crc) in sorted(self.files.items())}}

    @classmethod
    def read(cls, directory: str) -> "CommitRecord":
        """Read and check `directory/commit.json`.

        Raises:
            CheckpointError: missing, not JSON, or a field missing or of the wrong type (named).
        """
        path = os.path.join(directory, COMMIT_NAME)
        try:
            with open(path, "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            raise CheckpointError(f"{path}: no commit record; {directory!r} is not a committed checkpoint step") from None
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: corrupt commit record ({exc})") from None

        def bad(field: str, why: str):
            raise CheckpointError(f"{path}: corrupt commit record: {field}: {why}")

        if not isinstance(data, dict) or data.get("format") != COMMIT_FORMAT:
            bad("format", f"expected {COMMIT_FORMAT!r}")
        step, save_id, files = data.get("step"), data.get("save_id"), data.get("files")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            bad("step", f"expected a non-negative int, got {step!r}")
        if not isinstance(save_id, str) or not re.fullmatch(r"[0-9a-f]+", save_id):
            bad("save_id", f"expected a hex string, got {save_id!r}")
        if not isinstance(files, dict):
            bad("files", "expected an object")
        checked = {}
        for name, entry in files.items():
            if not (isinstance(entry, dict) and all(isinstance(entry.get(k), int) for k in ("bytes", "crc32c"))):
                bad(f"files[{name!r}]", "expected {\"bytes\": int, \"crc32c\": int}")
            checked[name] = (entry["bytes"], entry["crc32c"])
        return cls(step, save_id, checked)

    def check(self, directory: str, name: str, data: bytes) -> None:
        """Check the bytes `data` of the step's small file `name` against the record.

        Raises:
            CheckpointError: the file is not recorded, or its size or CRC32C differ.
        """
        path = os.path.join(directory, name)
        if name not in self.files:
            raise CheckpointError(f"{path}: not listed in the commit record {COMMIT_NAME}")
        size, crc = self.files[name]
        got = int(_core.crc32c(data))
        if len(data) != size or got != crc:
            raise CheckpointError(f"{path}: corrupt checkpoint file: {len(data)} bytes with CRC32C {got:#010x}, the "
                                  f"commit record says {size} bytes with CRC32C {crc:#010x}")


def committed_steps(root: str) -> Dict[int, str]:
    """step -> path of every committed step directory in `root`."""
    out = {}
    for entry in _entries(root):
        match = _STEP.match(entry.name)
        if match and entry.is_dir() and os.path.isfile(os.path.join(entry.path, COMMIT_NAME)):
            out[int(match.group(1))] = entry.path
    return out


def newest_step(root: str) -> Optional[int]:
    """The newest committed step in `root`, or None (no such directory, or nothing committed)."""
    steps = committed_steps(root)
    return max(steps) if steps else None


def leftovers(root: str) -> List[str]:
    """Names in `root` left by saves that did not commit (or retention that did not finish)."""
    out = []
    for entry in _entries(root):
        match = _STEP.match(entry.name)
        if _LEFTOVER.match(entry.name) or (match and not os.path.isfile(os.path.join(entry.path, COMMIT_NAME))):
            out.append(entry.name)
    return sorted(out)


def resolve_step(root: str, step: Optional[int] = None) -> Tuple[int, str]:
    """The (step, path) a load reads: `root` itself when it is a committed step directory, else
    the newest committed step in `root`, or `step`.

    Raises:
        CheckpointError: no such directory, nothing committed, or `step` not committed (the
            message lists the committed steps and the leftovers ignored).
    """
    if not os.path.isdir(root):
        raise CheckpointError(f"checkpoint directory {root!r} does not exist")
    if os.path.isfile(os.path.join(root, COMMIT_NAME)):
        record = CommitRecord.read(root)
        if step is not None and step != record.step:
            raise CheckpointError(f"{root!r} is the committed step {record.step}, not step={step}")
        return record.step, root
    steps = committed_steps(root)
    ignored = leftovers(root)
    note = f" (ignored, not committed: {ignored})" if ignored else ""
    if not steps:
        legacy = os.path.isfile(os.path.join(root, "manifest.json"))
        hint = (" It holds a manifest.json without a commit record: a checkpoint of format version 1 (not "
                "crash-safe) or a damaged step; version 1 is not read." if legacy else "")
        raise CheckpointError(f"{root!r} holds no committed checkpoint{note}; a save is committed when its "
                              f"step_<N>/ directory with {COMMIT_NAME} appears.{hint}")
    if step is None:
        step = max(steps)
    elif step not in steps:
        raise CheckpointError(f"{root!r}: step {step} is not committed; committed steps: {sorted(steps)}{note}")
    return step, steps[step]


def remove_leftovers(root: str, keep: str = "") -> List[str]:
    """Remove the leftovers in `root` except `keep` (the save in progress); returns their names."""
    removed = []
    for name in leftovers(root):
        if name == keep or name == keep + ".markers":
            continue
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        removed.append(name)
    return removed


def retain_last(root: str, keep_last: int) -> List[int]:
    """Delete all but the newest `keep_last` committed steps; returns the steps deleted. Each goes
    by a rename to a leftover name first, so a crash never leaves a half-deleted committed step."""
    steps = committed_steps(root)
    doomed = sorted(steps)[:-keep_last] if keep_last > 0 else []
    for step in doomed:
        trash = os.path.join(root, f".trash-{step_name(step)}-{secrets.token_hex(4)}")
        os.rename(steps[step], trash)
        fsync_directory(root)
        fault_point(f"retention_renamed:{step}")
        shutil.rmtree(trash, ignore_errors=True)
    return doomed


def _entries(root: str):
    try:
        with os.scandir(root) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []
