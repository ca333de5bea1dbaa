"""The layout manifest of a checkpoint step (`manifest.json`, written by rank 0 before the commit).

It says what the step holds and where: the save's step and id, the mesh it was saved from, and
for every parameter and optimizer state its global shape, dtype, tensor layout on that mesh, and
its shards: which region of the global tensor (a box), in which file under which key, written by
which rank on behalf of which replicas, and the CRC32C of every chunk of its bytes. A loader
needs only the boxes: any target layout picks the shards its own region overlaps.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from mindspore_hyper.checkpoint.box import Box
from mindspore_hyper.checkpoint.checksums import ALGORITHM
from mindspore_hyper.checkpoint.directory import CommitRecord, resolve_step
from mindspore_hyper.checkpoint.dtypes import SAFETENSORS_CODES, itemsize
from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.shard.layout import Layout

__all__ = ["FORMAT", "VERSION", "MANIFEST_NAME", "ShardEntry", "TensorEntry", "FileEntry", "Manifest"]

FORMAT = "mindspore_hyper.checkpoint"
VERSION = 2  # 1: one directory rewritten in place, no checksums, no commit record
MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class ShardEntry:
    """One stored region of a tensor.

    Attributes:
        box: the region of the global tensor.
        file: the file holding it (relative to the checkpoint directory).
        key: its tensor name inside that file.
        writer: the rank that wrote it (the lowest of `replicas`).
        replicas: every rank of the saving mesh that held this same region.
        crc32c: the CRC32C of every `Manifest.chunk_bytes` of its bytes (C order), in order.
    """

    box: Box
    file: str
    key: str
    writer: int
    replicas: Tuple[int, ...]
    crc32c: Tuple[int, ...] = ()

    def to_dict(self) -> dict:
        return {"box": self.box.to_pairs(), "file": self.file, "key": self.key, "writer": self.writer,
                "replicas": list(self.replicas), "crc32c": list(self.crc32c)}


@dataclass(frozen=True)
class TensorEntry:
    """A parameter or optimizer state.

    Attributes:
        name: its name (a model parameter name, or the optimizer's name of the state).
        global_shape: the whole tensor's shape.
        dtype: MindSpore dtype name, e.g. "Float32".
        tensor_map: its layout on the saving mesh, one entry per dimension: an alias, None, or a
            list of aliases (major first).
        ms_tensor_map: the same in MindSpore's convention (axes counted from the right, -1 unsharded).
        state_of: for a per-parameter optimizer state, the parameter's name; else None.
        shards: the stored regions; together they tile the tensor exactly once.
    """

    name: str
    global_shape: Tuple[int, ...]
    dtype: str
    tensor_map: Tuple[Any, ...]
    ms_tensor_map: Tuple[Any, ...]
    state_of: Optional[str]
    shards: Tuple[ShardEntry, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.global_shape) * itemsize(self.dtype)

    def to_dict(self) -> dict:
        return {"global_shape": list(self.global_shape), "dtype": self.dtype,
                "tensor_map": [list(e) if isinstance(e, tuple) else e for e in self.tensor_map],
                "ms_tensor_map": [list(e) if isinstance(e, tuple) else e for e in self.ms_tensor_map],
                "state_of": self.state_of, "shards": [s.to_dict() for s in self.shards]}


@dataclass(frozen=True)
class FileEntry:
    """A per-rank file: the rank that wrote it and its size in bytes."""

    rank: int
    bytes: int


@dataclass(frozen=True)
class Manifest:
    """A checkpoint's layout (see module docstring).

    Attributes:
        mesh: the saving mesh (a 1-device mesh for a plain Cell).
        mode: "simulation", "distributed" or "single" (a plain Cell).
        files: file path (relative) -> FileEntry.
        parameters: parameter name -> TensorEntry.
        optimizer: optimizer state name -> TensorEntry, or None when saved without an optimizer.
        optimizer_class: the optimizer's class name, or None.
        mindspore_strategy: the MindSpore strategy file describing the stored layouts (relative
            path), or None when the mesh cannot be described in that format.
        step: the training step saved.
        save_id: the save's id; every file of the step carries it.
        chunk_bytes: the checksummed chunk size of the shards' bytes.
        extra_state: JSON data saved with the step by `save_checkpoint(..., extra_state=)` (a data
            loader's position, ...), by name; empty when none was given.
    """

    mesh: Layout
    mode: str
    files: Dict[str, FileEntry]
    parameters: Dict[str, TensorEntry]
    optimizer: Optional[Dict[str, TensorEntry]] = None
    optimizer_class: Optional[str] = None
    mindspore_strategy: Optional[str] = None
    step: int = 0
    save_id: str = ""
    chunk_bytes: int = 1 << 20
    extra_state: Dict[str, Any] = field(default_factory=dict)

    def tensors(self):
        """(section, entry) of every stored tensor."""
        for entry in self.parameters.values():
            yield "parameters", entry
        for entry in (self.optimizer or {}).values():
            yield "optimizer", entry

    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "step": self.step, "save_id": self.save_id,
            "checksum": {"algorithm": ALGORITHM, "chunk_bytes": self.chunk_bytes},
            "mode": self.mode, "mesh": self.mesh.to_dict(),
            "files": {path: {"rank": f.rank, "bytes": f.bytes} for path, f in sorted(self.files.items())},
            "parameters": {name: e.to_dict() for name, e in self.parameters.items()},
            "optimizer": None if self.optimizer is None else {
                "class": self.optimizer_class, "states": {name: e.to_dict() for name, e in self.optimizer.items()}},
            "mindspore_strategy": self.mindspore_strategy,
            "extra_state": self.extra_state,
        }

    def encode(self) -> bytes:
        """The JSON bytes of `manifest.json`."""
        return json.dumps(self.to_dict(), separators=(",", ":")).encode()

    @classmethod
    def read(cls, directory: str, step: Optional[int] = None) -> "Manifest":
        """Read and validate the manifest of a committed step: `directory` itself when it is a
        step directory, else its newest committed step (or `step`).

        Raises:
            CheckpointError: no committed step (see `directory.resolve_step`), a manifest whose
                size or CRC32C differ from the commit record, unreadable JSON, a missing or
                malformed field (named), shards that do not tile a tensor, a file name outside
                the directory.
        """
        _, path = resolve_step(directory, step)
        return cls.read_step(path, CommitRecord.read(path))

    @classmethod
    def read_step(cls, path: str, record: CommitRecord) -> "Manifest":
        """Read the manifest of the committed step directory `path`, checked against `record`."""
        where = os.path.join(path, MANIFEST_NAME)
        try:
            with open(where, "rb") as f:
                raw = f.read()
        except OSError as exc:
            raise CheckpointError(f"{where}: cannot read the manifest ({exc.strerror})") from None
        record.check(path, MANIFEST_NAME, raw)
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise CheckpointError(f"{where}: not a readable JSON manifest ({exc})") from None
        manifest = cls.from_dict(data, where)
        if (manifest.step, manifest.save_id) != (record.step, record.save_id):
            raise CheckpointError(f"{where}: step {manifest.step} of save {manifest.save_id}, but the commit record "
                                  f"says step {record.step} of save {record.save_id}")
        return manifest

    @classmethod
    def from_dict(cls, data: Any, where: str = MANIFEST_NAME) -> "Manifest":
        """Build from the JSON form, checking every field (see `read`)."""
        check = _Checker(where)
        check.mapping(data, "")
        if data.get("format") != FORMAT:
            check.fail("format", f"expected {FORMAT!r}, got {data.get('format')!r}")
        if data.get("version") != VERSION:
            check.fail("version", f"expected {VERSION}, got {data.get('version')!r}")
        step = check.int_field(data, "step", "")
        save_id = check.field(data, "save_id", str)
        checksum = check.mapping(check.field(data, "checksum", dict), "checksum")
        if checksum.get("algorithm") != ALGORITHM:
            check.fail("checksum.algorithm", f"expected {ALGORITHM!r}, got {checksum.get('algorithm')!r}")
        chunk_bytes = check.int_field(checksum, "chunk_bytes", "checksum")
        if chunk_bytes == 0:
            check.fail("checksum.chunk_bytes", "expected a positive int")
        mode = check.field(data, "mode", str)
        mesh_data = check.mapping(check.field(data, "mesh", dict), "mesh")
        try:
            mesh = Layout(tuple(check.field(mesh_data, "device_matrix", list, "mesh")),
                          tuple(check.field(mesh_data, "alias_names", list, "mesh")),
                          check.field(mesh_data, "rank_list", list, "mesh"))
        except ValueError as exc:
            check.fail("mesh", str(exc))
        files = {}
        for path, entry in check.field(data, "files", dict).items():
            at = f"files[{path!r}]"
            check.relative_path(path, at)
            check.mapping(entry, at)
            files[path] = FileEntry(check.int_field(entry, "rank", at), check.int_field(entry, "bytes", at))
        parameters = {name: _tensor(check, f"parameters[{name!r}]", name, entry, files, chunk_bytes)
                      for name, entry in check.field(data, "parameters", dict).items()}
        optimizer, optimizer_class = None, None
        if data.get("optimizer") is not None:
            opt = check.mapping(data["optimizer"], "optimizer")
            optimizer_class = opt.get("class")
            optimizer = {name: _tensor(check, f"optimizer.states[{name!r}]", name, entry, files, chunk_bytes)
                         for name, entry in check.field(opt, "states", dict, "optimizer").items()}
        strategy = data.get("mindspore_strategy")
        if strategy is not None:
            check.relative_path(strategy, "mindspore_strategy")
        extra_state = data.get("extra_state", {})  # absent in steps saved before it existed
        check.mapping(extra_state, "extra_state")
        return cls(mesh, mode, files, parameters, optimizer, optimizer_class, strategy, step, save_id, chunk_bytes,
                   extra_state)


def _tensor(check: "_Checker", at: str, name: str, data: Any, files: Dict[str, FileEntry],
            chunk_bytes: int) -> TensorEntry:
    check.mapping(data, at)
    shape = tuple(check.field(data, "global_shape", list, at))
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in shape):
        check.fail(f"{at}.global_shape", f"expected non-negative ints, got {list(shape)}")
    dtype = check.field(data, "dtype", str, at)
    if dtype not in SAFETENSORS_CODES:
        check.fail(f"{at}.dtype", f"{dtype!r} is not one of {', '.join(SAFETENSORS_CODES)}")
    shards = []
    for i, shard in enumerate(check.field(data, "shards", list, at)):
        where = f"{at}.shards[{i}]"
        check.mapping(shard, where)
        pairs = check.field(shard, "box", list, where)
        try:
            box = Box.from_pairs(pairs)
        except (TypeError, ValueError, IndexError):
            check.fail(f"{where}.box", f"expected [[start, stop], ...], got {pairs!r}")
        if not box.fits(shape):
            check.fail(f"{where}.box", f"{box} is empty or outside the global shape {list(shape)}")
        file = check.field(shard, "file", str, where)
        if file not in files:
            check.fail(f"{where}.file", f"{file!r} is not listed in files")
        crcs = check.field(shard, "crc32c", list, where)
        nbytes = box.volume * itemsize(dtype)
        if len(crcs) != -(-nbytes // chunk_bytes) or any(isinstance(c, bool) or not isinstance(c, int) for c in crcs):
            check.fail(f"{where}.crc32c", f"expected {-(-nbytes // chunk_bytes)} ints (one per {chunk_bytes} bytes of "
                       f"{nbytes}), got {len(crcs)} entries")
        shards.append(ShardEntry(box, file, check.field(shard, "key", str, where),
                                 check.int_field(shard, "writer", where),
                                 tuple(check.field(shard, "replicas", list, where)), tuple(crcs)))
    _check_tiling(check, at, shape, shards)
    return TensorEntry(name, shape, dtype, tuple(_entry(e) for e in data.get("tensor_map", ())),
                       tuple(_entry(e) for e in data.get("ms_tensor_map", ())), data.get("state_of"), tuple(shards))


def _check_tiling(check: "_Checker", at: str, shape: Tuple[int, ...], shards: List[ShardEntry]) -> None:
    """The shards must cover the tensor exactly once: pairwise disjoint, volumes summing to the whole."""
    for i, a in enumerate(shards):
        for j in range(i):
            if a.box.intersect(shards[j].box) is not None:
                check.fail(f"{at}.shards", f"shards {j} ({shards[j].box}) and {i} ({a.box}) overlap")
    covered = sum(s.box.volume for s in shards)
    if covered != math.prod(shape):
        check.fail(f"{at}.shards", f"the shards cover {covered} of the {math.prod(shape)} elements of shape "
                   f"{list(shape)}")


def _entry(e):
    return tuple(e) if isinstance(e, list) else e


class _Checker:
    """Field checks of the JSON manifest; failures name the file and the field."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, field: str, message: str):
        raise CheckpointError(f"{self.where}: {field}: {message}")

    def mapping(self, value: Any, at: str) -> dict:
        if not isinstance(value, dict):
            self.fail(at or "manifest", f"expected a JSON object, got {type(value).__name__}")
        return value

    def field(self, data: dict, key: str, kind: type, at: str = "") -> Any:
        name = f"{at}.{key}" if at else key
        if key not in data:
            self.fail(name, "missing")
        if not isinstance(data[key], kind):
            self.fail(name, f"expected a {kind.__name__}, got {type(data[key]).__name__}")
        return data[key]

    def relative_path(self, path: str, at: str) -> None:
        """A file name must stay inside the checkpoint directory: relative, no '..', '.' or empty parts."""
        parts = path.split("/")
        if not path or path.startswith("/") or "\\" in path or any(p in ("", ".", "..") for p in parts):
            self.fail(at, f"{path!r} is not a relative path inside the checkpoint directory (absolute names, '..' "
                      "and empty parts are refused)")

    def int_field(self, data: dict, key: str, at: str) -> int:
        value = self.field(data, key, int, at)
        if isinstance(value, bool) or value < 0:
            self.fail(f"{at}.{key}" if at else key, f"expected a non-negative int, got {value!r}")
        return value
