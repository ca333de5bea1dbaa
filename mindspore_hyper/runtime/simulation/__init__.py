"""CPU simulation mode: N virtual devices in one process, exact numerics, per-device reports."""
from mindspore_hyper.dtensor import DTensor, distribute_tensor
from mindspore_hyper.runtime.simulation.simulated_model import SimulatedModel
from mindspore_hyper.runtime.report import DeviceMemoryError, StepReport
from mindspore_hyper.runtime.simulation.runtime import SimulationRuntime, simulate

__all__ = ["DTensor", "distribute_tensor", "simulate", "SimulatedModel", "StepReport", "DeviceMemoryError",
           "SimulationRuntime"]
