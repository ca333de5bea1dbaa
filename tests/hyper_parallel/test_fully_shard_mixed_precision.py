"""fully_shard with torch FSDP2's mixed-precision recipe, `MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32)`: float32 master Parameters sharded over 4 simulated devices, the gathered
copies cast to bfloat16 for compute (CPU: `cpu_bfloat16="emulate"`), gradients reduced and kept in
float32. Trained against one device doing the same casts: MindSpore's `Cell.to_float(bfloat16)` on
the same layers (float32 Parameters cast to bfloat16 at each kernel, float32 gradients through
the casts), run in the one-device simulation so the emulation runs its bfloat16 kernels."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from mindspore_hyper import Layout, auto_parallelize
from mindspore_hyper.hyper_parallel import Shard, distribute_tensor, init_device_mesh, laid_out_parameters
from mindspore_hyper.hyper_parallel.fully_shard import fully_shard
from mindspore_hyper.hyper_parallel.fully_shard_policies import MixedPrecisionPolicy

STEPS, LR = 3, 1e-2
U = 2.0 ** -8  # bfloat16's unit roundoff (8 significant bits)


class Body(nn.Cell):
    """MindSpore's own layers: Dense, ReLU, Dense, LayerNorm."""

    def __init__(self):
        super().__init__()
        self.up, self.down, self.norm = nn.Dense(8, 16), nn.Dense(16, 8), nn.LayerNorm((8,))

    def construct(self, x):
        return self.norm(self.down(ops.relu(self.up(x))))


class Scaled(nn.Cell):
    """A hand-written layer: x * w + b with its own Parameters (no nn layer)."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(3)
        self.w = Parameter(Tensor(rng.standard_normal((4, 8)).astype(np.float32)), name="w")
        self.b = Parameter(Tensor(rng.standard_normal((4, 8)).astype(np.float32)), name="b")

    def construct(self, x):
        return x.reshape(-1, 4, 8) * self.w + self.b


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.body, self.scaled = Body(), Scaled()

    def construct(self, x):
        return self.scaled(self.body(x))


class AsFloat32(nn.Cell):
    """The reference's output cast (what `output_dtype=float32` does on the sharded model)."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, x):
        return self.net(x).astype(ms.float32)


def _data():
    rng = np.random.default_rng(0)
    return (Tensor(rng.standard_normal((8, 8)).astype(np.float32)),
            Tensor(rng.standard_normal((2, 4, 8)).astype(np.float32)))


def _train(model, params, x, y):
    """STEPS Adam steps on the mean squared error; (losses, float32 gradients of the first step)."""
    optimizer = nn.Adam(params, learning_rate=LR)
    grad_fn = ms.value_and_grad(lambda x, y: ((model(x) - y) ** 2).mean(), None, optimizer.parameters)
    losses, first = [], None
    for _ in range(STEPS):
        loss, grads = grad_fn(x, y)
        assert all(g.dtype == ms.float32 for g in grads), "gradients of float32 masters are float32"
        first = first or [g.asnumpy() for g in grads]
        optimizer(grads)
        losses.append(float(loss))
    return losses, first


def _reference(session, weights, x, y):
    """One device with the same casts: the layers under `to_float(bfloat16)`, output cast to float32."""
    session.set_context(device_num=1, cpu_bfloat16="emulate")
    net = Net()
    for (_, p), w in zip(net.parameters_and_names(), weights):
        p.set_data(Tensor(w))
    net.body.to_float(ms.bfloat16)
    net.scaled.to_float(ms.bfloat16)
    model = auto_parallelize(AsFloat32(net), Layout((1,), ("data",))(tensor_map=()))
    losses, grads = _train(model, model.trainable_params(), x, y)
    return losses, grads, [p.asnumpy() for _, p in net.parameters_and_names()]


@pytest.mark.parametrize("nested", [False, True], ids=["root-only", "blocks-then-root"])
def test_bf16_compute_fp32_reduce_trains_like_one_device_with_the_same_casts(fresh_session, nested):
    ms.set_seed(0)
    x, y = _data()
    weights = [p.asnumpy() for _, p in Net().parameters_and_names()]
    want_losses, want_grads, want_params = _reference(fresh_session, weights, x, y)

    fresh_session.set_context(device_num=4, cpu_bfloat16="emulate")
    net = Net()
    for (_, p), w in zip(net.parameters_and_names(), weights):
        p.set_data(Tensor(w))
    mesh = init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
    policy = MixedPrecisionPolicy(param_dtype=ms.bfloat16, reduce_dtype=ms.float32)
    if nested:
        fully_shard(net.body, mesh=mesh, mp_policy=policy)
    fully_shard(net, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=ms.bfloat16, reduce_dtype=ms.float32,
                                                               output_dtype=ms.float32))
    assert laid_out_parameters(net)["body.up.weight"].placements == (Shard(0),)
    assert all(p.dtype == ms.float32 for p in net.get_parameters()), "the sharded masters stay float32"
    got_losses, got_grads = _train(net, net.trainable_params(), x, y)

    # Both runs make the same roundings of the same values (float32 -> bfloat16 of weights and
    # inputs, each emulated kernel's float32 result rounded once), so they can differ only where
    # a float32 accumulation order differs and moves a result across a bfloat16 rounding
    # boundary: at most one bfloat16 ulp (2u relative) per rounded result. The loss passes 5
    # rounded results (2 Dense, LayerNorm, the scale and the shift): rtol 5 * 2u.
    np.testing.assert_allclose(got_losses[0], want_losses[0], rtol=5 * 2 * U)
    for got, want in zip(got_grads, want_grads):  # the backward passes the same 5 roundings again: 10 * 2u normwise
        assert np.linalg.norm(got - want) <= 10 * 2 * U * np.linalg.norm(want)
    # Adam moves each weight by at most ~lr per step whatever the gradient's size (m / sqrt(v) <= 1
    # in magnitude for its first steps): a gradient element near 0 whose sign differs moves a weight
    # by at most 2 lr per step, so the parameters agree within 2 * lr * STEPS, and the losses within
    # the loss bound per step (rtol 5 * 2u * STEPS).
    np.testing.assert_allclose(got_losses, want_losses, rtol=5 * 2 * U * STEPS)
    for (name, p), want in zip(net.parameters_and_names(), want_params):
        np.testing.assert_allclose(p.asnumpy(), want, atol=2 * LR * STEPS, err_msg=name)


def test_casts_act_and_a_float32_reduce_is_needed(fresh_session):
    """Without `output_dtype` the Cell returns its bfloat16 compute result; with
    `cast_forward_inputs=False` a float32 input meets bfloat16 weights and MindSpore promotes the
    product to float32 (so the flag acts); the gradients of the masters are float32."""
    fresh_session.set_context(device_num=4, cpu_bfloat16="emulate")
    mesh = init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
    x, _ = _data()
    net = fully_shard(Scaled(), mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=ms.bfloat16,
                                                                        reduce_dtype=ms.float32))
    assert net(x).dtype == ms.bfloat16
    grads = ms.grad(lambda x: net(x).astype(ms.float32).sum(), None, net.trainable_params())(x)
    assert [g.dtype for g in grads] == [ms.float32, ms.float32]
    # d/db of sum(x * w + b): the batch's 2 rows of 1 per element, exact in bfloat16 and float32
    np.testing.assert_array_equal(grads[1].asnumpy(), np.full((4, 8), 2.0, np.float32))
    uncast = fully_shard(Scaled(), mesh=mesh, mp_policy=MixedPrecisionPolicy(
        param_dtype=ms.bfloat16, reduce_dtype=ms.float32, cast_forward_inputs=False))
    assert uncast(x).dtype == ms.float32
    out32 = fully_shard(Scaled(), mesh=mesh, mp_policy=MixedPrecisionPolicy(
        param_dtype=ms.bfloat16, reduce_dtype=ms.float32, output_dtype=ms.float32))
    np.testing.assert_array_equal(out32(x).asnumpy(), net(x).astype(ms.float32).asnumpy())


def test_bad_policy_values_are_refused_naming_the_field(fresh_session):
    fresh_session.set_context(device_num=4, cpu_bfloat16="emulate")
    mesh = init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
    for field, value in (("param_dtype", "bf16"), ("reduce_dtype", ms.int32), ("output_dtype", np.float32)):
        with pytest.raises(ValueError, match=rf"mp_policy\.{field}=.*expected None or a floating MindSpore dtype"):
            fully_shard(Scaled(), mesh=mesh, mp_policy=MixedPrecisionPolicy(**{field: value}))
    with pytest.raises(ValueError, match=r"mp_policy\.cast_forward_inputs=1\): expected a bool"):
        fully_shard(Scaled(), mesh=mesh, mp_policy=MixedPrecisionPolicy(cast_forward_inputs=1))
    # reduce_dtype None means param_dtype (torch): a bfloat16 reduction of float32 masters is refused
    with pytest.raises(ValueError, match=r"reduce_dtype=BFloat16 \(None: param_dtype's.*pass reduce_dtype=Float32"):
        fully_shard(Scaled(), mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=ms.bfloat16))
    with pytest.raises(ValueError, match=r"reduce_dtype=Float16\): the Parameters are \['Float32'\]"):
        fully_shard(Scaled(), mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=ms.bfloat16,
                                                                       reduce_dtype=ms.float16))
    # a global batch would sum the ranks' gradients at the bfloat16 copy: refused when the Cell runs
    net = fully_shard(Scaled(), mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=ms.bfloat16,
                                                                        reduce_dtype=ms.float32))
    x, _ = _data()
    with pytest.raises(ValueError, match=r"param_dtype=BFloat16\): the inputs are DTensors split over the "
                                         r"data-parallel mesh.*'w' would be summed in BFloat16"):
        net(distribute_tensor(x, mesh, [Shard(0)]))
