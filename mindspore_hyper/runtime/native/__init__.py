"""Native mode: strategies handed to MindSpore's own semi-auto parallel (Ascend/GPU)."""
from mindspore_hyper.runtime.native.runtime import NativeRuntime
from mindspore_hyper.runtime.native.translate import NativePlan, apply_native, native_mesh

__all__ = ["NativeRuntime", "NativePlan", "apply_native", "native_mesh"]
