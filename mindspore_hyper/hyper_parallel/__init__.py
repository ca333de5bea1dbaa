"""The HyperParallel API (MindSpore's PyNative DTensor stack, `hyper_parallel`) on this package.

Scripts written for upstream's `hyper_parallel` run here unchanged: in simulation on one CPU
process holding every device, and under msrun one process per device.
`install_hyper_parallel()` makes `import hyper_parallel` (and the submodule paths upstream's
docs and MindFormers import) resolve here when no real `hyper_parallel` is installed;
`mindspore-hyper run script.py` does that and runs the script. Everything sits on the
package's own DTensor, meshes and runtimes. See docs/hyper_parallel.md for what is covered.
"""
from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.hyper_parallel.async_context_parallel import AsyncContextParallel
from mindspore_hyper.hyper_parallel.autodiff import SkipDTensorDispatch, parallelize_value_and_grad
from mindspore_hyper.hyper_parallel.autograd_compat import enable_mindspore_backward_compat
from mindspore_hyper.hyper_parallel.clip_grad import clip_grad_norm_, clip_grads_by_global_norm, global_grad_norm
from mindspore_hyper.hyper_parallel.checkpoint import cell_holdings  # noqa: F401 (mh.save_checkpoint of laid-out Cells)
from mindspore_hyper.hyper_parallel.comm_compute_overlap import CommComputeOverlap, HookCoordinator, HookRole
from mindspore_hyper.hyper_parallel.context_parallel import ContextParallel
from mindspore_hyper.hyper_parallel.custom_shard import custom_shard
from mindspore_hyper.hyper_parallel.device_mesh import DeviceMesh, get_current_mesh, init_device_mesh
from mindspore_hyper.hyper_parallel.distribute import (
    distribute_module, distribute_tensor, empty, full, laid_out_parameters, ones, rand, randn, zeros,
)
from mindspore_hyper.hyper_parallel.fully_shard import FSDPModule, fully_shard
from mindspore_hyper.hyper_parallel.fully_shard_policies import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from mindspore_hyper.hyper_parallel.hsdp import HSDPCell, hsdp, hsdp_sync_stream
from mindspore_hyper.hyper_parallel.hsdp_module import HSDPModule
from mindspore_hyper.hyper_parallel.init_weights import init_empty_weights, init_on_device, init_parameters
from mindspore_hyper.hyper_parallel.install import install_hyper_parallel
from mindspore_hyper.hyper_parallel.layout_form import mesh_and_placements  # noqa: F401 (from_local(x, layout))
from mindspore_hyper.hyper_parallel.pipeline_microbatches import BatchDimSpec
from mindspore_hyper.hyper_parallel.pipeline_order_check import (
    detect_cycle_in_graph, generate_operations, parse_and_validate, validate_pipeline_execution,
)
from mindspore_hyper.hyper_parallel.pipeline_schedule import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from mindspore_hyper.hyper_parallel.pipeline_stage import PipelineStage
from mindspore_hyper.hyper_parallel.pipeline_steps import MetaStep, MetaStepType
from mindspore_hyper.hyper_parallel.placement_types import Partial, Placement, Replicate, Shard, StridedShard
from mindspore_hyper.hyper_parallel.process_group import (
    ProcessGroup, destroy_process_group, get_backend, get_group_local_rank, get_process_group_ranks, get_rank,
    get_world_size, init_process_group, split_group,
)
from mindspore_hyper.hyper_parallel.session import RankDependentError
from mindspore_hyper.hyper_parallel.shard_module import ShardingPlan, shard_module
from mindspore_hyper.hyper_parallel.tensor_parallel import (
    ColwiseParallel, NoParallel, ParallelStyle, PrepareModuleInput, PrepareModuleInputOutput, PrepareModuleOutput,
    RowwiseParallel, SequenceParallel, parallelize_module,
)
from mindspore_hyper.shard.layout import Layout

__all__ = [
    "DTensor", "DeviceMesh", "init_device_mesh", "get_current_mesh", "RankDependentError", "Layout",
    "Shard", "Replicate", "Partial", "StridedShard", "Placement",
    "distribute_tensor", "distribute_module", "laid_out_parameters", "zeros", "ones", "full", "empty", "rand", "randn",
    "parallelize_module", "ParallelStyle", "ColwiseParallel", "RowwiseParallel", "SequenceParallel", "NoParallel",
    "PrepareModuleInput", "PrepareModuleOutput", "PrepareModuleInputOutput",
    "parallelize_value_and_grad", "SkipDTensorDispatch", "fully_shard", "FSDPModule",
    "ProcessGroup", "init_process_group", "destroy_process_group", "get_process_group_ranks", "get_backend",
    "split_group", "get_group_local_rank", "get_rank", "get_world_size",
    "install_hyper_parallel", "init_parameters", "init_empty_weights", "init_on_device", "shard_module", "ShardingPlan",
    "hsdp", "HSDPCell", "hsdp_sync_stream", "custom_shard",
    "PipelineStage", "ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "MetaStep", "MetaStepType",
    "BatchDimSpec", "validate_pipeline_execution", "generate_operations", "parse_and_validate",
    "detect_cycle_in_graph", "ContextParallel", "AsyncContextParallel", "CommComputeOverlap", "HookCoordinator", "HookRole",
    "HSDPModule", "MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy", "enable_mindspore_backward_compat",
    "clip_grad_norm_", "clip_grads_by_global_norm", "global_grad_norm",
]
