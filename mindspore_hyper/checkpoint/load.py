"""`load_checkpoint(model, directory, optimizer=None, step=None)`: fill a model of any strategy
or world size from the newest committed step of a checkpoint directory (or `step`), reading only
the checksummed chunks that hold the regions this process holds.

Order: pick the committed step and read its commit record; read the manifest (checked against
the record's CRC32C); match it against the model (every missing or extra name and every shape or
dtype mismatch in one error); check the files (inside the directory, sizes, and every file this
process reads carrying the step's save id); work out each held region's pieces (`regions`); read
their chunks, verify each chunk's CRC32C and assemble the regions; under msrun agree that every
process succeeded on the same step; only then set the Parameters. A failure before the last step
leaves every Parameter as it was.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

import numpy as np
from mindspore import Tensor, nn

from mindspore_hyper.checkpoint.box import Box
from mindspore_hyper.checkpoint.directory import CommitRecord, resolve_step
from mindspore_hyper.checkpoint.dtypes import numpy_dtype, safetensors_code
from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.checkpoint.holdings import OPTIMIZER, PARAMETERS, Holdings, holdings_of
from mindspore_hyper.checkpoint.manifest import Manifest, TensorEntry
from mindspore_hyper.checkpoint.regions import byte_runs, pieces_of
from mindspore_hyper.checkpoint.safetensors_file import RangeReader
from mindspore_hyper.checkpoint.save_handle import wait_for_saves
from mindspore_hyper.checkpoint.snapshot import wait_for_snapshots

__all__ = ["load_checkpoint", "read_region", "LoadReport"]


@dataclass(frozen=True)
class LoadReport:
    """What one process read.

    Attributes:
        step: the step loaded.
        path: its step directory.
        tensors: parameters and optimizer states set.
        needed_bytes: bytes of the regions this process holds (what it had to get).
        data_bytes: bytes taken from the files into those regions (equals needed_bytes).
        read_bytes: bytes read (the whole checksummed chunks holding them: >= data_bytes).
        header_bytes: safetensors header bytes read.
        reads: reads (one per span of adjacent chunks).
        files: files opened.
        extra_state: the JSON data saved with the step (`save_checkpoint(..., extra_state=)`), by name.
    """

    step: int
    path: str
    tensors: int
    needed_bytes: int
    data_bytes: int
    read_bytes: int
    header_bytes: int
    reads: int
    files: int
    extra_state: Dict[str, Any] = field(default_factory=dict)


def load_checkpoint(model, directory, optimizer: Optional[nn.Optimizer] = None, *,
                    step: Optional[int] = None, extra_state: Optional[Mapping[str, Any]] = None) -> LoadReport:
    """Load a checkpoint written by `save_checkpoint` into `model` (and `optimizer`).

    The model may use any strategy and world size: each process reads the parts of the stored
    shards that overlap the regions it holds and reassembles them. Leftovers of saves that did
    not commit are ignored.

    Args:
        model: a ParallelModel or a plain nn.Cell.
        directory: the checkpoint directory (its newest committed step is loaded), or one
            committed step directory (`<directory>/step_<N>`).
        optimizer: an optimizer whose states to load too (the checkpoint must hold states of the
            same names), or None to load the parameters only.
        step: load this committed step instead of the newest.
        extra_state: objects to restore from the state saved with the step under the same name
            (`save_checkpoint(..., extra_state=)`), each through its `load_state_dict(state)` (a
            `ShardedLoader` resumes at the saved position), before any Parameter is set; every
            saved state is in the report's `extra_state` too.

    Returns:
        This process's LoadReport.

    Raises:
        CheckpointError: no committed step (or not `step`), a manifest or file whose checksum,
            size or save id differ from the commit (naming the files), parameters missing from
            the checkpoint or not in the model, shape or dtype mismatches, corrupt files, or
            (under msrun) another rank failing or resolving another step; no Parameter is
            changed then.
    """
    if not isinstance(directory, (str, os.PathLike)):
        raise CheckpointError(f"directory: expected a path, got {type(directory).__name__}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise CheckpointError(f"step: expected an int >= 0 or None, got {step!r}")
    directory = os.fspath(directory)
    wait_for_saves(directory)
    wait_for_snapshots()  # a background snapshot of another directory may still read these Parameters
    holdings = holdings_of(model, optimizer)
    error, values, report, found = None, {}, None, -1
    try:
        found, path = resolve_step(directory, step)
        manifest = Manifest.read_step(path, CommitRecord.read(path))
        _match(manifest, holdings, path)
        _check_files(manifest, path)
        values, report = _read(manifest, holdings, path)
        report = dataclasses.replace(report, extra_state=manifest.extra_state)
        _restore_extra(extra_state, manifest.extra_state, path)
    except Exception as exc:  # every process must reach the agreement below
        error = exc
    rows = holdings.exchange(np.array([int(error is not None), found]))
    failed = [r for r, row in rows.items() if row[0]]
    if isinstance(error, CheckpointError):
        raise error
    if error is not None:
        raise CheckpointError(f"load_checkpoint: reading {directory!r} failed: {error}") from error
    if failed:
        raise CheckpointError(f"load_checkpoint: rank(s) {failed} failed to read {directory!r}; nothing was loaded "
                              "(see their errors)")
    steps = {int(row[1]) for row in rows.values()}
    if len(steps) > 1:
        raise CheckpointError(f"load_checkpoint: the processes found different newest steps in {directory!r} "
                              f"({sorted(steps)}: a save committed meanwhile?); nothing was loaded, pass step=")
    for t in holdings.tensors:
        t.param.set_data(_tensor(t.to_stored(values[t.section, t.name]), t.param.dtype))  # padding zero
    holdings.after_load()
    return report


def _restore_extra(objects: Optional[Mapping[str, Any]], saved: Dict[str, Any], directory: str) -> None:
    """`load_state_dict` of each object of `objects` from the state saved under its name.

    Raises:
        CheckpointError: a name the step did not save, an object without `load_state_dict`, or
            one refusing its state (its message, e.g. a loader's state of another dataset).
    """
    if objects is None:
        return
    if not isinstance(objects, Mapping):
        raise CheckpointError(f"extra_state: expected a dict of name -> object with load_state_dict, got "
                              f"{type(objects).__name__}")
    missing = sorted(set(objects) - set(saved))
    if missing:
        raise CheckpointError(f"extra_state: {missing} not saved in {directory!r} (it holds {sorted(saved)}); save "
                              "them with save_checkpoint(..., extra_state={...})")
    for name, target in objects.items():
        if not callable(getattr(target, "load_state_dict", None)):
            raise CheckpointError(f"extra_state[{name!r}]: a {type(target).__name__} has no load_state_dict(state)")
        try:
            target.load_state_dict(saved[name])
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"extra_state[{name!r}]: {exc}") from None


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
        elif manifest.optimizer_class is not None and manifest.optimizer_class != holdings.optimizer_class:
            held = [t.name for t in holdings.tensors if t.section == OPTIMIZER]
            problems.append(
                f"the checkpoint's optimizer is {manifest.optimizer_class} (states {_state_kinds(manifest.optimizer)}), "
                f"the optimizer given is {holdings.optimizer_class} (states {_state_kinds(held)}): build the "
                f"optimizer the checkpoint was saved with ({manifest.optimizer_class}), or load without optimizer= "
                f"(the parameters only; the new optimizer starts from fresh states)")
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


def _state_kinds(names) -> str:
    """Optimizer state names summarised by kind: 'moment1.<parameter>' counted per prefix,
    scalar states by name ("moment1 x 34, moment2 x 34, beta1_power")."""
    kinds: Dict[str, int] = {}
    for name in names:
        prefix, dot, _ = name.partition(".")
        key = prefix if dot else name
        kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(k if n == 1 else f"{k} x {n}" for k, n in kinds.items()) or "none"


def _check_files(manifest: Manifest, directory: str) -> None:
    """Every listed file is inside the step directory and exists with the size the manifest recorded."""
    missing, resized, outside = [], [], []
    inside = os.path.realpath(directory) + os.sep
    for path, entry in sorted(manifest.files.items()):
        full = os.path.join(directory, path)
        if not os.path.realpath(full).startswith(inside):
            outside.append(path)
        elif not os.path.isfile(full):
            missing.append(path)
        elif os.path.getsize(full) != entry.bytes:
            resized.append(f"{path} has {os.path.getsize(full)} bytes, the manifest says {entry.bytes}")
    if outside:
        raise CheckpointError(f"checkpoint {directory!r}: file(s) {outside} lead outside the step directory (a link?)")
    if missing:
        raise CheckpointError(f"checkpoint {directory!r}: missing file(s) {missing}")
    if resized:
        raise CheckpointError(f"checkpoint {directory!r}: corrupt file(s): " + "; ".join(resized))


def _read(manifest: Manifest, holdings: Holdings, directory: str):
    """Every held region assembled from the checked chunks of the pieces that tile it, after
    checking that every file read carries the step's save id."""
    values = {}
    needed = 0
    with RangeReader() as reader:
        plans = [(t, _section(manifest, t.section)[t.name]) for t in holdings.tensors]
        _check_save_ids(reader, manifest, directory, {p.shard.file for t, e in plans for p in pieces_of(e, t.held)})
        for t, entry in plans:
            values[t.section, t.name] = read_region(reader, directory, entry, t.held, manifest.chunk_bytes)
            needed += values[t.section, t.name].nbytes
        report = LoadReport(manifest.step, directory, len(values), needed, reader.data_bytes, reader.read_bytes,
                            reader.header_bytes, reader.reads, reader.files)
    return values, report


def _check_save_ids(reader: RangeReader, manifest: Manifest, directory: str, files) -> None:
    """Refuse files written by another save than the step's (naming every one)."""
    foreign = []
    for path in sorted(files):
        metadata = reader.header(os.path.join(directory, path)).metadata
        if metadata.get("mshyper_save_id") != manifest.save_id:
            foreign.append(f"{path} (save {metadata.get('mshyper_save_id')!r}, step {metadata.get('mshyper_step')!r})")
    if foreign:
        raise CheckpointError(f"checkpoint {directory!r}: file(s) from another save than this step's (save "
                              f"{manifest.save_id!r}, step {manifest.step}): " + ", ".join(foreign))


def read_region(reader: RangeReader, directory: str, entry: TensorEntry, region: Box,
                chunk_bytes: int) -> np.ndarray:
    """The `region` of the stored tensor `entry`, assembled from the byte runs of the stored
    shards it overlaps (only the checksummed chunks holding them are read, each one verified).

    Raises:
        CheckpointError: a file lacks the tensor or holds it with another dtype or shape, or a
            chunk's checksum differs.
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
        runs = byte_runs(shape, dtype.itemsize, piece.in_shard)
        raw = reader.read_checked(path, piece.shard.key, stored, runs, piece.shard.crc32c, chunk_bytes)
        value = raw.view(dtype).reshape(piece.part.shape)
        if piece.part == region:
            return value  # one piece is the whole region: no copy
        out[piece.part.within(region)] = value
    return out


def _tensor(value: np.ndarray, dtype) -> Tensor:
    """A Tensor over `value`'s memory (no copy: `value` is this load's own buffer)."""
    tensor = Tensor.from_numpy(np.require(value, requirements="C"))  # (ascontiguousarray makes 0-d arrays 1-d)
    return tensor if tensor.dtype == dtype else Tensor(value, dtype=dtype)
