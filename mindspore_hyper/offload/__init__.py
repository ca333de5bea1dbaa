"""HyperOffload: a versioned cache-block store over device / host DRAM / disk tiers with a
predictive prefetch scheduler, and offloaded training of models larger than device memory.

See docs/offload.md.
"""
from mindspore_hyper.offload.api import (OffloadedModel, OffloadPolicy, WorkingSetError, hyper_offload,
                                         maybe_offload)
from mindspore_hyper.offload.dry_run_offload import DryRunOffload
from mindspore_hyper.offload.shape_store import ShapeStore
from mindspore_hyper.offload.store import (CapacityError, CorruptBlockError, DiskError, OffloadStore,
                                           StoreError, TensorRef)
from mindspore_hyper.offload.tuning import TuneResult, tune_block_size, tune_prefetch_depth

__all__ = [
    "hyper_offload", "maybe_offload", "OffloadPolicy", "OffloadedModel", "WorkingSetError", "DryRunOffload",
    "ShapeStore",
    "OffloadStore", "TensorRef", "StoreError", "CapacityError", "DiskError", "CorruptBlockError",
    "tune_prefetch_depth", "tune_block_size", "TuneResult",
]
