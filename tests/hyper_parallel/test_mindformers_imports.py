"""Every `hyper_parallel` import of the mindformers-2.0.0 wheel resolves through the shim: the
names this package provides are its own objects, those it cannot run import and refuse at use
(naming why), the Ascend-only kernels refuse at the import (MindFormers catches that)."""
import importlib

import pytest

from mindspore_hyper.hyper_parallel import install_hyper_parallel
from mindspore_hyper.hyper_parallel.refused_names import REFUSED, NotProvidedError, refused_value

# (module, name) of every `from hyper_parallel... import ...` in the mindformers-2.0.0 wheel's source
MINDFORMERS_IMPORTS = (
    ("hyper_parallel", "DTensor"), ("hyper_parallel", "DeviceMesh"), ("hyper_parallel", "SkipDTensorDispatch"),
    ("hyper_parallel", "init_device_mesh"), ("hyper_parallel", "shard_module"), ("hyper_parallel", "PipelineStage"),
    ("hyper_parallel", "DFunction"),
    ("hyper_parallel.core.dtensor", "DTensor"),
    ("hyper_parallel.core.dtensor.dtensor", "DTensor"), ("hyper_parallel.core.dtensor.dtensor", "distribute_tensor"),
    ("hyper_parallel.core.dtensor.placement_types", "Placement"),
    ("hyper_parallel.core.dtensor.placement_types", "Shard"),
    ("hyper_parallel.core.dtensor.placement_types", "Replicate"),
    ("hyper_parallel.core.dtensor.layout", "_infer_slice_area_by_rank"),
    ("hyper_parallel.core.dtensor.redistribute_infer", "RedistributionOperatorInfer"),
    ("hyper_parallel.core.distributed_checkpoint", "get_global_layout"),
    ("hyper_parallel.core.shard.sharding_plan", "ShardingPlan"),
    ("hyper_parallel.core.fully_shard.api", "fully_shard"),
    ("hyper_parallel.core.fully_shard.api", "MixedPrecisionPolicy"),
    ("hyper_parallel.core.fully_shard.api", "HSDPModule"),
    ("hyper_parallel.core.fully_shard.utils", "OffloadPolicy"),
    ("hyper_parallel.core.fully_shard.utils", "CPUOffloadPolicy"),
    ("hyper_parallel.core.pipeline_parallel.scheduler", "MetaStepType"),
    ("hyper_parallel.core.pipeline_parallel.hook_coordinator", "HookRole"),
    ("hyper_parallel.core.pipeline_parallel.hook_coordinator", "HookCoordinator"),
    ("hyper_parallel.core.pipeline_parallel.comm_compute_overlap", "CommComputeOverlap"),
    ("hyper_parallel.core.context_parallel.context_parallel", "ContextParallel"),
    ("hyper_parallel.core.context_parallel.async_context_parallel", "AsyncContextParallel"),
    ("hyper_parallel.core.activation_checkpoint", "CheckpointPolicy"),
    ("hyper_parallel.core.activation_checkpoint", "checkpoint_wrapper"),
    ("hyper_parallel.core.activation_checkpoint", "swap_wrapper"),
    ("hyper_parallel.core.activation_checkpoint", "SwapManager"),
    ("hyper_parallel.platform", "get_platform"),
    ("hyper_parallel.platform.mindspore.autograd_compat", "enable_mindspore_backward_compat"),
)
ASCEND_KERNELS = ("npu_mhc_post", "npu_mhc_pre_sinkhorn", "npu_sparse_attn_shared_kv", "npu_lightning_indexer_v2",
                  "npu_sparse_lightning_indexer_grad_kl_loss_v2")


def test_every_mindformers_import_resolves():
    import mindspore_hyper.hyper_parallel as ours

    assert install_hyper_parallel() is True
    for path, name in MINDFORMERS_IMPORTS:
        value = getattr(importlib.import_module(path), name)
        if name not in REFUSED and name != "get_platform":
            assert value is getattr(ours, name), f"{path}.{name}"
    for name in ASCEND_KERNELS:
        with pytest.raises(ImportError, match=f"{name}: an Ascend-only kernel"):
            exec(f"from hyper_parallel.custom_ops.experimental import {name}", {})  # noqa: S102


def test_refused_names_import_and_refuse_at_use():
    install_hyper_parallel()
    from hyper_parallel import DFunction
    from hyper_parallel.core.activation_checkpoint import CheckpointPolicy

    class AllGatherMatmul(DFunction):  # MindFormers subclasses it at import (its MC2 layers)
        @staticmethod
        def forward(ctx, x):
            return x

    with pytest.raises(NotProvidedError, match="DFunction.apply: upstream's custom autograd Function"):
        AllGatherMatmul.apply(1)
    with pytest.raises(NotProvidedError, match="CheckpointPolicy.MUST_SAVE: upstream's selective activation"):
        CheckpointPolicy.MUST_SAVE  # noqa: B018
    for name in REFUSED:
        value = refused_value(name)
        with pytest.raises(NotProvidedError, match=name):
            value()
    with pytest.raises(KeyError, match="not a refused upstream name"):
        refused_value("DTensor")
