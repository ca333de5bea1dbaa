"""The layout manifest of a checkpoint directory (`manifest.json`, written last, by rank 0).

It says what the checkpoint holds and where: the mesh it was saved from, and for every parameter
and optimizer state its global shape, dtype, tensor layout on that mesh, and its shards: which
region of the global tensor (a box), in which file under which key, written by which rank on
behalf of which replicas. A loader needs only the boxes: any target layout picks the shards its
own region overlaps.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from mindspore_hyper.checkpoint.box import Box
from mindspore_hyper.checkpoint.dtypes import SAFETENSORS_CODES
from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.shard.layout import Layout

__all__ = ["FORMAT", "VERSION", "MANIFEST_NAME", "ShardEntry", "TensorEntry", "FileEntry", "Manifest"]

FORMAT = "mindspore_hyper.checkpoint"
VERSION = 1
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
    """

    box: Box
    file: str
    key: str
    writer: int
    replicas: Tuple[int, ...]

    def to_dict(self) -> dict:
        return {"box": self.box.to_pairs(), "file": self.file, "key": self.key, "writer": self.writer,
                "replicas": list(self.replicas)}


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
        from mindspore_hyper.checkpoint.dtypes import numpy_dtype

        return math.prod(self.global_shape) * numpy_dtype(self.dtype).itemsize

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
    """

    mesh: Layout
    mode: str
    files: Dict[str, FileEntry]
    parameters: Dict[str, TensorEntry]
    optimizer: Optional[Dict[str, TensorEntry]] = None
    optimizer_class: Optional[str] = None
    mindspore_strategy: Optional[str] = None

    def tensors(self):
        """(section, entry) of every stored tensor."""
        for entry in self.parameters.values():
            yield "parameters", entry
        for entry in (self.optimizer or {}).values():
            yield "optimizer", entry

    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "mode": self.mode, "mesh": self.mesh.to_dict(),
            "files": {path: {"rank": f.rank, "bytes": f.bytes} for path, f in sorted(self.files.items())},
            "parameters": {name: e.to_dict() for name, e in self.parameters.items()},
            "optimizer": None if self.optimizer is None else {
                "class": self.optimizer_class, "states": {name: e.to_dict() for name, e in self.optimizer.items()}},
            "mindspore_strategy": self.mindspore_strategy,
        }

    def write(self, directory: str) -> str:
        """Write `manifest.json` atomically (a temporary file renamed into place); returns its path."""
        path = os.path.join(directory, MANIFEST_NAME)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, directory: str) -> "Manifest":
        """Read and validate `directory/manifest.json`.

        Raises:
            CheckpointError: no manifest (not a checkpoint, or an unfinished save), unreadable
                JSON, a missing or malformed field (named), shards that do not tile a tensor.
        """
        path = os.path.join(directory, MANIFEST_NAME)
        if not os.path.isdir(directory):
            raise CheckpointError(f"checkpoint directory {directory!r} does not exist")
        if not os.path.isfile(path):
            raise CheckpointError(f"{path}: no manifest; {directory!r} is not a checkpoint directory or its save "
                                  "did not finish (the manifest is written last)")
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{path}: not a readable JSON manifest ({exc})") from None
        return cls.from_dict(data, path)

    @classmethod
    def from_dict(cls, data: Any, where: str = MANIFEST_NAME) -> "Manifest":
        """Build from the JSON form, checking every field (see `read`)."""
        check = _Checker(where)
        check.mapping(data, "")
        if data.get("format") != FORMAT:
            check.fail("format", f"expected {FORMAT!r}, got {data.get('format')!r}")
        if data.get("version") != VERSION:
            check.fail("version", f"expected {VERSION}, got {data.get('version')!r}")
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
            check.mapping(entry, at)
            files[path] = FileEntry(check.int_field(entry, "rank", at), check.int_field(entry, "bytes", at))
        parameters = {name: _tensor(check, f"parameters[{name!r}]", name, entry, files)
                      for name, entry in check.field(data, "parameters", dict).items()}
        optimizer, optimizer_class = None, None
        if data.get("optimizer") is not None:
            opt = check.mapping(data["optimizer"], "optimizer")
            optimizer_class = opt.get("class")
            optimizer = {name: _tensor(check, f"optimizer.states[{name!r}]", name, entry, files)
                         for name, entry in check.field(opt, "states", dict, "optimizer").items()}
        return cls(mesh, mode, files, parameters, optimizer, optimizer_class, data.get("mindspore_strategy"))


def _tensor(check: "_Checker", at: str, name: str, data: Any, files: Dict[str, FileEntry]) -> TensorEntry:
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
        shards.append(ShardEntry(box, file, check.field(shard, "key", str, where),
                                 check.int_field(shard, "writer", where),
                                 tuple(check.field(shard, "replicas", list, where))))
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

    def int_field(self, data: dict, key: str, at: str) -> int:
        value = self.field(data, key, int, at)
        if isinstance(value, bool) or value < 0:
            self.fail(f"{at}.{key}", f"expected a non-negative int, got {value!r}")
        return value
