"""Mamba's selective scan: the `selective_scan` helper against transformers' reference `mamba_selective_scan`
(forward and gradients, at two lengths), and a module calling a function of that name converted at one length
and run at another (the export keeps the length symbolic instead of unrolling the loop)."""
import numpy as np
import pytest
import torch
import mindspore as ms
from mindspore import ops
from transformers.models.mamba.modeling_mamba import mamba_selective_scan as reference

from mindspore_hyper.migrate import convert
from mindspore_hyper.migrate.generated_support import selective_scan
from mindspore_hyper.migrate.mappings.selective_scan import exported_scans

from migrate_models import assert_same_outputs

# Both sides run the same float32 operations in the same order; they differ in kernels (exp, the state-size
# matmul of 4 terms) by a few units of roundoff (6e-8) per step, and a state decays (|exp(A dt)| < 1), so over
# <= 11 steps the output is within ~(11 + 4) x 4 u = 3.6e-6 of torch relative to its largest value: 1e-5.
TOL = 1e-5


def _inputs(length, seed):
    """(hidden_states, dt, A, B, C, D, z, delta_bias) for 2 sequences, 3 channels, state size 4."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return (r(2, 3, length), r(2, 3, length), -torch.exp(r(3, 4)), r(2, 4, length), r(2, 4, length), r(3),
            r(2, 3, length), r(3))


@pytest.mark.parametrize("length", [5, 9])
def test_helper_matches_transformers_reference_and_its_gradients(length):
    ms.set_context(mode=ms.PYNATIVE_MODE)
    inputs = [t.requires_grad_() for t in _inputs(length, seed=length)]
    weights = torch.randn(2, 3, length, generator=torch.Generator().manual_seed(1))
    want = reference(*inputs, delta_softplus=True)
    (want * weights).sum().backward()

    def loss(*args):
        return (selective_scan(*args, delta_softplus=True) * ms.Tensor(weights.numpy())).sum()

    ms_inputs = [ms.Tensor(t.detach().numpy()) for t in inputs]
    got = selective_scan(*ms_inputs, delta_softplus=True).asnumpy()
    scale = np.abs(want.detach().numpy()).max()
    assert np.abs(got - want.detach().numpy()).max() <= TOL * scale
    grads = ops.grad(loss, grad_position=tuple(range(len(ms_inputs))))(*ms_inputs)
    for name, g, t in zip("hidden_states dt A B C D z delta_bias".split(), grads, inputs):
        error = np.abs(g.asnumpy() - t.grad.numpy()).max() / np.abs(t.grad.numpy()).max()
        assert error <= TOL, (name, error)


def mamba_selective_scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                         return_last_state=False, use_mambapy=False, use_associative_scan=False, **kwargs):
    """A modeling module's scan (the signature `exported_scans` looks for): transformers' reference."""
    return reference(hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, use_mambapy,
                     use_associative_scan, **kwargs)


class _Mixer(torch.nn.Module):
    """A Mamba mixer's scan with its projections (hidden 4, channels 3, state 2), calling the module global."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3 * 4)
        self.A_log = torch.nn.Parameter(torch.randn(3, 2))
        self.D = torch.nn.Parameter(torch.randn(3))
        self.out = torch.nn.Linear(3, 4)

    def forward(self, x):
        h, dt, z, bc = self.proj(x).transpose(1, 2).split([3, 3, 3, 3], dim=1)
        y = mamba_selective_scan(h, dt, -torch.exp(self.A_log), bc[:, :2], bc[:, 1:], self.D, z, None, True)
        return self.out(y.transpose(1, 2))


def test_module_calling_the_scan_converts_shape_general():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    torch.manual_seed(0)
    model = _Mixer().eval()
    cell, report = convert(model, torch.randn(2, 8, 4))
    assert "mindspore_hyper.selective_scan" in {u.torch_op for u in report.uses}
    assert_same_outputs(cell, model, torch.randn(3, 11, 4), tol=TOL)
    assert globals()["mamba_selective_scan"].__doc__.startswith("A modeling module's scan")  # restored after export


def test_calls_the_op_does_not_cover_keep_the_original():
    # the last state (a cache) is not an output of the op: the original function runs, with its own loop
    with exported_scans(_Mixer()):
        assert globals()["mamba_selective_scan"] is not mamba_selective_scan_original
        out, state = globals()["mamba_selective_scan"](*_inputs(4, seed=0), True, return_last_state=True)
    assert out.shape == (2, 3, 4) and state.shape == (2, 3, 4)
    assert globals()["mamba_selective_scan"] is mamba_selective_scan_original


mamba_selective_scan_original = mamba_selective_scan
