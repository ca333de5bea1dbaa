"""The module-structured conversion on constructs torch.export cannot trace as written (issue 38's FSMT, LED,
Longformer, T5Gemma 2 and X-MOD rows): sizes divided with torch.div, transformers' vmapped attention masks,
X-MOD's per-language adapters over a boolean row selection, `fill_` of a fresh tensor, a write of one value
through a mask of the leading dimensions, and the message for control flow on a tensor value. Each model is
converted at one shape and compared with torch at another (each test fails without its rewrite: torch.export
refuses the model, or the op has no mapping)."""
import pytest
import torch
from transformers.masking_utils import and_masks, bidirectional_mask_function, sdpa_mask

from mindspore_hyper.migrate import TraceFailedError, convert
from torch._subclasses.fake_tensor import FakeTensor

from mindspore_hyper.migrate.mask_expansion import broadcast_masks, check_broadcast_masks, export_with_broadcast_masks
from mindspore_hyper.migrate.size_division import size_quotient

from migrate_models import TOL, assert_same_outputs

pytestmark = pytest.mark.usefixtures("pynative")

# Tolerances: the tests below either compute exactly the same float32 ops on both sides (a sum of two values,
# an add, a where, 0/1 mask products) -- within a few units of float32 roundoff (u = 6e-8), so 1e-6 -- or run
# small Linear/LayerNorm stacks (contractions of <= 32 terms), for which migrate_models.TOL (1e-5) gives its
# derivation.
EXACT = 1e-6


class SizeChunks(torch.nn.Module):
    """Longformer's chunking: a size computed with torch.div (a tensor) and passed as a size."""

    def forward(self, x):
        chunks = torch.div(x.size(1), 2, rounding_mode="trunc")
        pairs = x.view(x.size(0), chunks, 2, x.size(2)).sum(2)
        return pairs + torch.zeros(x.size(0), chunks - 1 + 1, 1)


def test_a_size_divided_with_torch_div_stays_a_size():
    torch.manual_seed(0)
    model = SizeChunks()
    cell, report = convert(model, torch.randn(2, 8, 4))
    assert all(report.symbolic["x"][:2])  # batch and length symbolic: the Cell runs at (3, 6, 4)
    assert_same_outputs(cell, model, torch.randn(3, 6, 4), tol=EXACT)


def test_size_quotient_only_where_it_equals_torch_div():
    assert size_quotient(7, 2, "trunc") == 3 and size_quotient(7, 2, "floor") == 3
    assert size_quotient(-7, 2, "floor") == -4 == int(torch.div(-7, 2, rounding_mode="floor"))
    assert size_quotient(-7, 2, "trunc") is None  # trunc of a negative: left to torch.div (-3, not -4)
    assert size_quotient(7, 0, "floor") is None  # torch's own error
    assert size_quotient(7, 2, None) is None  # true division: a float tensor
    assert size_quotient(7.0, 2, "floor") is None and size_quotient(True, 2, "floor") is None


class ValueBranch(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x


def test_control_flow_on_a_tensor_value_is_named_with_its_line():
    with pytest.raises(TraceFailedError, match=r"control flow on a tensor value .*data-dependent.*"
                                               r"test_migrate_export_rewrites\.py:\d+ `if x.sum\(\) > 0:`"):
        convert(ValueBranch(), torch.randn(2, 8))


class FilledMask(torch.nn.Module):
    """FSMT's causal mask: `torch.zeros(n, n).float().fill_(min)` (aten.fill_ of a fresh tensor)."""

    def forward(self, x):
        return x + torch.triu(torch.zeros(x.size(1), x.size(1)).float().fill_(-2.5), diagonal=1)


def test_fill_of_a_fresh_tensor():
    cell, report = convert(FilledMask(), torch.randn(2, 8, 8))
    assert report.layers == {} and "fill" in " ".join(report.rewritten)
    assert_same_outputs(cell, FilledMask(), torch.randn(3, 5, 5), tol=EXACT)


class MarkedTokens(torch.nn.Module):
    """T5Gemma 2's embeddings: `e[ids == k] = v`, a (B, S) mask of a (B, S, H) tensor and one value row."""

    def __init__(self):
        super().__init__()
        self.marker = torch.nn.Parameter(torch.randn(4))

    def forward(self, x, ids):
        e = x * 2
        e[ids == 3] = self.marker
        return e


def test_one_value_written_through_a_mask_of_the_leading_dimensions():
    torch.manual_seed(0)
    model = MarkedTokens()
    ids = torch.tensor([[3, 1, 3, 0, 2, 3, 1, 1], [0, 0, 3, 1, 2, 2, 2, 3]])
    cell, _ = convert(model, (torch.randn(2, 8, 4), ids))
    ids = torch.tensor([[1, 3, 3, 0, 2], [3, 0, 1, 1, 2], [2, 2, 2, 2, 3]])
    assert_same_outputs(cell, model, torch.randn(3, 5, 4), ids, tol=EXACT)


def _window(width):
    def inner(batch_idx, head_idx, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= width
    return inner


class WindowedMixing(torch.nn.Module):
    """An attention mask from a custom mask function (T5Gemma 2's bidirectional sliding window): transformers
    builds it with torch.vmap."""

    def __init__(self, mask_function):
        super().__init__()
        self.mask_function = mask_function

    def forward(self, x):
        mask = sdpa_mask(batch_size=x.size(0), q_length=x.size(1), kv_length=x.size(1),
                         mask_function=and_masks(bidirectional_mask_function, self.mask_function),
                         allow_is_causal_skip=False, use_vmap=True)
        return torch.matmul(mask[:, 0].to(x.dtype), x)


def test_a_vmapped_attention_mask_is_built_by_broadcasting():
    model = WindowedMixing(_window(1))
    cell, report = convert(model, torch.randn(2, 8, 4))
    assert any("built by broadcasting" in n for n in report.notes)
    assert_same_outputs(cell, model, torch.randn(3, 6, 4), tol=EXACT)  # sums of <= 3 terms


def test_a_mask_function_that_is_not_index_based_stays_vmapped():
    def whole(batch_idx, head_idx, q_idx, kv_idx):  # one element under vmap, every element when broadcast
        return (q_idx + kv_idx).sum() < 5
    model = WindowedMixing(whole)
    replace, notes = check_broadcast_masks(model, (torch.randn(2, 8, 4),), {})
    assert not replace and "not index-based" in notes[0]
    with pytest.raises(TraceFailedError, match="torch.export cannot trace"):
        convert(model, torch.randn(2, 8, 4))


class CountedMixing(WindowedMixing):
    """WindowedMixing whose mask is built with torch.vmap (`vmapped`) or by broadcasting (transformers' default),
    optionally inside a try that falls back to no mask (a model that swallows errors); counts its eager runs
    (export runs it on FakeTensors)."""

    def __init__(self, vmapped, swallows=False):
        super().__init__(_window(1))
        self.vmapped, self.swallows, self.eager_runs = vmapped, swallows, 0

    def forward(self, x):
        self.eager_runs += not isinstance(x, FakeTensor)
        try:
            mask = sdpa_mask(batch_size=x.size(0), q_length=x.size(1), kv_length=x.size(1),
                             mask_function=and_masks(bidirectional_mask_function, self.mask_function),
                             allow_is_causal_skip=False, use_vmap=self.vmapped)
        except Exception:  # noqa: BLE001 - the fallback a model might have
            if not self.swallows:
                raise
            mask = torch.ones(x.size(0), 1, x.size(1), x.size(1), dtype=torch.bool)
        return torch.matmul(mask[:, 0].to(x.dtype), x)


@pytest.mark.parametrize("vmapped, swallows, exports, eager_runs", [
    (False, False, [False], 0),        # no vmapped mask: the one export is the result, no eager run
    (True, False, [False, True], 1),   # stopped at the vmapped mask, checked by one eager run, exported again
    (True, True, [False, True], 1),    # the model caught the stop: still checked and exported again
])
def test_the_mask_check_runs_the_model_only_when_it_builds_a_vmapped_mask(vmapped, swallows, exports, eager_runs):
    model, x, calls = CountedMixing(vmapped, swallows), torch.randn(2, 8, 4), []

    def export(broadcast):
        calls.append(broadcast)
        with broadcast_masks(broadcast):
            return torch.export.export(model, (x,), strict=False)
    program, broadcast, notes = export_with_broadcast_masks(export, model, (x,), {})
    assert (calls, model.eager_runs, broadcast, len(notes)) == (exports, eager_runs, vmapped, int(vmapped))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), CountedMixing(False)(x), rtol=0, atol=0)  # same 0/1 sums


def xmod_output():
    from transformers import XmodConfig
    from transformers.models.xmod.modeling_xmod import XmodOutput

    torch.manual_seed(0)
    config = XmodConfig(hidden_size=16, intermediate_size=32, languages=["en_XX", "de_DE", "fr_XX"],
                        hidden_dropout_prob=0.0)
    return XmodOutput(config).eval()


def test_xmod_language_adapters_over_a_row_selection():
    model = xmod_output()
    g = torch.Generator().manual_seed(1)
    first = (torch.randn(4, 8, 32, generator=g), torch.randn(4, 8, 16, generator=g), torch.tensor([0, 2, 2, 1]))
    cell, report = convert(model, first)
    assert any("X-MOD language-adapter" in n for n in report.notes)
    second = (torch.randn(3, 5, 32, generator=g), torch.randn(3, 5, 16, generator=g), torch.tensor([1, 1, 0]))
    assert_same_outputs(cell, model, *second, tol=TOL)
