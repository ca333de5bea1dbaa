"""`save_checkpoint(model, directory, optimizer=None, step=None, keep_last=None, blocking=True,
snapshot="call")`: every rank's shards to a per-rank safetensors file of a new step directory,
committed atomically.

In the caller's thread: plan which rank writes which region (from the layouts alone: a region
held by several ranks is written once, by the lowest of them), agree with the other processes on
the step and a random save id (one small collective under msrun), and, for an asynchronous save,
take the snapshot of the host arrays (copies, so training may go on) or, with
`snapshot="background"`, their fingerprints and the optimizer's fence (`snapshot.py`). The
writing and the commit (`save_job.SaveJob`) then run in this thread, or in the background with
`blocking=False`.
"""
from __future__ import annotations

import functools
import json
import os
import secrets
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
from mindspore import nn

from mindspore_hyper.checkpoint.box import Box
from mindspore_hyper.checkpoint.checksums import CHUNK_BYTES
from mindspore_hyper.checkpoint.directory import newest_step, step_name
from mindspore_hyper.checkpoint.dtypes import safetensors_code
from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.checkpoint.holdings import HeldTensor, Holdings, holdings_of
from mindspore_hyper.checkpoint.manifest import Manifest, ShardEntry, TensorEntry
from mindspore_hyper.checkpoint.mindspore_strategy import STRATEGY_NAME, expressible, strategy_bytes
from mindspore_hyper.checkpoint.regions import rank_box
from mindspore_hyper.checkpoint.safetensors_writer import file_layout
from mindspore_hyper.checkpoint.save_handle import SaveHandle, wait_for_saves
from mindspore_hyper.checkpoint.save_job import RankFile, SaveJob, rank_file_metadata
from mindspore_hyper.checkpoint.snapshot import SNAPSHOT_MODES, Snapshot, remove_finished_fences

__all__ = ["save_checkpoint", "plan_save", "rank_file"]

_ID_WORDS = 4  # the save id: 4 x 16 random bits


def rank_file(rank: int) -> str:
    """The file of `rank`'s shards, relative to the step directory (MindSpore's `rank_<r>/`
    folder convention, which its transform tools look for)."""
    return f"rank_{rank}/checkpoint_rank{rank}.safetensors"


def save_checkpoint(model, directory, optimizer: Optional[nn.Optimizer] = None, *, step: Optional[int] = None,
                    keep_last: Optional[int] = None, blocking: bool = True, snapshot: str = "call",
                    chunk_bytes: int = CHUNK_BYTES,
                    extra_state: Optional[Mapping[str, Any]] = None) -> Union[Manifest, SaveHandle]:
    """Save `model` (and `optimizer`'s states) as the checkpoint step `directory/step_<N>`.

    Every process calls it: in simulation the one process writes every virtual device's file,
    under msrun each process writes its own, and a plain Cell is one device. The step appears
    complete or not at all; older steps are untouched until it is committed.

    Args:
        model: a ParallelModel (`auto_parallelize`'s result) or a plain nn.Cell.
        directory: the checkpoint directory (created if missing); leftovers of saves that did not
            commit are removed.
        optimizer: the optimizer whose states to save too (built on the model's
            `optimizer_parameters()`), or None.
        step: the step number, newer than every committed step; None: the newest + 1 (0 first).
        keep_last: after the commit, delete all but the newest `keep_last` (>= 1) steps; None keeps all.
        blocking: False returns at once after the snapshot, with a SaveHandle; the writing and the
            commit run in the background (the next save, a load of `directory` and the exit wait).
        snapshot: where an asynchronous save copies the host arrays: "call" (before it returns;
            the Parameters may then change in any way) or "background" (in the background thread
            before it writes; the call returns after the planning; needs `optimizer`, whose next
            call waits for the copy, as do `handle.wait_snapshot()`, a load, the next save and
            the exit; a Parameter changed otherwise before its copy fails the save, naming it).
        chunk_bytes: bytes per CRC32C checksum of the shards (a load reads whole chunks).
        extra_state: more state saved with the step, by name: an object with `state_dict()` (a
            `ShardedLoader`: its position, taken now) or JSON data; rank 0's is stored (it must be
            the same on every rank). `load_checkpoint(..., extra_state=)` restores it.

    Returns:
        The Manifest written (blocking), or the SaveHandle (`wait()` gives the Manifest).

    Raises:
        CheckpointError: bad arguments (named), a step not newer than the committed ones, a
            previous asynchronous save that failed, a name used by both a parameter and an
            optimizer state, or a rank that failed to write (all processes raise, naming it).
    """
    if not isinstance(blocking, bool):
        raise CheckpointError(f"blocking: expected a bool, got {blocking!r}")
    if snapshot not in SNAPSHOT_MODES:
        raise CheckpointError(f"snapshot: expected one of {list(SNAPSHOT_MODES)}, got {snapshot!r}")
    if snapshot == "background" and blocking:
        raise CheckpointError("snapshot='background' needs blocking=False (a blocking save writes straight from the "
                              "Parameters, it takes no snapshot)")
    if snapshot == "background" and optimizer is None:
        raise CheckpointError("snapshot='background' needs optimizer= (the optimizer whose next call waits for the "
                              "copy); without one nothing would keep the training from changing the Parameters "
                              "before they are copied: use snapshot='call'")
    handle = SaveHandle(plan_save(model, directory, optimizer, step=step, keep_last=keep_last,
                                  snapshot=None if blocking else snapshot, chunk_bytes=chunk_bytes,
                                  extra_state=extra_state))
    if not blocking:
        return handle.start()
    handle.run()
    return handle.wait()


def plan_save(model, directory, optimizer: Optional[nn.Optimizer] = None, *, step: Optional[int] = None,
              keep_last: Optional[int] = None, snapshot: Optional[str] = "call",
              chunk_bytes: int = CHUNK_BYTES, extra_state: Optional[Mapping[str, Any]] = None) -> SaveJob:
    """Everything a save does in the caller's thread: wait for this process's save in flight,
    plan the shards, agree on the step and save id (collective under msrun), and take the
    snapshot (or its fingerprints and the fence); returns the SaveJob that writes and commits
    (nothing is written yet).

    Args:
        snapshot: "call": copy the host arrays now (so the Parameters may change before the job
            runs); "background": the job copies them first, `optimizer`'s next call waits for
            it; None: the files are cut from the Parameters' own memory (the job must run before
            they change). Others: see `save_checkpoint`.

    Raises:
        CheckpointError: see `save_checkpoint`.
    """
    root = _directory(directory)
    for name, value, low in (("step", step, 0), ("keep_last", keep_last, 1), ("chunk_bytes", chunk_bytes, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise CheckpointError(f"{name}: expected an int >= {low}{' or None' if name != 'chunk_bytes' else ''}, "
                                  f"got {value!r}")
    extra = _extra_state(extra_state)
    wait_for_saves(root)
    remove_finished_fences()
    holdings = holdings_of(model, optimizer)
    entries = {t.name: _plan(t) for t in holdings.tensors}
    _check_unique_keys(holdings)
    step, save_id = _agree_on_step(holdings, root, step)
    me = holdings.local_ranks[0]
    deduplicated = any(len(s.replicas) > 1 for e in entries.values() for s in e.shards)
    files, taken = _rank_files(holdings, entries, snapshot, chunk_bytes, step, save_id, deduplicated)
    if snapshot == "call":
        taken.take()
    elif snapshot == "background":
        taken.fence(optimizer)
    return SaveJob(root, step, save_id, files, me, tuple(p for p in holdings.processes if p != me), holdings.lead,
                   _skeleton(holdings, entries, step, save_id, chunk_bytes, extra) if holdings.lead else None,
                   _strategy(holdings, entries) if holdings.lead else None,
                   deduplicated, chunk_bytes, keep_last,
                   _timeout(), taken)


def _directory(directory) -> str:
    if not isinstance(directory, (str, os.PathLike)):
        raise CheckpointError(f"directory: expected a path, got {type(directory).__name__}")
    return os.fspath(directory)


def _timeout() -> float:
    from mindspore_hyper.context import get_context

    return float(get_context("comm_timeout"))


def _plan(tensor: HeldTensor) -> TensorEntry:
    """The tensor's shards: one per distinct region among its holders, written by the lowest holder."""
    return _planned(tensor.name, tuple(tensor.global_shape), tensor.dtype, tensor.layout, tuple(tensor.holders),
                    tensor.state_of)


@functools.lru_cache(maxsize=1 << 14)  # every save of a model plans the same (a third of an asynchronous call)
def _planned(name: str, global_shape: Tuple[int, ...], dtype: str, layout, holders: Tuple[int, ...],
             state_of: Optional[str]) -> TensorEntry:
    regions: Dict[Box, List[int]] = {}
    for rank in sorted(holders):
        box = rank_box(layout, rank, global_shape)
        if box.volume:  # an empty torch.chunk piece (3 rows over 4 ranks: the last has none) stores nothing
            regions.setdefault(box, []).append(rank)
    shards = tuple(ShardEntry(box, rank_file(ranks[0]), name, ranks[0], tuple(ranks))
                   for box, ranks in regions.items())
    return TensorEntry(name, global_shape, dtype, layout.tensor_map, layout.ms_tensor_map, state_of, shards)


def _check_unique_keys(holdings: Holdings) -> None:
    seen: Dict[str, str] = {}
    for t in holdings.tensors:
        if t.name in seen and seen[t.name] != t.section:
            raise CheckpointError(f"{t.name!r} names both a parameter and an optimizer state; the per-rank files "
                                  "keep both under their names, so they must differ")
        seen[t.name] = t.section


def _agree_on_step(holdings: Holdings, root: str, requested: Optional[int]) -> Tuple[int, str]:
    """The step and save id every process uses: the lead's choice, after checking that every
    process asked for the same step (one collective under msrun)."""
    row = np.zeros(3 + _ID_WORDS, np.int64)
    row[0] = -1 if requested is None else requested
    problem = None
    if holdings.lead:
        newest = newest_step(root)
        chosen = requested if requested is not None else (0 if newest is None else newest + 1)
        if newest is not None and chosen <= newest:
            problem = (f"save_checkpoint: step {chosen} is not newer than the newest committed step {newest} in "
                       f"{root!r} (a load picks the newest step, so this one would be hidden); remove "
                       f"{step_name(newest)} and the steps after {chosen} first, or save a newer step")
        row[1], row[2] = (1 if problem is None else 2), chosen
        row[3:] = np.frombuffer(secrets.token_bytes(2 * _ID_WORDS), np.uint16)
    table = holdings.exchange(row)
    lead = table[min(holdings.mesh.ranks)]
    asked = {int(r): int(t[0]) for r, t in table.items()}
    if len(set(asked.values())) > 1:
        raise CheckpointError("save_checkpoint: the processes passed different step= values: " + ", ".join(
            f"rank {r}: {'None' if s < 0 else s}" for r, s in sorted(asked.items())))
    if problem is not None:
        raise CheckpointError(problem)
    if lead[1] != 1:
        raise CheckpointError(f"save_checkpoint: rank 0 refused to save step {int(lead[2])} into {root!r} (see its "
                              "error)")
    return int(lead[2]), "".join(f"{int(w):04x}" for w in lead[3:])


def _rank_files(holdings: Holdings, entries: Dict[str, TensorEntry], snapshot: Optional[str], chunk_bytes: int,
                step: int, save_id: str, deduplicated: bool):
    """The files this process writes, cut from the Parameters' host arrays (each read once), and
    with a `snapshot` mode the Snapshot that copies them into the files' images (not yet; None
    without)."""
    sources: Dict[Tuple[str, str], np.ndarray] = {}
    files: Dict[int, list] = {}
    for t in holdings.tensors:
        for shard in entries[t.name].shards:
            if shard.writer not in holdings.local_ranks:
                continue
            if not t.held.contains(shard.box):
                raise CheckpointError(f"{t.section} {t.name!r}: rank {shard.writer} writes {shard.box} but this "
                                      f"process holds only {t.held}")
            if (t.section, t.name) not in sources:
                sources[t.section, t.name] = t.held_array()  # shares the Parameter's memory (padding cut off)
            files.setdefault(shard.writer, []).append((shard.key, sources[t.section, t.name],
                                                       shard.box.within(t.held), safetensors_code(t.dtype)))
    out = tuple(RankFile(rank_file(rank), rank, tuple(sorted(items, key=lambda i: i[0])))
                for rank, items in sorted(files.items()))
    if snapshot is None:
        return out, None
    planned = []
    for f in out:
        tensors = [(key, source[slices].shape, source[slices].nbytes, code) for key, source, slices, code in f.tensors]
        layout = file_layout(tensors, rank_file_metadata(save_id, step, f.rank, deduplicated))
        planned.append((f.path, layout, [(key, source, slices) for key, source, slices, _ in f.tensors]))
    return out, Snapshot.plan(planned, chunk_bytes, background=snapshot == "background")


def _extra_state(extra_state: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """`save_checkpoint`'s extra_state as JSON data, taken now (`state_dict()` of the objects that have one).

    Raises:
        CheckpointError: not a mapping of names, or a value that is not JSON data (named).
    """
    if extra_state is None:
        return {}
    if not isinstance(extra_state, Mapping):
        raise CheckpointError(f"extra_state: expected a dict of name -> state, got {type(extra_state).__name__}")
    out = {}
    for name, value in extra_state.items():
        if not isinstance(name, str) or not name:
            raise CheckpointError(f"extra_state: names must be non-empty strings, got {name!r}")
        value = value.state_dict() if callable(getattr(value, "state_dict", None)) else value
        try:
            out[name] = json.loads(json.dumps(value))
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"extra_state[{name!r}]: not JSON data ({exc})") from None
    return out


def _skeleton(holdings: Holdings, entries: Dict[str, TensorEntry], step: int, save_id: str,
              chunk_bytes: int, extra_state: Optional[Dict[str, Any]] = None) -> Manifest:
    """The manifest without file sizes and checksums (the commit fills them in)."""
    sections: Tuple[Dict[str, TensorEntry], Dict[str, TensorEntry]] = ({}, {})
    for t in holdings.tensors:
        sections[t.section == "optimizer"][t.name] = entries[t.name]
    optimizer = sections[1] if holdings.optimizer_class is not None else None
    strategy = STRATEGY_NAME if _describable(holdings) else None
    return Manifest(holdings.mesh, holdings.mode, {}, sections[0], optimizer, holdings.optimizer_class, strategy,
                    step, save_id, chunk_bytes, dict(extra_state or {}))


def _describable(holdings: Holdings) -> bool:
    """Whether MindSpore's strategy format describes every stored layout: a mesh it can name
    (`expressible`) and no tensor split into uneven pieces (MindSpore's tools cut every shard
    of a dimension to the same size, so they would misread torch.chunk pieces)."""
    return expressible(holdings.mesh) and all(t.layout.is_even(t.global_shape) for t in holdings.tensors)


_strategy_cache: Dict[tuple, bytes] = {}  # the last save's strategy file (every save of one model has the same)


def _strategy(holdings: Holdings, entries: Dict[str, TensorEntry]) -> Optional[bytes]:
    """The MindSpore strategy file of the stored layouts, or None when the mesh cannot be
    described. The last one is kept: building it (protobuf in Python) costs about as much as
    the rest of an asynchronous save's call."""
    if not _describable(holdings):
        return None
    tensors = [(e.name, e.ms_tensor_map) for e in entries.values()]
    key = (holdings.mesh.device_matrix, holdings.mesh.alias_names, repr(tensors))
    if key not in _strategy_cache:
        _strategy_cache.clear()
        _strategy_cache[key] = strategy_bytes(holdings.mesh, tensors)
    return _strategy_cache[key]
