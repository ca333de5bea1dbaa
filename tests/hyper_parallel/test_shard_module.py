"""shard_module with a ShardingPlan (upstream's declarative form) against one device."""
import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn, ops

from mindspore_hyper.hyper_parallel import (
    DTensor, Replicate, Shard, ShardingPlan, distribute_tensor, init_device_mesh, laid_out_parameters, shard_module,
)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Dense(8, 16), nn.Dense(16, 4)

    def construct(self, x):
        return self.fc2(ops.relu(self.fc1(x)))


def test_shard_module_trains_like_one_device(fresh_session):
    fresh_session.set_context(device_num=4)
    ms.set_seed(2)
    model, reference = Net(), Net()
    for (_, p), (_, q) in zip(model.parameters_and_names(), reference.parameters_and_names()):
        q.set_data(Tensor(p.asnumpy()))
    mesh = init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "tp"))
    plan = ShardingPlan(plan={"fc1.weight": ("tp", "None"), "fc1.bias": (Replicate(), Shard(0)),
                              "fc2.weight": (Replicate(), Shard(1))},
                        input_plan={"input": (Shard(0), Replicate()), "fc2.input": (Shard(0), Shard(1))},
                        output_plan={"output": (Replicate(), Replicate())}, return_local_tensor=[""])
    shard_module(model, mesh, plan)
    placements = {k: v.placements for k, v in laid_out_parameters(model).items()}
    assert placements["fc1.weight"] == (Replicate(), Shard(0)) and placements["fc2.bias"] == (Replicate(), Replicate())
    rng = np.random.RandomState(0)
    x, y = Tensor(rng.randn(4, 8).astype(np.float32)), Tensor(rng.randn(4, 4).astype(np.float32))
    seen = model(distribute_tensor(x, mesh, [Replicate(), Replicate()]))
    assert not isinstance(seen, DTensor)  # return_local_tensor of the model: replicated output -> a plain tensor

    def steps(net, as_input):
        optimizer = nn.Adam(net.trainable_params(), learning_rate=1e-2)
        grad_fn = ms.value_and_grad(lambda x, y: ((net(as_input(x)) - y) ** 2).mean(), None, optimizer.parameters)
        out = []
        for _ in range(3):
            loss, grads = grad_fn(x, y)
            optimizer(grads)
            out.append(float(loss))
        return out

    np.testing.assert_allclose(steps(model, lambda x: distribute_tensor(x, mesh, [Replicate(), Replicate()])),
                               steps(reference, lambda x: x), rtol=1e-5)


def test_shard_module_names_what_does_not_exist(fresh_session):
    fresh_session.set_context(device_num=4)
    mesh = init_device_mesh("npu", (4,), mesh_dim_names=("tp",))
    with pytest.raises(ValueError, match=r"no parameter 'fc1.weigth' \(a full name, or a name inside a submodule\); nearest: \['fc1.weight'"):
        shard_module(Net(), mesh, ShardingPlan(plan={"fc1.weigth": (Shard(0),)}))
    with pytest.raises(ValueError, match="submodule 'fc3'"):
        shard_module(Net(), mesh, ShardingPlan(input_plan={"fc3.input": (Shard(0),)}))
    with pytest.raises(ValueError, match="must be 'output'"):
        shard_module(Net(), mesh, ShardingPlan(output_plan={"fc1.outputs": (Shard(0),)}))
    with pytest.raises(TypeError, match="must be a ShardingPlan"):
        shard_module(Net(), mesh, {"plan": {}})


class Layer(nn.Cell):
    def __init__(self, seed):
        super().__init__()
        self.weight = ms.Parameter(Tensor(np.random.RandomState(seed).randn(8, 8).astype(np.float32)), name="weight")

    def construct(self, x):
        return ops.tanh(ops.matmul(x, self.weight))


class Stack(nn.Cell):
    def __init__(self, keep=(0, 1, 2)):
        super().__init__()
        self.layers = nn.CellDict({str(i): Layer(i) for i in keep})

    def construct(self, x):
        for layer in self.layers.values():
            x = layer(x)
        return x


def test_plan_keys_inside_submodules_resolve_as_upstream(fresh_session):
    """Upstream's search: a key not a full name is looked up in the submodules, depth-first in
    definition order, and the first match is laid out (upstream's vpp_schedule keeps one layer
    per stage and names its Parameter "weight")."""
    fresh_session.set_context(device_num=4)
    mesh = init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "tp"))
    one = Stack(keep=(2,))
    shard_module(one, mesh, ShardingPlan(plan={"weight": (Replicate(), Shard(1))}))
    assert {k: v.placements for k, v in laid_out_parameters(one).items()} == {"layers.2.weight": (Replicate(), Shard(1))}

    model, reference = Stack(), Stack()
    shard_module(model, mesh, ShardingPlan(plan={"weight": (Shard(0), Replicate()), "1.weight": (Replicate(), Shard(1)),
                                                 "self.layers.2.weight": (Replicate(), Shard(0))}))
    placements = {k: v.placements for k, v in laid_out_parameters(model).items()}
    assert placements == {"layers.0.weight": (Shard(0), Replicate()), "layers.1.weight": (Replicate(), Shard(1)),
                          "layers.2.weight": (Replicate(), Shard(0))}
    x = np.random.RandomState(5).randn(4, 8).astype(np.float32)
    out = model(distribute_tensor(Tensor(x), mesh, [Replicate(), Replicate()]))
    # three tanh(8-term products) layers, products summed in another order over the split: a few ulps of |x| < 8
    np.testing.assert_allclose(out.full_tensor().asnumpy(), reference(Tensor(x)).asnumpy(), atol=1e-5)
    with pytest.raises(ValueError, match=r"no parameter '3.weight' .*nearest: \[.*'layers.0.weight'"):
        shard_module(Stack(), mesh, ShardingPlan(plan={"3.weight": (Shard(0), Replicate())}))


def test_custom_shard_runs_a_local_function_on_each_ranks_part(fresh_session):
    """A per-device softmax over the local columns (a function written for one device's shard),
    on a tensor split by rows: each rank's rows are whole, so it equals the global softmax."""
    from mindspore_hyper.hyper_parallel import custom_shard

    fresh_session.set_context(device_num=4)
    mesh = init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "tp"))
    x = np.random.RandomState(3).randn(8, 6).astype(np.float32)
    d = distribute_tensor(Tensor(x), mesh, [Replicate(), Replicate()])
    local_softmax = custom_shard(lambda t, scale: ops.softmax(t * scale, -1), mesh,
                                 out_placements=((Shard(0), Replicate()),),
                                 in_placements=((Shard(0), Replicate()), None))
    out = local_softmax(d, 2.0)
    assert isinstance(out, DTensor) and out.placements == (Shard(0), Replicate())
    np.testing.assert_allclose(out.full_tensor().asnumpy(), ops.softmax(Tensor(x) * 2.0, -1).asnumpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="in_placements has 1 entries for 2"):
        custom_shard(lambda t, s: t, mesh, ((Shard(0), Replicate()),), in_placements=((Shard(0), Replicate()),))(d, 2.0)
    with pytest.raises(ValueError, match="redistribute_inputs=False"):
        custom_shard(lambda t: t, mesh, ((Shard(0), Replicate()),), in_placements=((Shard(0), Replicate()),),
                     redistribute_inputs=False)(d)
