"""One save after its snapshot: write this process's rank files into the step's temporary
directory, then (the lead, rank 0's process) commit the step once every process has written.

Plain numpy and file I/O, no MindSpore call and no collective, so it runs in the caller's thread
(a blocking save) or in a background thread while training goes on (an asynchronous save). The
processes of an msrun job coordinate through the file system they share (as they already do for
the rank files): each process writes a marker naming its files, their sizes and checksums (or its
error); the lead waits for every marker, writes the manifest, the MindSpore strategy file and the
commit record, fsyncs them and the directory, and renames the directory to `step_<N>` (the
commit); the others wait until that step carries their save's id, or the lead's abort marker.

Crash safety: until the rename nothing named `step_<N>` exists, and older steps are untouched;
after it the step is complete and durable (every file and directory on the way was fsynced).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from mindspore_hyper.checkpoint.directory import (COMMIT_NAME, CommitRecord, remove_leftovers, retain_last, step_name,
                                                  tmp_name)
from mindspore_hyper.checkpoint.durable import fsync_directory, write_durably
from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.checkpoint.faults import fault_point
from mindspore_hyper.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest
from mindspore_hyper.checkpoint.mindspore_strategy import STRATEGY_NAME
from mindspore_hyper.checkpoint.safetensors_writer import WrittenFile, write_image, write_safetensors
from mindspore_hyper.checkpoint.snapshot import Snapshot

__all__ = ["RankFile", "SaveJob", "rank_file_metadata"]

_ABORT = "abort.json"


@dataclass(frozen=True)
class RankFile:
    """A per-rank file this process writes.

    Attributes:
        path: relative to the step directory (`rank_<r>/checkpoint_rank<r>.safetensors`).
        rank: the mesh rank whose shards it holds.
        tensors: (key, array the shard is cut from, the shard's slices of it, safetensors dtype
            code), in key order.
    """

    path: str
    rank: int
    tensors: Tuple[Tuple[str, np.ndarray, Tuple[slice, ...], str], ...]


@dataclass(frozen=True)
class SaveJob:
    """Everything one process does for a save after the snapshot (see module docstring).

    Attributes:
        root: the checkpoint directory.
        step: the step saved.
        save_id: the save's id (hex), agreed by every process.
        files: the rank files this process writes.
        process: this process's first mesh rank (names its marker).
        peers: the first ranks of the other processes, whose markers the lead waits for.
        lead: whether this process commits.
        manifest: the lead's manifest without file sizes and checksums (None elsewhere).
        strategy: the lead's MindSpore strategy file bytes, or None.
        deduplicated: whether some region was held by several ranks (MindSpore's metadata).
        chunk_bytes: checksummed chunk size.
        keep_last: committed steps to keep after the commit (None: all).
        timeout: seconds without progress of the other processes before waiting fails.
        snapshot: an asynchronous save's snapshot (the files are cut from its staging buffers;
            a background one is taken first thing by `run`), or None.
    """

    root: str
    step: int
    save_id: str
    files: Tuple[RankFile, ...]
    process: int
    peers: Tuple[int, ...]
    lead: bool
    manifest: Optional[Manifest]
    strategy: Optional[bytes]
    deduplicated: bool
    chunk_bytes: int
    keep_last: Optional[int]
    timeout: float
    snapshot: Optional[Snapshot] = None

    @property
    def tmp(self) -> str:
        return os.path.join(self.root, tmp_name(self.step, self.save_id))

    @property
    def markers(self) -> str:
        return self.tmp + ".markers"

    @property
    def final(self) -> str:
        return os.path.join(self.root, step_name(self.step))

    def run(self) -> Optional[Manifest]:
        """Write, then commit (lead) or wait for the commit (others); returns the lead's Manifest
        (None elsewhere).

        Raises:
            CheckpointError: this process failed to write (its error), another one did (naming
                its rank), or a wait ran out of progress for `timeout` seconds.
        """
        fault_point("start")
        if self.lead:
            remove_leftovers(self.root, keep=os.path.basename(self.tmp))
        written, error = {}, None
        try:
            if self.snapshot is not None and self.snapshot.background:
                self.snapshot.take()
            os.makedirs(self.tmp, exist_ok=True)
            for f in self.files:
                written[f.path] = self._write(f)
        except Exception as exc:  # the other processes must learn of it
            error = exc
        if not self.lead:
            return self._follow(written, error)
        return self._commit(written, error)

    # -- every process ------------------------------------------------------------------------
    def _write(self, f: RankFile) -> WrittenFile:
        path = os.path.join(self.tmp, f.path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if self.snapshot is not None:  # the image the snapshot filled, its checksums taken by the copy
            image, layout, crcs = self.snapshot.image(f.path)
            out = write_image(path, image, layout.size, crcs, point=f.path)
        else:
            tensors = [(key, np.ascontiguousarray(source[slices]), code) for key, source, slices, code in f.tensors]
            out = write_safetensors(path, tensors, rank_file_metadata(self.save_id, self.step, f.rank,
                                                                      self.deduplicated),
                                    self.chunk_bytes, point=f.path)
        fsync_directory(os.path.dirname(path))
        return out

    def _follow(self, written: Dict[str, WrittenFile], error: Optional[Exception]) -> None:
        """A non-lead process: publish its marker, then wait for the lead's commit or abort."""
        os.makedirs(self.markers, exist_ok=True)
        marker = {"process": self.process, "error": None if error is None else f"{type(error).__name__}: {error}",
                  "files": {path: {"bytes": w.bytes, "crc32c": w.crc32c} for path, w in written.items()}}
        _publish(os.path.join(self.markers, f"{self.process}.json"), marker)
        fault_point("marker_written")
        if error is not None:
            raise CheckpointError(f"save_checkpoint: rank {self.process} failed to write its shards of step "
                                  f"{self.step}: {error}") from error
        self._wait(self._commit_seen, f"the commit of step {self.step} by rank 0's process")

    def _commit_seen(self) -> bool:
        abort = _read_json(os.path.join(self.markers, _ABORT))
        if abort is not None:
            raise CheckpointError(f"save_checkpoint: step {self.step} was not committed: {abort['error']}")
        if not os.path.isfile(os.path.join(self.final, COMMIT_NAME)):
            return False
        return CommitRecord.read(self.final).save_id == self.save_id

    # -- the lead -----------------------------------------------------------------------------
    def _commit(self, written: Dict[str, WrittenFile], error: Optional[Exception]) -> Manifest:
        if error is not None:
            self._abort(f"rank {self.process} failed to write its shards: {type(error).__name__}: {error}")
            raise CheckpointError(f"save_checkpoint: rank {self.process} failed to write its shards of step "
                                  f"{self.step}: {error}") from error
        markers = {}
        if self.peers:
            try:
                self._wait(lambda: self._all_markers(markers), f"the rank files of ranks {list(self.peers)}")
            except CheckpointError as exc:
                self._abort(str(exc))
                raise
            failed = {p: m["error"] for p, m in sorted(markers.items()) if m["error"] is not None}
            if failed:
                message = f"rank(s) {sorted(failed)} failed to write their shards: " + "; ".join(
                    f"rank {p}: {e}" for p, e in failed.items())
                self._abort(message)
                raise CheckpointError(f"save_checkpoint: step {self.step} was not committed: {message}")
        files = {path: (w.bytes, w.crc32c) for path, w in written.items()}
        for m in markers.values():
            files.update({path: (f["bytes"], f["crc32c"]) for path, f in m["files"].items()})
        fault_point("all_written")
        try:
            manifest = self._manifest(files)
            record_files = {MANIFEST_NAME: write_durably(os.path.join(self.tmp, MANIFEST_NAME), manifest.encode())}
            if self.strategy is not None:
                record_files[STRATEGY_NAME] = write_durably(os.path.join(self.tmp, STRATEGY_NAME), self.strategy)
            fault_point("manifest_written")
            record = CommitRecord(self.step, self.save_id, record_files)
            write_durably(os.path.join(self.tmp, COMMIT_NAME), json.dumps(record.to_dict(), indent=1).encode())
            fsync_directory(self.tmp)  # its entries: the rank_<r>/ folders (whoever made them) and the files above
            fault_point("before_rename")
            if os.path.exists(self.final):
                raise CheckpointError(f"{self.final!r} exists already (another job saving into {self.root!r}?)")
            os.rename(self.tmp, self.final)
            fault_point("after_rename")
            fsync_directory(self.root)
        except Exception as exc:
            self._abort(f"rank {self.process} failed to commit: {type(exc).__name__}: {exc}")
            if isinstance(exc, CheckpointError):
                raise
            raise CheckpointError(f"save_checkpoint: committing step {self.step} failed: {exc}") from exc
        fault_point("committed")
        shutil.rmtree(self.markers, ignore_errors=True)
        if self.keep_last is not None:
            retain_last(self.root, self.keep_last)
        fault_point("done")
        return manifest

    def _all_markers(self, markers: Dict[int, dict]) -> bool:
        for p in self.peers:
            if p not in markers:
                marker = _read_json(os.path.join(self.markers, f"{p}.json"))
                if marker is not None:
                    markers[p] = marker
        return len(markers) == len(self.peers)

    def _manifest(self, files: Dict[str, Tuple[int, Dict[str, List[int]]]]) -> Manifest:
        """The lead's manifest with every file's size and every shard's checksums filled in."""
        skeleton = self.manifest

        def fill(entries):
            out = {}
            for name, entry in entries.items():
                shards = []
                for shard in entry.shards:
                    if shard.file not in files or shard.key not in files[shard.file][1]:
                        raise CheckpointError(f"{shard.file}: no tensor {shard.key!r} was written there")
                    shards.append(dataclasses.replace(shard, crc32c=tuple(files[shard.file][1][shard.key])))
                out[name] = dataclasses.replace(entry, shards=tuple(shards))
            return out

        listed = {s.file: s.writer for _, e in skeleton.tensors() for s in e.shards}
        return dataclasses.replace(
            skeleton, files={path: FileEntry(rank, files[path][0]) for path, rank in sorted(listed.items())},
            parameters=fill(skeleton.parameters),
            optimizer=None if skeleton.optimizer is None else fill(skeleton.optimizer))

    def _abort(self, message: str) -> None:
        """Tell the waiting processes the step will not be committed; remove its files."""
        try:
            os.makedirs(self.markers, exist_ok=True)
            _publish(os.path.join(self.markers, _ABORT), {"error": message})
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- waiting ------------------------------------------------------------------------------
    def _wait(self, done, what: str) -> None:
        """Poll `done()` until true; fail after `timeout` seconds in which nothing in the step's
        directories changed (files growing, markers appearing)."""
        delay, last, deadline = 1e-3, None, time.monotonic() + self.timeout
        while not done():
            progress = self._progress()
            if progress != last:
                last, deadline = progress, time.monotonic() + self.timeout
            elif time.monotonic() > deadline:
                raise CheckpointError(f"save_checkpoint: step {self.step}: waited {self.timeout:g} s for {what} "
                                      "without progress (a process died or stalls?)")
            time.sleep(delay)
            delay = min(2 * delay, 0.05)

    def _progress(self) -> Tuple[int, int]:
        """(entries, bytes) under the step's temporary and marker directories."""
        entries = size = 0
        for top in (self.tmp, self.markers):
            for folder, _, names in os.walk(top):
                for name in names:
                    entries += 1
                    try:
                        size += os.path.getsize(os.path.join(folder, name))
                    except OSError:
                        pass
        return entries, size


def rank_file_metadata(save_id: str, step: int, rank: int, deduplicated: bool) -> Dict[str, str]:
    """A rank file's safetensors `__metadata__`: MindSpore's keys and this save's id, step and rank."""
    return {"format": "ms", "remove_redundancy": str(deduplicated), "mshyper_save_id": save_id,
            "mshyper_step": str(step), "mshyper_rank": str(rank)}


def _publish(path: str, data: dict) -> None:
    """Write a small JSON file so that readers see all of it or nothing (write, then rename)."""
    part = path + ".part"
    with open(part, "w") as f:
        json.dump(data, f)
    os.replace(part, path)


def _read_json(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
