"""Host rules compute the optimizer Cells' updates: several steps of nn.Adam / nn.SGD (their
options) against the same steps of the MindSpore optimizer, and no rule where the Cell would do
something the rule does not (weight decay, AdamWeightDecay, AMSGrad, learning-rate schedules)."""
import numpy as np
import pytest

from mindspore import Parameter, Tensor, nn

from mindspore_hyper import _core
from mindspore_hyper.offload.host_optimizer import host_rule

pytestmark = pytest.mark.usefixtures("pynative")

WITH_RULE = {
    "adam": lambda ps: nn.Adam(ps, learning_rate=0.01),
    "adam_nesterov": lambda ps: nn.Adam(ps, learning_rate=0.01, beta1=0.8, beta2=0.99, eps=1e-6,
                                        use_nesterov=True),
    "sgd": lambda ps: nn.SGD(ps, learning_rate=0.05),
    "sgd_momentum": lambda ps: nn.SGD(ps, learning_rate=0.05, momentum=0.9),
    "sgd_nesterov": lambda ps: nn.SGD(ps, learning_rate=0.05, momentum=0.9, nesterov=True),
    "sgd_dampening": lambda ps: nn.SGD(ps, learning_rate=0.05, momentum=0.9, dampening=0.3),
}
WITHOUT_RULE = {
    "adam_weight_decay": lambda ps: nn.Adam(ps, learning_rate=0.01, weight_decay=0.1),
    "adam_amsgrad": lambda ps: nn.Adam(ps, learning_rate=0.01, use_amsgrad=True),
    "adam_loss_scale": lambda ps: nn.Adam(ps, learning_rate=0.01, loss_scale=2.0),
    "adam_schedule": lambda ps: nn.Adam(ps, learning_rate=[0.01, 0.005, 0.001], ),
    "adamw": lambda ps: nn.AdamWeightDecay(ps, learning_rate=0.01),
    "sgd_weight_decay": lambda ps: nn.SGD(ps, learning_rate=0.05, weight_decay=0.1),
    "momentum": lambda ps: nn.Momentum(ps, learning_rate=0.05, momentum=0.9),
}


def optimizer_and_states(factory, values):
    params = [Parameter(Tensor(v.copy()), name=f"p{i}") for i, v in enumerate(values)]
    opt = factory(params)
    own = {id(p) for p in params}
    return params, opt, [sp for _, sp in opt.parameters_and_names() if id(sp) not in own]


@pytest.mark.parametrize("name", sorted(WITH_RULE))
@pytest.mark.parametrize("contiguous", [True, False])
def test_rule_matches_the_optimizer_cell(name, contiguous):
    rng = np.random.default_rng(0)
    values = [rng.standard_normal((48, 16)).astype(np.float32), rng.standard_normal((16,)).astype(np.float32)]
    params, opt, states = optimizer_and_states(WITH_RULE[name], values)
    rule = host_rule(opt, states)
    assert rule is not None
    if contiguous:
        host_params = [v.copy() for v in values]
    else:  # strided views: the numpy path instead of the C++ one
        host_params = [np.repeat(v[..., None], 2, axis=-1)[..., 0] for v in values]
        assert not host_params[0].flags.c_contiguous
    host_states = [s.asnumpy().copy() for s in states]
    for _ in range(6):
        grads = [rng.standard_normal(v.shape).astype(np.float32) for v in values]
        opt(tuple(Tensor(g) for g in grads))
        rule.step(host_params, host_states, grads)
    for p, h in zip(params, host_params):
        np.testing.assert_allclose(h, p.asnumpy(), rtol=1e-6, atol=1e-7)
    for s, h in zip(states, host_states):
        np.testing.assert_allclose(h, s.asnumpy(), rtol=1e-6, atol=1e-7, err_msg=s.name)


@pytest.mark.parametrize("name", sorted(WITHOUT_RULE))
def test_no_rule_where_the_cell_does_more(name):
    values = [np.ones((4, 4), np.float32)]
    _, opt, states = optimizer_and_states(WITHOUT_RULE[name], values)
    assert host_rule(opt, states) is None


def test_no_rule_for_other_dtypes():
    values = [np.ones((4, 4), np.float16)]
    _, opt, states = optimizer_and_states(WITH_RULE["adam"], values)
    assert host_rule(opt, states) is None


def test_adam_step_checks_its_arrays():
    a = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="same size"):
        _core.adam_step(a, a.copy(), a.copy(), np.zeros(7, np.float32), 0.1, 0.9, 0.999, 1e-8, False)
    with pytest.raises(ValueError, match="C-contiguous"):
        _core.adam_step(np.zeros(16, np.float32)[::2], a.copy(), a.copy(), a.copy(), 0.1, 0.9, 0.999, 1e-8, False)
    readonly = a.copy()
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        _core.adam_step(readonly, a.copy(), a.copy(), a.copy(), 0.1, 0.9, 0.999, 1e-8, False)
