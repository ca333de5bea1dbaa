"""Distributed checkpoints: per-rank safetensors files plus a layout manifest; load into any
strategy or world size, each process reading only the byte ranges of the regions it holds.

`save_checkpoint(model, directory, optimizer=None)` and `load_checkpoint(model, directory,
optimizer=None)`; see docs/checkpoint.md for the format.
"""
from mindspore_hyper.checkpoint.errors import CheckpointError
from mindspore_hyper.checkpoint.load import LoadReport, load_checkpoint
from mindspore_hyper.checkpoint.manifest import Manifest
from mindspore_hyper.checkpoint.mindspore_strategy import save_strategy_file
from mindspore_hyper.checkpoint.save import save_checkpoint

__all__ = ["save_checkpoint", "load_checkpoint", "save_strategy_file", "LoadReport", "Manifest", "CheckpointError"]
