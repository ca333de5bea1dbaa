"""Dropout: nn.Dropout -> nn.Dropout (follows Cell.set_train); functional dropout -> ops.dropout or nothing."""
import torch
import torch.nn.functional as F

from mindspore_hyper.migrate.mappings.common import call
from mindspore_hyper.migrate.mappings.registry import Alias, function, module

aten = torch.ops.aten


@module(torch.nn.Dropout, "nn.Dropout")
def dropout_module(m: torch.nn.Dropout) -> str:
    return f"nn.Dropout(p={m.p!r})"


def _dropout(input, p, active: bool):
    # The training flag was fixed when torch traced the call: an inactive dropout is the identity.
    if not active or p.const("p") == 0:
        return Alias(input)
    return call("ops.dropout", input, p=p, training=True)


@function("ops.dropout", aten.dropout, foldable=False)
def dropout(input, p, train):
    return _dropout(input, p, bool(train.const("train")))


@function("ops.dropout", F.dropout, foldable=False)
def dropout_functional(input, p=0.5, training=True, inplace=False):
    return _dropout(input, p, bool(training.const("training")))
