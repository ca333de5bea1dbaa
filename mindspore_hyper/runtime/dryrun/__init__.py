"""The dry-run mode: the model's own code on N devices, shapes and bytes only (docs/dryrun.md)."""
from mindspore_hyper.runtime.dryrun.runtime import DryRunRuntime

__all__ = ["DryRunRuntime"]
