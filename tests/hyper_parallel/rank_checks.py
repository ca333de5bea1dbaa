"""Run by test_msrun.py under `mindspore-hyper run --processes 4`: the rank-dependent parts of the
HyperParallel API (each rank's own from_local, process groups, a sub-mesh's ranks), then the
example's tensor-parallel Llama against one device. Exits non-zero on the first mismatch."""
import os
import sys

import numpy as np
from mindspore import Tensor

import hyper_parallel as hp
from hyper_parallel.core.dtensor.placement_types import Partial, Replicate, Shard

mesh = hp.init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "tp"))
rank = mesh.get_rank()
dp, tp = mesh.get_coordinate()
assert (mesh.get_local_rank("dp"), mesh.get_local_rank("tp")) == (dp, tp) == divmod(rank, 2)
assert sorted(mesh["tp"].mesh.tolist()) == [2 * dp, 2 * dp + 1]
assert mesh.get_group("dp").ranks == (tp, tp + 2)
assert hp.get_process_group_ranks() == [0, 1, 2, 3] and hp.get_group_local_rank(mesh.get_group("tp")) == tp
assert hp.split_group(split_ranks=[[0, 1], [2, 3]]).ranks == ((0, 1) if rank < 2 else (2, 3))

whole = np.arange(32, dtype=np.float32).reshape(4, 8)
mine = whole[dp * 2:(dp + 1) * 2, tp * 4:(tp + 1) * 4]  # this rank's shard, cut by its own rank
d = hp.DTensor.from_local(Tensor(mine), mesh, [Shard(0), Shard(1)], run_check=True)
np.testing.assert_array_equal(d.full_tensor().asnumpy(), whole)
np.testing.assert_array_equal(d.redistribute(mesh, [Replicate(), Shard(0)]).to_local().asnumpy(),
                              whole[tp * 2:(tp + 1) * 2])
partial = hp.DTensor.from_local(Tensor(np.full((2,), float(rank), np.float32)), mesh, [Partial("sum"), Partial("sum")])
np.testing.assert_array_equal(partial.full_tensor().asnumpy(), np.full((2,), 6.0, np.float32))
try:
    hp.DTensor.from_local(Tensor(mine), mesh, [Shard(0), Replicate()], run_check=True)
    raise AssertionError("run_check accepted different values on a Replicate dimension")
except ValueError as error:
    assert "hold different values" in str(error)
print(f"rank {rank}: rank-dependent API checks passed")

# ContextParallel as upstream uses it: each rank passes its own sequence shards of q, k, v and gets
# its shard of the attention output (Ulysses: AllToAll to heads and back; degree 1: k, v gathered)
from mindspore import nn as _nn, ops as _ops  # noqa: E402


def causal_core(q, k, v):
    q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
    n = k.shape[2]
    mask = Tensor(np.triu(np.full((n, n), -1e9, np.float32), 1))
    scores = _ops.matmul(q, k.transpose(0, 1, 3, 2)) / np.sqrt(q.shape[-1]) + mask
    return _ops.matmul(_ops.softmax(scores, -1), v).transpose(0, 2, 1, 3)


class Core(_nn.Cell):
    def construct(self, q, k, v):
        return causal_core(q, k, v)


cp_mesh = hp.init_device_mesh("npu", (4,), mesh_dim_names=("cp",))
qkv = [np.random.RandomState(i).randn(2, 8, 4, 3).astype(np.float32) for i in range(3)]
whole_out = causal_core(*[Tensor(a) for a in qkv]).asnumpy()
for degree in (None, 1):
    core = hp.ContextParallel(ulysses_degree=degree).apply(Core(), cp_mesh)
    mine_out = core(*[Tensor(a[:, rank * 2:(rank + 1) * 2]) for a in qkv])
    # float32, same values; the softmax sums <= 8 terms in another order: ~8 * 2^-24 relative
    np.testing.assert_allclose(mine_out.asnumpy(), whole_out[:, rank * 2:(rank + 1) * 2], rtol=1e-5, atol=1e-6)
print(f"rank {rank}: ContextParallel (Ulysses and gathered k/v) equals one device")

# fully_shard with each rank's own batch (torch's FSDP use): gradients averaged over the ranks,
# so 3 Adam steps equal one device's on the 4 batches concatenated (equal sizes: mean of means)
import mindspore as ms  # noqa: E402
from mindspore import nn, ops  # noqa: E402
from mindspore_hyper.hyper_parallel.fully_shard import fully_shard  # noqa: E402


class Mlp(nn.Cell):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Dense(8, 16), nn.Dense(16, 8)

    def construct(self, x):
        return self.down(ops.tanh(self.up(x)))


def adam_steps(model, x, y):
    optimizer = nn.Adam(model.trainable_params(), learning_rate=1e-2)
    grad_fn = ms.value_and_grad(lambda x, y: ((model(x) - y) ** 2).mean(), None, optimizer.parameters)
    for _ in range(3):
        optimizer(grad_fn(x, y)[1])


ms.set_seed(5)
sharded, reference = Mlp(), Mlp()
for (_, p), (_, q) in zip(sharded.parameters_and_names(), reference.parameters_and_names()):
    q.set_data(Tensor(p.asnumpy()))
dp_mesh = hp.init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
fully_shard(sharded, mesh=dp_mesh)
data = np.random.RandomState(7).randn(4, 2, 8).astype(np.float32)
target = np.random.RandomState(8).randn(4, 2, 8).astype(np.float32)
adam_steps(sharded, Tensor(data[rank]), Tensor(target[rank]))
adam_steps(reference, Tensor(data.reshape(8, 8)), Tensor(target.reshape(8, 8)))
from mindspore_hyper.hyper_parallel import laid_out_parameters  # noqa: E402

for name, value in laid_out_parameters(sharded).items():
    assert value.to_local().shape[0] == dict(reference.parameters_and_names())[name].shape[0] // 4  # ZeRO-3 piece
    # Adam moves weights by ~lr = 1e-2 per step; float32 rounding of the 4-way average is ~1e-7
    np.testing.assert_allclose(value.full_tensor().asnumpy(), dict(reference.parameters_and_names())[name].asnumpy(),
                               atol=1e-5, err_msg=name)
print(f"rank {rank}: fully_shard with per-rank batches trains like one device")

# upstream's distributed checkpoint: each rank writes its pieces; a plain model loads them whole
from hyper_parallel.core.distributed_checkpoint import load, save  # noqa: E402

save({"model": sharded.parameters_dict()}, checkpoint_id=os.environ["HP_CKPT"])
restored = Mlp()
load({"model": restored.parameters_dict()}, checkpoint_id=os.environ["HP_CKPT"])
for name, p in restored.parameters_and_names():
    np.testing.assert_array_equal(p.asnumpy(), laid_out_parameters(sharded)[name].full_tensor().asnumpy(), err_msg=name)
print(f"rank {rank}: distributed checkpoint round trip")

sys.path.insert(0, os.environ["HP_EXAMPLES"])
sys.argv = ["hyper_parallel_llama.py", "--tp", "4", "--steps", "2"]
import hyper_parallel_llama  # noqa: E402

hyper_parallel_llama.main()
