"""Sharding rules, one module per op family; importing this package registers them all."""
from mindspore_hyper.dtensor.rules import (  # noqa: F401  (imported for registration)
    along_dims, convolution, elementwise, embedding, hooks, indexing, joining, matmul, normalization, recurrent,
    reduction, shape,
)
from mindspore_hyper.dtensor.rules.registry import RULES, Decision, register

__all__ = ["RULES", "Decision", "register"]
