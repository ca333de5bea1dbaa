"""Simulation mode: forward and gradients equal single-device MindSpore runs."""
import numpy as np
import pytest
from mindspore import Tensor, nn, ops
from mindspore.ops import operations as P


from sim_models import MLP, TinyLM, TransformerBlock
from sim_checks import MESHES, assert_same_as_single_device, tp_strategy

RNG = np.random.default_rng(0)



@pytest.mark.parametrize("mesh_name,kind", [
    ("8", "data"), ("2x4", "column"), ("2x4", "row"), ("2x4", "column+row"), ("2x2x2", "column+row"),
])
def test_mlp(mesh_name, kind):
    mesh = MESHES[mesh_name]
    model = MLP()
    s = mesh(tensor_map=())
    if "column" in kind:
        s.override("fc1.*", "tensor")
    if "row" in kind:
        s.override("fc2.weight", None, "tensor")
    assert_same_as_single_device(model, s, Tensor(RNG.standard_normal((8, 16)).astype(np.float32)))


@pytest.mark.parametrize("mesh_name,kind", [
    ("8", "data"), ("2x4", "tensor"), ("2x4", "sequence"), ("2x2x2", "tensor+sequence"),
])
def test_transformer_block(mesh_name, kind):
    mesh = MESHES[mesh_name]
    x = Tensor(RNG.standard_normal((8, 8, 32)).astype(np.float32))
    if kind == "data":
        s = mesh(tensor_map=())
    elif kind == "tensor":
        s = tp_strategy(mesh)
    elif kind == "sequence":
        s = mesh(tensor_map=(), input_map=("data", "tensor"))
    else:
        s = tp_strategy(mesh, input_map=("data", "seq"))
    sim = assert_same_as_single_device(TransformerBlock(), s, x)
    report = sim.report()
    assert report.fallbacks == {}
    if kind == "tensor":  # one AllReduce after each row-parallel layer (attention proj, mlp down)
        assert report.comm["AllReduce"]["tensor"]["count"] == 2


@pytest.mark.parametrize("mesh_name", ["2x4", "2x2x2"])
def test_embedding_lm_head_cross_entropy(mesh_name):
    mesh = MESHES[mesh_name]
    ids = Tensor(RNG.integers(0, 64, (8, 8)).astype(np.int32))
    labels = Tensor(RNG.integers(0, 64, (8, 8)).astype(np.int32))
    s = tp_strategy(mesh)
    s.override("embed.*", "tensor")  # vocabulary-parallel embedding (masked lookup + AllReduce)
    s.override("head.weight", "tensor")  # vocabulary-parallel LM head
    sim = assert_same_as_single_device(TinyLM(), s, ids, labels)
    assert sim.report().fallbacks == {}


def test_shard_annotated_primitives_seed_example():
    class Block(nn.Cell):  # the seed's migrated TransformerBlock, with its P.Add().shard(...)
        def __init__(self):
            super().__init__()
            self.attn = nn.Dense(16, 16)
            self.mlp = nn.Dense(16, 16)
            self.add = P.Add().shard(((1, 1), (1, 1)))

        def construct(self, x):
            x = self.add(x, self.attn(x))
            return self.add(x, self.mlp(x))

    mesh = MESHES["2x4"]
    s = mesh(tensor_map=())
    s.override("attn.weight", None, "tensor")  # row parallel: its output is Partial
    sim = assert_same_as_single_device(Block(), s, Tensor(RNG.standard_normal((8, 16)).astype(np.float32)))
    # (1,1) asks for replicated inputs: the batch split by 'data' is gathered before each Add
    assert sim.report().comm["AllGather"]["data"]["count"] >= 2


def test_shard_with_layout_and_int_strategy_split():
    mesh = MESHES["2x4"]
    ms_layout = mesh.to_mindspore()

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(16, 16)
            self.mul = P.Mul().shard((ms_layout("None", "tensor"), ms_layout("None", "tensor")))
            self.relu = P.ReLU().shard(((4, 1),))

        def construct(self, x):
            y = self.fc(x)
            return self.relu(self.mul(y, y))

    sim = assert_same_as_single_device(Net(), mesh(tensor_map=()),
                                       Tensor(RNG.standard_normal((8, 16)).astype(np.float32)))
    comm = sim.report().comm
    assert "AllToAll" in comm or "AllGather" in comm  # inputs moved to the requested layouts


def test_replication_fallback_is_correct_and_reported():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(8, 8)

        def construct(self, x):
            return ops.diagonal(self.fc(x))  # no sharding rule for Diagonal

    sim = assert_same_as_single_device(Net(), MESHES["2x4"](tensor_map=()),
                                       Tensor(RNG.standard_normal((8, 8)).astype(np.float32)))
    assert sum(sim.report().fallbacks.values()) >= 1


def test_rmsnorm_and_reductions_on_sharded_hidden():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(16, 16)

        def construct(self, x):
            y = self.fc(x)
            rms = ops.rsqrt((y * y).mean(-1, keep_dims=True) + 1e-6)
            return y * rms + y.max(-1, keepdims=True) + y.sum(0)

    s = MESHES["2x4"](tensor_map=())
    s.override("fc.*", "tensor")  # hidden sharded: mean/max over it become Partial, then reduced
    assert_same_as_single_device(Net(), s, Tensor(RNG.standard_normal((8, 16)).astype(np.float32)))
