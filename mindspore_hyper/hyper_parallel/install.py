"""`import hyper_parallel` resolved to this package when upstream's package is not installed.

`install_hyper_parallel()` registers modules under upstream's import paths (those its docs,
tests and MindFormers 2.0 import) whose names are this package's objects. A name upstream has
and this package does not provide yet is refused at import with what is missing (`NOT_PROVIDED`),
never a stand-in; a few that MindFormers imports with every model but uses only for features a
script may leave off import and refuse at use instead (`refused_names.py`).
"""
from __future__ import annotations

import importlib.util
import sys
import types
from typing import Dict, Iterable

from mindspore_hyper.hyper_parallel.refused_names import REFUSED, refused_value

__all__ = ["install_hyper_parallel", "MODULES", "NOT_PROVIDED"]

_PACKAGE = "mindspore_hyper.hyper_parallel"

# upstream module path -> names it exports here (each resolved from this package's API)
MODULES: Dict[str, Iterable[str]] = {
    "hyper_parallel": (
        "ShardingPlan", "DTensor", "hsdp", "HSDPCell", "hsdp_sync_stream", "custom_shard", "DeviceMesh", "init_device_mesh", "get_current_mesh", "Layout", "distribute_module",
        "distribute_tensor", "parallelize_value_and_grad", "SkipDTensorDispatch", "ParallelStyle",
        "parallelize_module", "init_process_group", "destroy_process_group", "get_process_group_ranks", "get_backend",
        "split_group", "get_group_local_rank", "get_platform", "shard_module", "fully_shard", "init_parameters",
        "init_empty_weights", "init_on_device", "PipelineStage", "ScheduleGPipe", "Schedule1F1B",
        "ScheduleInterleaved1F1B", "MetaStep", "MetaStepType", "BatchDimSpec", "ContextParallel",
        "AsyncContextParallel", "DFunction"),
    "hyper_parallel.core": (),
    "hyper_parallel.core.dtensor": ("DTensor", "DeviceMesh", "init_device_mesh", "distribute_tensor",
                                    "distribute_module", "Shard", "Replicate", "Partial", "StridedShard", "Placement",
                                    "Layout", "zeros", "ones", "full", "empty", "rand", "randn"),
    "hyper_parallel.core.dtensor.dtensor": ("DTensor", "SkipDTensorDispatch", "distribute_module",
                                            "distribute_tensor"),
    "hyper_parallel.core.dtensor.placement_types": ("Placement", "Shard", "Replicate", "Partial", "StridedShard"),
    "hyper_parallel.core.placement_types": ("Placement", "Shard", "Replicate", "Partial", "StridedShard"),
    "hyper_parallel.core.layout": ("Layout", "DeviceMesh"),
    "hyper_parallel.core.device_mesh": ("DeviceMesh", "init_device_mesh", "get_current_mesh"),
    "hyper_parallel.core.dtensor.device_mesh": ("DeviceMesh", "init_device_mesh", "get_current_mesh"),
    "hyper_parallel.core.dtensor.layout": ("Layout", "DeviceMesh", "_infer_slice_area_by_rank"),
    "hyper_parallel.core.dtensor.redistribute_infer": ("RedistributionOperatorInfer",),
    "hyper_parallel.core.dtensor.parameter_init": ("init_parameters",),
    "hyper_parallel.core.dtensor.init_weights": ("init_empty_weights", "init_on_device"),
    "hyper_parallel.core.tensor_parallel": ("ColwiseParallel", "RowwiseParallel", "SequenceParallel",
                                            "PrepareModuleInput", "PrepareModuleOutput", "PrepareModuleInputOutput",
                                            "NoParallel", "ParallelStyle", "parallelize_module"),
    "hyper_parallel.core.tensor_parallel.style": ("ColwiseParallel", "RowwiseParallel", "SequenceParallel",
                                                  "PrepareModuleInput", "PrepareModuleOutput",
                                                  "PrepareModuleInputOutput", "NoParallel", "ParallelStyle"),
    "hyper_parallel.core.tensor_parallel.api": ("parallelize_module",),
    "hyper_parallel.core.shard": ("parallelize_value_and_grad", "shard_module", "ShardingPlan"),
    "hyper_parallel.core.shard.api": ("parallelize_value_and_grad", "shard_module"),
    "hyper_parallel.core.shard.sharding_plan": ("ShardingPlan",),
    "hyper_parallel.core.shard.custom_shard": ("custom_shard",),
    "hyper_parallel.core.shard.local_func": ("custom_shard",),
    "hyper_parallel.collectives": (),
    "hyper_parallel.collectives.cc": ("init_process_group", "destroy_process_group", "get_process_group_ranks",
                                      "get_backend", "split_group", "get_group_local_rank"),
    "hyper_parallel.platform": ("get_platform",),
    "hyper_parallel.platform.mindspore": (),
    "hyper_parallel.platform.mindspore.autograd_compat": ("enable_mindspore_backward_compat",),
    "hyper_parallel.platform.mindspore.hsdp": (),
    "hyper_parallel.platform.mindspore.hsdp.scheduler": ("MindSporeHSDPScheduler",),
    "hyper_parallel.core.fully_shard": ("fully_shard", "FSDPModule", "HSDPModule", "MixedPrecisionPolicy",
                                        "OffloadPolicy", "CPUOffloadPolicy"),
    "hyper_parallel.core.fully_shard.api": ("fully_shard", "FSDPModule", "HSDPModule", "MixedPrecisionPolicy"),
    "hyper_parallel.core.fully_shard.utils": ("MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy"),
    "hyper_parallel.core.hsdp": ("hsdp", "HSDPCell", "hsdp_sync_stream"),
    "hyper_parallel.core.hsdp.api": ("hsdp", "HSDPCell", "hsdp_sync_stream"),
    "hyper_parallel.core.pipeline_parallel": ("PipelineStage", "ScheduleGPipe", "Schedule1F1B",
                                              "ScheduleInterleaved1F1B", "MetaStep", "MetaStepType", "BatchDimSpec"),
    "hyper_parallel.core.pipeline_parallel.stage": ("PipelineStage",),
    "hyper_parallel.core.pipeline_parallel.scheduler": ("ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B",
                                                        "MetaStep", "MetaStepType", "validate_pipeline_execution",
                                                        "generate_operations", "parse_and_validate",
                                                        "detect_cycle_in_graph"),
    "hyper_parallel.core.pipeline_parallel.utils": ("BatchDimSpec",),
    "hyper_parallel.core.pipeline_parallel.comm_compute_overlap": ("CommComputeOverlap",),
    "hyper_parallel.core.pipeline_parallel.hook_coordinator": ("HookCoordinator", "HookRole"),
    "hyper_parallel.core.context_parallel": ("ContextParallel", "AsyncContextParallel"),
    "hyper_parallel.core.context_parallel.context_parallel": ("ContextParallel",),
    "hyper_parallel.core.context_parallel.async_context_parallel": ("AsyncContextParallel",),
    "hyper_parallel.core.distributed_checkpoint": ("save", "load", "get_global_layout"),
    "hyper_parallel.core.activation_checkpoint": ("CheckpointPolicy", "checkpoint_wrapper", "swap_wrapper",
                                                  "SwapManager"),
    "hyper_parallel.core.utils": ("clip_grad_norm_",),
    "hyper_parallel.core.utils.clip_grad": ("clip_grad_norm_",),
    "hyper_parallel.custom_ops": (),
    "hyper_parallel.custom_ops.experimental": (),
}

# upstream names not provided yet, with the reason a script gets
NOT_PROVIDED: Dict[str, str] = {
    name: "not provided by mindspore_hyper yet (docs/hyper_parallel.md lists what is)"
    for name in ("mark_created_groups", "SharedParameterInfo",
                 "PipelineScheduleRuntime", "add_send_recv")
}
# Ascend-only kernels (upstream's `custom_ops.experimental`; its callers catch the ImportError)
NOT_PROVIDED.update({
    name: "an Ascend-only kernel; no CPU implementation is provided by mindspore_hyper"
    for name in ("npu_mhc_post", "npu_mhc_pre_sinkhorn", "npu_sparse_attn_shared_kv", "npu_lightning_indexer_v2",
                 "npu_sparse_lightning_indexer_grad_kl_loss_v2")
})


class _Platform:
    """Upstream's `get_platform()` answer for MindSpore: the framework's tensor and Cell types."""

    name = "mindspore"

    def __init__(self):
        import mindspore as ms
        from mindspore import nn

        from mindspore_hyper.dtensor.dtensor import DTensor

        self.Tensor, self.Parameter, self.Module, self.DTensorBase = ms.Tensor, ms.Parameter, nn.Cell, DTensor

    @staticmethod
    def get_rank() -> int:
        """This process's job rank (msrun, a per-rank simulation's thread; refused in the plain simulation)."""
        from mindspore_hyper.hyper_parallel.process_group import get_rank

        return get_rank()

    @staticmethod
    def get_world_size() -> int:
        """The job's device count."""
        from mindspore_hyper.hyper_parallel.process_group import get_world_size

        return get_world_size()

    @staticmethod
    def create_group(rank_list, group_name=None) -> str:
        """A named process group (`process_group.create_group`)."""
        from mindspore_hyper.hyper_parallel.process_group import create_group

        return create_group(rank_list, group_name)


def get_platform() -> _Platform:
    """The platform object upstream scripts ask for (MindSpore here)."""
    return _Platform()


def _value(name: str):
    if name == "get_platform":
        return get_platform
    if name == "MindSporeHSDPScheduler":
        from mindspore_hyper.hyper_parallel.hsdp_graph_pass import MindSporeHSDPScheduler

        return MindSporeHSDPScheduler
    if name in ("save", "load"):
        from mindspore_hyper.hyper_parallel import checkpoint

        return getattr(checkpoint, name)
    if name in REFUSED:
        return refused_value(name)
    package = importlib.import_module(_PACKAGE)
    return getattr(package, name)


def _module(path: str, names: Iterable[str]) -> types.ModuleType:
    module = types.ModuleType(path, f"HyperParallel's {path}, provided by mindspore_hyper")
    module.__path__ = []  # a package: its submodules are registered beside it
    module.__provided_by__ = "mindspore_hyper"
    for name in names:
        if name not in NOT_PROVIDED:
            setattr(module, name, _value(name))

    def __getattr__(name: str):
        if name in NOT_PROVIDED:
            raise ImportError(f"{path}.{name}: {NOT_PROVIDED[name]}")
        raise AttributeError(f"module {path!r} (provided by mindspore_hyper) has no attribute {name!r}")

    module.__getattr__ = __getattr__
    return module


def _real_package_installed() -> bool:
    """Whether an importable `hyper_parallel` with an `__init__.py` exists (a bare folder of that
    name on sys.path, such as a tests folder, is a namespace package, not upstream's)."""
    spec = importlib.util.find_spec("hyper_parallel")
    return spec is not None and spec.origin not in (None, "namespace")


def install_hyper_parallel(verbose: bool = False) -> bool:
    """Make `import hyper_parallel` resolve to this package, unless a real one is importable.

    Args:
        verbose: print what was done.

    Returns:
        True when installed (or already installed), False when a real `hyper_parallel` exists
        (nothing is changed: on Ascend, upstream's package runs the script).
    """
    current = sys.modules.get("hyper_parallel")
    if current is not None and getattr(current, "__provided_by__", None) == "mindspore_hyper":
        return True
    if current is not None or _real_package_installed():
        if verbose:
            print("mindspore_hyper: a real hyper_parallel is installed; using it (nothing installed)")
        return False
    for path, names in MODULES.items():
        sys.modules[path] = _module(path, names)
    for path in MODULES:
        parent, _, child = path.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, sys.modules[path])
    if verbose:
        print("mindspore_hyper: `import hyper_parallel` now resolves to mindspore_hyper.hyper_parallel")
    return True
