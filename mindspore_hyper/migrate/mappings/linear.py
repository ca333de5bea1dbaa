"""Dense layers and matrix products: nn.Linear -> nn.Dense, linear/matmul/mm/bmm/addmm/baddbmm."""
import operator

import torch
import torch.nn.functional as F

from mindspore_hyper.migrate.mappings.common import call
from mindspore_hyper.migrate.mappings.registry import function, method, module

aten = torch.ops.aten


# nn.Dense refuses 0 features (MobileBERT's `predictions.dense` under a small config has 0 outputs and is only read
# as a weight): such a Linear is converted from its traced program instead, keeping its (empty) parameters.
@module(torch.nn.Linear, "nn.Dense", params={"weight": "weight", "bias": "bias"},
        accepts=lambda m: m.in_features > 0 and m.out_features > 0)
def dense(m: torch.nn.Linear) -> str:
    # torch Linear.weight is (out, in), the layout nn.Dense keeps: weights copy unchanged.
    return f"nn.Dense({m.in_features}, {m.out_features}, has_bias={m.bias is not None})"


@function("mint.nn.functional.linear", F.linear, aten.linear)
def linear(input, weight, bias=None):
    return call("mint.nn.functional.linear", input, weight, bias)


@function("mint.matmul", aten.matmul, torch.matmul, method("matmul"), operator.matmul, aten.mm, torch.mm,
          method("mm"))
def matmul(self, other=None, mat2=None):
    return call("mint.matmul", self, mat2 if other.value is None else other)


@function("mint.bmm", aten.bmm, torch.bmm, method("bmm"))
def bmm(self, mat2):
    return call("mint.bmm", self, mat2)


def _scaled_product(product: str, bias, beta, alpha) -> str:
    """beta * bias + alpha * product, leaving out factors equal to 1 (mint.addmm/baddbmm have no CPU kernel)."""
    beta, alpha = beta.const("beta"), alpha.const("alpha")
    scaled = product if alpha == 1 else f"mint.mul({product}, {alpha!r})"
    if beta == 0:
        return scaled
    biased = str(bias) if beta == 1 else f"mint.mul({bias}, {beta!r})"
    return f"mint.add({scaled}, {biased})"


@function("mint.matmul + mint.add", aten.addmm, torch.addmm, method("addmm"))
def addmm(self, mat1, mat2, beta=1, alpha=1):
    return _scaled_product(call("mint.matmul", mat1, mat2), self, beta, alpha)


@function("mint.bmm + mint.add", aten.baddbmm, torch.baddbmm, method("baddbmm"))
def baddbmm(self, batch1, batch2, beta=1, alpha=1):
    return _scaled_product(call("mint.bmm", batch1, batch2), self, beta, alpha)
