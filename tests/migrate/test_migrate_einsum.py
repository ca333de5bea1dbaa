"""torch.einsum -> the `einsum` helper: a table of equations against numpy.einsum in float64 (and torch where
torch's semantics differ from numpy's), the refusals, and a converted module at a second shape."""
import numpy as np
import pytest
import torch
import mindspore as ms

from mindspore_hyper.migrate import convert
from mindspore_hyper.migrate.generated_support import einsum
from mindspore_hyper.migrate.mappings.einsum import explicit_equation
from mindspore_hyper.migrate.mappings.registry import Unsupported

from migrate_models import assert_same_outputs

U = float(np.finfo(np.float32).eps) / 2  # float32 unit roundoff

CASES = [
    ("ij,jk", [(3, 4), (4, 5)]), ("ij,jk->ki", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ij->", [(3, 4)]), ("ij->j", [(3, 4)]), ("ba", [(3, 4)]), ("i,i->", [(5,), (5,)]), ("i,j->ij", [(3,), (4,)]),
    ("...ij,...jk->...ik", [(2, 3, 3, 4), (3, 4, 2)]),  # ellipses of different ranks, right-aligned
    ("bclhn,bcshn->bclsh", [(2, 3, 4, 2, 5), (2, 3, 4, 2, 5)]),  # Mamba-2's chunked scan (C . B)
    ("bclhn,bhcpn->bclhp", [(2, 3, 4, 2, 5), (2, 2, 3, 6, 5)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]), ("ij,ij->i", [(2, 1), (2, 3)]),  # a size-1 letter broadcasts
    ("b...,...->b...", [(2, 3, 4), (3, 4)]), ("aB,Bc", [(2, 3), (3, 4)]),  # upper case sorts before lower
    (",ij->ij", [(), (2, 3)]), ("...ij->...ji", [(2, 3, 4)]), ("ijk,ikl,m->jlm", [(2, 3, 4), (2, 4, 5), (3,)]),
    ("i j , j k -> i k", [(2, 3), (3, 4)]),
]


def _bound(equation, operands):
    """Higham's bound for float32 sums of products: each output element sums n products of k factors, so it is
    within (n + k) u of the exact value relative to the same sum of absolute values (k operands, n = the product
    of the sizes of the letters summed out)."""
    explicit = explicit_equation(equation, [o.ndim for o in operands])
    terms, output = explicit.split("->")
    sizes = {c: n for term, o in zip(terms.split(","), operands) for c, n in zip(term, o.shape)}
    summed = int(np.prod([n for c, n in sizes.items() if c not in output]))
    magnitude = np.einsum(explicit, *[np.abs(o).astype(np.float64) for o in operands])
    return (summed + len(operands)) * U * magnitude


@pytest.mark.parametrize("equation,shapes", CASES, ids=[c[0] for c in CASES])
def test_einsum_matches_numpy(equation, shapes):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    rng = np.random.default_rng(0)
    operands = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    want = np.einsum(equation, *[o.astype(np.float64) for o in operands])
    explicit = explicit_equation(equation, [len(s) for s in shapes])
    got = einsum(explicit, *[ms.Tensor(o) for o in operands]).asnumpy()
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= _bound(equation, operands))


def test_ellipsis_left_out_of_the_output_is_summed_as_in_torch():
    # numpy refuses `b...,...->b`; torch sums the ellipsis dimensions
    ms.set_context(mode=ms.PYNATIVE_MODE)
    a, b = torch.randn(2, 3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    explicit = explicit_equation("b...,...->b", [3, 2])
    assert explicit == "bAB,AB->b"
    got = einsum(explicit, ms.Tensor(a.float().numpy()), ms.Tensor(b.float().numpy())).asnumpy()
    want = torch.einsum("b...,...->b", a, b).numpy()
    bound = (12 + 2) * U * torch.einsum("b...,...->b", a.abs(), b.abs()).numpy()  # 12 products per output
    assert np.all(np.abs(got - want) <= bound)


@pytest.mark.parametrize("equation,ndims,message", [
    ("ii->i", [2], "letter 'i' appears twice in one operand (a diagonal)"),
    ("ij,jk", [2, 3], "term 'jk' does not fit an operand of rank 3"),
    ("ij,jk", [2], "has 2 operands, the call 1"),
    ("i1,1k", [2, 2], "'1' is not a letter"),
    ("ij->ii", [2], "the output repeats a letter"),
    ("ij->k", [2], "has one no operand has"),
    ("......i", [3], "more than one ellipsis"),
])
def test_unsupported_equations_are_refused_by_name(equation, ndims, message):
    with pytest.raises(Unsupported, match=message.replace("(", r"\(").replace(")", r"\)")):
        explicit_equation(equation, ndims)


class _Mixer(torch.nn.Module):
    """Einsum with an ellipsis, an implicit output and a parameter (a batch-general contraction)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(6, 5))

    def forward(self, x):
        scores = torch.einsum("btd,bsd->bts", x, x)
        return torch.einsum("...d,de", torch.einsum("bts,bsd->btd", scores.softmax(-1), x), self.w)


def test_converted_einsum_is_shape_general():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    torch.manual_seed(0)
    model = _Mixer().eval()
    cell, report = convert(model, torch.randn(2, 4, 6))
    assert {u.torch_op for u in report.uses} >= {"aten.einsum"}
    assert_same_outputs(cell, model, torch.randn(3, 7, 6))
