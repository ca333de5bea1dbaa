"""Distributed checkpoints, crash-safe: each save is a new step directory of per-rank safetensors
files plus a layout manifest, committed atomically and checksummed (CRC32C); load into any
strategy or world size, each process reading only the checksummed chunks of the regions it holds.

`save_checkpoint(model, directory, optimizer=None, step=None, keep_last=None, blocking=True)` and
`load_checkpoint(model, directory, optimizer=None, step=None)`; see docs/checkpoint.md.
"""
from mindspore_hyper.checkpoint.directory import committed_steps, newest_step
from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.checkpoint.load import LoadReport, load_checkpoint
from mindspore_hyper.checkpoint.manifest import Manifest
from mindspore_hyper.checkpoint.mindspore_strategy import save_strategy_file
from mindspore_hyper.checkpoint.save import save_checkpoint
from mindspore_hyper.checkpoint.save_handle import SaveHandle, wait_for_saves
from mindspore_hyper.checkpoint.staging import release_staging

__all__ = ["save_checkpoint", "load_checkpoint", "save_strategy_file", "newest_step", "committed_steps",
           "wait_for_saves", "release_staging", "SaveHandle", "LoadReport", "Manifest", "CheckpointError"]
