"""`load_checkpoint(model, directory, optimizer=None)`: fill a model of any strategy or world
size from a checkpoint, reading only the bytes of the regions this process holds.

Order: read the manifest; match it against the model (every missing or extra name and every
shape or dtype mismatch in one error); check the files; work out each held region's pieces
(`regions`); read their byte runs and assemble the regions; under msrun agree that every
process succeeded; only then set the Parameters. A failure before the last step leaves every
Parameter as it was.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
from mindspore import Tensor, nn

from mindspore_hyper.checkpoint.box import Box
from mindspore_hyper.checkpoint.dtypes import numpy_dtype, safetensors_code
from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.checkpoint.holdings import OPTIMIZER, PARAMETERS, Holdings, holdings_of
from mindspore_hyper.checkpoint.manifest import Manifest, TensorEntry
from mindspore_hyper.checkpoint.regions import byte_runs, pieces_of
from mindspore_hyper.checkpoint.safetensors_file import RangeReader

__all__ = ["load_checkpoint", "read_region", "LoadReport"]


@dataclass(frozen=True)
class LoadReport:
    """What one process read.

    Attributes:
        tensors: parameters and optimizer states set.
        needed_bytes: bytes of the regions this process holds (what it had to get).
        data_bytes: tensor bytes read from the files (equals needed_bytes: nothing else is read).
        header_bytes: safetensors header bytes read.
        reads: byte runs read.
        files: files opened.
    """

    tensors: int
    needed_bytes: int
    data_bytes: int
    header_bytes: int
    reads: int
    files: int


def load_checkpoint(model, directory, optimizer: Optional[nn.Optimizer] = None) -> LoadReport:
    """Load a checkpoint written by `save_checkpoint` into `model` (and `optimizer`).

    The model may use any strategy and world size: each process reads the parts of the stored
    shards that overlap the regions it holds and reassembles them.

    Args:
        model: a ParallelModel or a plain nn.Cell.
        directory: the checkpoint directory.
        optimizer: an optimizer whose states to load too (the checkpoint must hold states of the
            same names), or None to load the parameters only.

    Returns:
        This process's LoadReport.

    Raises:
        CheckpointError: no manifest, missing or truncated files, parameters missing from the
            checkpoint or not in the model, shape or dtype mismatches, corrupt files, or (under
            msrun) another rank failing; no Parameter is changed then.
    """
    if not isinstance(directory, (str, os.PathLike)):
        raise CheckpointError(f"directory: expected a path, got {type(directory).__name__}")
    directory = os.fspath(directory)
    holdings = holdings_of(model, optimizer)
    error, values, report = None, {}, None
    try:
        manifest = Manifest.read(directory)
        _match(manifest, holdings, directory)
        _check_files(manifest, directory)
        values, report = _read(manifest, holdings, directory)
    except Exception as exc:  # every process must reach the agreement below
        error = exc
    failed = holdings.failed_ranks(error is not None)
    if isinstance(error, CheckpointError):
        raise error
    if error is not None:
        raise CheckpointError(f"load_checkpoint: reading {directory!r} failed: {error}") from error
    if failed:
        raise CheckpointError(f"load_checkpoint: rank(s) {failed} failed to read {directory!r}; nothing was loaded "
                              "(see their errors)")
    for t in holdings.tensors:
        t.param.set_data(Tensor(values[t.section, t.name], dtype=t.param.dtype))
    holdings.after_load()
    return report


def _section(manifest: Manifest, section: str) -> Dict[str, TensorEntry]:
    return manifest.parameters if section == PARAMETERS else (manifest.optimizer or {})


def _match(manifest: Manifest, holdings: Holdings, directory: str) -> None:
    """Raise one CheckpointError naming every difference between the checkpoint and the model."""
    problems = []
    sections = [PARAMETERS]
    if holdings.optimizer_class is not None:
        if manifest.optimizer is None:
            problems.append("an optimizer was given but the checkpoint holds no optimizer states "
                            "(saved without optimizer=)")
        else:
            sections.append(OPTIMIZER)
    for section in sections:
        stored = _section(manifest, section)
        held = {t.name: t for t in holdings.tensors if t.section == section}
        what = "parameters" if section == PARAMETERS else "optimizer states"
        missing = sorted(set(held) - set(stored))
        extra = sorted(set(stored) - set(held))
        if missing:
            problems.append(f"{what} of the model missing from the checkpoint: {missing}")
        if extra:
            problems.append(f"{what} in the checkpoint but not in the model: {extra}")
        for name in sorted(set(held) & set(stored)):
            t, entry = held[name], stored[name]
            if tuple(entry.global_shape) != tuple(t.global_shape):
                problems.append(f"shape mismatch of {name!r}: checkpoint {tuple(entry.global_shape)}, "
                                f"model {tuple(t.global_shape)}")
            if entry.dtype != t.dtype:
                problems.append(f"dtype mismatch of {name!r}: checkpoint {entry.dtype}, model {t.dtype}")
    if problems:
        raise CheckpointError(f"checkpoint {directory!r} does not fit the model:\n  " + "\n  ".join(problems))


def _check_files(manifest: Manifest, directory: str) -> None:
    """Every listed file exists with the size the manifest recorded."""
    missing, resized = [], []
    for path, entry in sorted(manifest.files.items()):
        full = os.path.join(directory, path)
        if not os.path.isfile(full):
            missing.append(path)
        elif os.path.getsize(full) != entry.bytes:
            resized.append(f"{path} has {os.path.getsize(full)} bytes, the manifest says {entry.bytes}")
    if missing:
        raise CheckpointError(f"checkpoint {directory!r}: missing file(s) {missing}")
    if resized:
        raise CheckpointError(f"checkpoint {directory!r}: corrupt file(s): " + "; ".join(resized))


def _read(manifest: Manifest, holdings: Holdings, directory: str):
    """Every held region assembled from the byte runs of the pieces that tile it."""
    values = {}
    needed = 0
    with RangeReader() as reader:
        for t in holdings.tensors:
            entry = _section(manifest, t.section)[t.name]
            values[t.section, t.name] = read_region(reader, directory, entry, t.held)
            needed += values[t.section, t.name].nbytes
        report = LoadReport(len(values), needed, reader.data_bytes, reader.header_bytes, reader.reads,
                            reader.files)
    return values, report


def read_region(reader: RangeReader, directory: str, entry: TensorEntry, region: Box) -> np.ndarray:
    """The `region` of the stored tensor `entry`, assembled from the byte runs of the stored
    shards it overlaps (nothing else is read).

    Raises:
        CheckpointError: a file lacks the tensor or holds it with another dtype or shape.
    """
    dtype = numpy_dtype(entry.dtype)
    out = np.empty(region.shape, dtype)
    for piece in pieces_of(entry, region):
        path = os.path.join(directory, piece.shard.file)
        stored = reader.header(path).tensors.get(piece.shard.key)
        if stored is None:
            raise CheckpointError(f"{path}: corrupt checkpoint file: no tensor {piece.shard.key!r}, which the "
                                  "manifest places there")
        shape = piece.shard.box.shape
        # MindSpore's writer stores a 0-d tensor with shape [1] (same bytes)
        if stored.dtype != safetensors_code(entry.dtype) or stored.shape not in (shape, (1,) if not shape else shape):
            raise CheckpointError(f"{path}: corrupt checkpoint file: tensor {piece.shard.key!r} is {stored.dtype} "
                                  f"{stored.shape}, the manifest says {entry.dtype} {shape}")
        runs = [(stored.begin + offset, length) for offset, length in byte_runs(shape, dtype.itemsize, piece.in_shard)]
        raw = reader.read_runs(path, runs)
        out[piece.part.within(region)] = raw.view(dtype).reshape(piece.part.shape)
    return out
