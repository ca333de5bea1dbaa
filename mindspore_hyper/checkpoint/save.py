"""`save_checkpoint(model, directory, optimizer=None)`: every rank's shards to a per-rank
safetensors file (MindSpore's own writer), then the manifest, written last by rank 0.

A region held by several ranks (replicas) is written once, by the lowest of them. Which rank
writes which region follows from the layouts alone, so every process computes the same plan
without communicating; under msrun the processes only agree that everyone finished writing
(before the manifest) and that the manifest exists (before returning).
"""
from __future__ import annotations

import glob
import os
import re
from typing import Dict, List, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from mindspore_hyper.checkpoint.box import Box
from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.checkpoint.holdings import HeldTensor, Holdings, holdings_of
from mindspore_hyper.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, ShardEntry, TensorEntry
from mindspore_hyper.checkpoint.mindspore_strategy import STRATEGY_NAME, expressible, write_strategy_file

__all__ = ["save_checkpoint", "rank_file"]

_RANK_FILE = re.compile(r"rank_(\d+)/checkpoint_rank(\d+)\.safetensors$")


def rank_file(rank: int) -> str:
    """The file of `rank`'s shards, relative to the checkpoint directory (MindSpore's
    `rank_<r>/` folder convention, which its transform tools look for)."""
    return f"rank_{rank}/checkpoint_rank{rank}.safetensors"


def save_checkpoint(model, directory, optimizer: Optional[nn.Optimizer] = None) -> Manifest:
    """Save `model` (and `optimizer`'s states) as a distributed checkpoint in `directory`.

    Every process calls it: in simulation the one process writes every virtual device's file,
    under msrun each process writes its own, and a plain Cell is one device.

    Args:
        model: a ParallelModel (`auto_parallelize`'s result) or a plain nn.Cell.
        directory: the checkpoint directory (created if missing; an older checkpoint there is
            replaced: its manifest first, its stale rank files last). Besides the rank files and
            `manifest.json` it gets `strategy.ckpt`, the layouts in MindSpore's strategy format.
        optimizer: the optimizer whose states to save too (built on the model's
            `optimizer_parameters()`), or None.

    Returns:
        The Manifest written.

    Raises:
        CheckpointError: bad arguments (named), a name used by both a parameter and an optimizer
            state, or a rank that failed to write (all processes raise, naming the ranks).
    """
    directory = _directory(directory)
    holdings = holdings_of(model, optimizer)
    entries = {t.name: _plan(t) for t in holdings.tensors}
    _check_unique_keys(holdings)
    manifest_path = os.path.join(directory, MANIFEST_NAME)
    error = None
    try:
        os.makedirs(directory, exist_ok=True)
        if holdings.lead and os.path.exists(manifest_path):
            os.remove(manifest_path)
        values: Dict[str, np.ndarray] = {}  # each held tensor read once, however many ranks write from it
        for rank in holdings.local_ranks:
            _write_rank(directory, rank, holdings, entries, values)
    except Exception as exc:  # every process must reach the agreement below
        error = exc
    _agree(holdings, error, "write its shards")
    manifest = None
    if holdings.lead:
        try:
            manifest = _manifest(directory, holdings, entries)
            manifest.write(directory)
            _remove_stale(directory, manifest)
        except Exception as exc:
            error = exc
    _agree(holdings, error, "write the manifest")
    return manifest if manifest is not None else Manifest.read(directory)


def _directory(directory) -> str:
    if not isinstance(directory, (str, os.PathLike)):
        raise CheckpointError(f"directory: expected a path, got {type(directory).__name__}")
    return os.fspath(directory)


def _plan(tensor: HeldTensor) -> TensorEntry:
    """The tensor's shards: one per distinct region among its holders, written by the lowest holder."""
    regions: Dict[Box, List[int]] = {}
    for rank in sorted(tensor.holders):
        regions.setdefault(tensor.box(rank), []).append(rank)
    shards = tuple(ShardEntry(box, rank_file(ranks[0]), tensor.name, ranks[0], tuple(ranks))
                   for box, ranks in regions.items())
    return TensorEntry(tensor.name, tensor.global_shape, tensor.dtype, tensor.layout.tensor_map,
                       tensor.layout.ms_tensor_map, tensor.state_of, shards)


def _check_unique_keys(holdings: Holdings) -> None:
    seen: Dict[str, str] = {}
    for t in holdings.tensors:
        if t.name in seen and seen[t.name] != t.section:
            raise CheckpointError(f"{t.name!r} names both a parameter and an optimizer state; the per-rank files "
                                  "keep both under their names, so they must differ")
        seen[t.name] = t.section


def _write_rank(directory: str, rank: int, holdings: Holdings, entries: Dict[str, TensorEntry],
                values: Dict[str, np.ndarray]) -> None:
    """Write the shards `rank` writes (none: no file) with `mindspore.save_checkpoint`."""
    items = []
    for t in holdings.tensors:
        for shard in entries[t.name].shards:
            if shard.writer != rank:
                continue
            if not t.held.contains(shard.box):
                raise CheckpointError(f"{t.section} {t.name!r}: rank {rank} writes {shard.box} but this process "
                                      f"holds only {t.held}")
            if t.name not in values:
                values[t.name] = t.param.asnumpy()
            data = np.ascontiguousarray(values[t.name][shard.box.within(t.held)])
            items.append({"name": shard.key, "data": Tensor(data, dtype=t.param.dtype)})
    if not items:
        return
    path = os.path.join(directory, rank_file(rank))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    deduplicated = any(len(s.replicas) > 1 for e in entries.values() for s in e.shards)
    ms.save_checkpoint(items, path, format="safetensors", remove_redundancy=deduplicated)


def _manifest(directory: str, holdings: Holdings, entries: Dict[str, TensorEntry]) -> Manifest:
    """The manifest of the written files; writes the MindSpore strategy file of the stored
    layouts beside it (or removes an older one when this mesh cannot be described)."""
    files = {}
    for entry in entries.values():
        for shard in entry.shards:
            if shard.file not in files:
                size = os.path.getsize(os.path.join(directory, shard.file))
                files[shard.file] = FileEntry(shard.writer, size)
    sections: Tuple[Dict[str, TensorEntry], Dict[str, TensorEntry]] = ({}, {})
    for t in holdings.tensors:
        sections[t.section == "optimizer"][t.name] = entries[t.name]
    optimizer = sections[1] if holdings.optimizer_class is not None else None
    strategy = None
    if not expressible(holdings.mesh) and os.path.exists(os.path.join(directory, STRATEGY_NAME)):
        os.remove(os.path.join(directory, STRATEGY_NAME))
    if expressible(holdings.mesh):
        strategy = STRATEGY_NAME
        write_strategy_file(os.path.join(directory, strategy), holdings.mesh,
                            [(e.name, e.ms_tensor_map) for e in entries.values()])
    return Manifest(holdings.mesh, holdings.mode, files, sections[0], optimizer, holdings.optimizer_class, strategy)


def _remove_stale(directory: str, manifest: Manifest) -> None:
    """Delete per-rank files of an older checkpoint in `directory` that this one does not list
    (only files named like ours), so tools that scan `rank_*/` see this checkpoint alone."""
    for path in glob.glob(os.path.join(directory, "rank_*", "checkpoint_rank*.safetensors")):
        relative = os.path.relpath(path, directory).replace(os.sep, "/")
        if _RANK_FILE.match(relative) and relative not in manifest.files:
            os.remove(path)


def _agree(holdings: Holdings, error: Optional[Exception], what: str) -> None:
    """All processes learn whether any failed to `what`; then all raise, or none."""
    failed = holdings.failed_ranks(error is not None)
    if error is not None:
        raise CheckpointError(f"save_checkpoint: rank {holdings.local_ranks[0]} failed to {what}: {error}") from error
    if failed:
        raise CheckpointError(f"save_checkpoint: rank(s) {failed} failed to {what}; see their errors")
