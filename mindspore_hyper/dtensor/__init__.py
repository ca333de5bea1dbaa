"""DTensor: a tensor laid out over a mesh, with the op dispatcher and per-op sharding rules.

Runtime-neutral: a DTensor holds the shards of the ranks its process owns (every virtual device
in simulation, one device under msrun); its `Execution` supplies the collectives.
"""
from mindspore_hyper import bfloat16_emulation
from mindspore_hyper.dtensor import interception, rules, shape_rules  # noqa: F401  (rules register themselves)
from mindspore_hyper.dtensor.dtensor import DTensor
from mindspore_hyper.dtensor.execution import Execution, ParameterSlot, distribute_tensor, lays_out

interception.install()
bfloat16_emulation.install(lays_out)  # mirrors the running Cells' mixed-precision types, refuses plain bfloat16 Cells

__all__ = ["DTensor", "Execution", "ParameterSlot", "distribute_tensor"]
