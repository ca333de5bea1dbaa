"""CheckpointError: every way a checkpoint cannot be saved or loaded, with a message naming it."""
from __future__ import annotations

__all__ = ["CheckpointError"]


class CheckpointError(ValueError):
    """A checkpoint directory, manifest, file or model does not fit (the message says which and why)."""
