"""CPU simulation mode: N virtual devices in one process, exact numerics, per-device reports."""
from mindspore_hyper.sim import interception, rules  # noqa: F401  (rules register themselves)
from mindspore_hyper.sim.dtensor import DTensor, distribute_tensor
from mindspore_hyper.sim.parallelize import SimulatedModel, simulate
from mindspore_hyper.sim.report import DeviceMemoryError, SimulationReport

interception.install()

__all__ = ["DTensor", "distribute_tensor", "simulate", "SimulatedModel", "SimulationReport", "DeviceMemoryError"]
