"""Run by test_msrun.py under `mindspore-hyper run --processes 4`: the rank-dependent parts of the
HyperParallel API (each rank's own from_local, process groups, a sub-mesh's ranks), meshes
smaller than the job, a tensor-parallel pipeline (pipeline_tp_script.py: 2 pipeline ranks x 2),
then the example's tensor-parallel Llama against one device. Exits non-zero on the first mismatch."""
import os
import sys

import numpy as np
from mindspore import Tensor

import hyper_parallel as hp
from hyper_parallel.core.dtensor.placement_types import Partial, Replicate, Shard


def _hsdp_on_no_mesh():
    """Before any mesh is made: hsdp of a plain Cell is data parallel over the whole job (upstream's),
    split over shard_size=2 consecutive ranks. Each rank's own batch; the summed gradient of a sum loss
    is one device's on the 4 batches concatenated, this rank's rows of it (float32 sums of 12 products
    per entry, a few ulp apart: rtol 1e-5)."""
    import mindspore as _ms
    from mindspore import nn as _nn_, ops as _ops_

    class _Net(_nn_.Cell):
        def __init__(self):
            super().__init__()
            self.weight = _ms.Parameter(Tensor(np.arange(32, dtype=np.float32).reshape(8, 4) / 10 - 1.2), name="w")

        def construct(self, x):
            return _ops_.relu(_ops_.matmul(x, self.weight)).sum()

    me = int(os.environ["RANK_ID"])
    batches = [np.random.RandomState(10 + r).randn(3, 8).astype(np.float32) for r in range(4)]
    whole = _Net()
    reference = _ms.value_and_grad(whole, None, whole.trainable_params())(Tensor(np.concatenate(batches)))[1][0]
    model = hp.hsdp(_Net(), shard_size=2, threshold=0)
    piece = _ms.value_and_grad(model, None, model.trainable_params())(Tensor(batches[me]))[1][0]
    np.testing.assert_allclose(piece.asnumpy(), reference.asnumpy()[(me % 2) * 4:(me % 2) * 4 + 4], rtol=1e-5,
                               atol=1e-6)
    print(f"rank {me}: hsdp of a Cell on no mesh sums the whole job's gradients, this rank's rows")


_hsdp_on_no_mesh()
mesh = hp.init_device_mesh("npu", (2, 2), mesh_dim_names=("dp", "tp"))
rank = mesh.get_rank()
dp, tp = mesh.get_coordinate()
assert (mesh.get_local_rank("dp"), mesh.get_local_rank("tp")) == (dp, tp) == divmod(rank, 2)
assert sorted(mesh["tp"].mesh.tolist()) == [2 * dp, 2 * dp + 1]
assert mesh.get_group("dp").ranks == (tp, tp + 2)
assert hp.get_process_group_ranks() == [0, 1, 2, 3] and hp.get_group_local_rank(mesh.get_group("tp")) == tp
assert hp.split_group(split_ranks=[[0, 1], [2, 3]]).ranks == ((0, 1) if rank < 2 else (2, 3))
# groups by name, as upstream's MindSpore platform names them; a mesh over groups (DeviceMesh.from_group)
pair = f"pair{rank // 2}"
hp.split_group(None, [[0, 1], [2, 3]], pg_options=pair)
assert hp.get_process_group_ranks(pair) == [2 * dp, 2 * dp + 1] and hp.get_backend(pair) == hp.get_backend()
assert hp.get_platform().create_group([0, 1, 2, 3]) == "4-0-1-2-3"
over_groups = hp.DeviceMesh.from_group([mesh.get_group("dp"), pair], "npu", mesh=mesh.mesh, mesh_dim_names=("a", "b"))
assert over_groups["b"].rank_list == (2 * dp, 2 * dp + 1) and over_groups["a"].rank_list == (tp, tp + 2)
hp.destroy_process_group(pair)

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
import mindspore_hyper as mh  # noqa: E402
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
    return optimizer


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

# fully_shard's apply_grad_on_fp32_main_grad (MindFormers' policy): after one backward each rank's
# main_grad is its piece of the averaged gradient, one device's on the 4 batches concatenated
# (float32 sums of <= 16 terms in another order: ~1e-6 relative)
from mindspore_hyper.hyper_parallel.fully_shard_policies import MixedPrecisionPolicy  # noqa: E402

main_sharded, main_reference = Mlp(), Mlp()
for (_, p), (_, q) in zip(main_sharded.parameters_and_names(), main_reference.parameters_and_names()):
    q.set_data(Tensor(p.asnumpy()))
fully_shard(main_sharded, mesh=dp_mesh,
            mp_policy=MixedPrecisionPolicy(reduce_dtype=ms.float32, apply_grad_on_fp32_main_grad=True))
mse_of = lambda m: (lambda x, y: ((m(x) - y) ** 2).mean())  # noqa: E731
ms.value_and_grad(mse_of(main_sharded), None, main_sharded.trainable_params())(Tensor(data[rank]),
                                                                              Tensor(target[rank]))
whole_grads = ms.value_and_grad(mse_of(main_reference), None, main_reference.trainable_params())(
    Tensor(data.reshape(8, 8)), Tensor(target.reshape(8, 8)))[1]
for param, whole_grad in zip(main_sharded.trainable_params(), whole_grads):
    rows = whole_grad.shape[0] // 4
    np.testing.assert_allclose(param.main_grad.asnumpy(), whole_grad.asnumpy()[rank * rows:(rank + 1) * rows],
                               rtol=1e-5, atol=1e-7, err_msg=param.name)
print(f"rank {rank}: fully_shard's main_grad holds this rank's piece of one device's gradient")

# fully_shard with torch FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)
# and each rank's batch: bfloat16 compute (emulated on the CPU), the gradient reduce-scattered in
# float32 onto float32 pieces. Reference: the same policy on a one-device mesh per process run on
# each rank's batch (the same roundings: every row's forward and backward are the same kernels),
# averaged in numpy; the pieces differ only by the float32 order of the 4-term average (<= 3
# roundings of 2^-24 relative to the sum of the terms' magnitudes). A bfloat16 reduction would be
# off by up to 2^-9 relative.
mh.set_context(cpu_bfloat16="emulate")
mp_policy = MixedPrecisionPolicy(param_dtype=ms.bfloat16, reduce_dtype=ms.float32, output_dtype=ms.float32)
mp_sharded, mp_solo = Mlp(), Mlp()
for (_, p), (_, q) in zip(mp_sharded.parameters_and_names(), mp_solo.parameters_and_names()):
    q.set_data(Tensor(p.asnumpy()))
fully_shard(mp_sharded, mesh=dp_mesh, mp_policy=mp_policy)
fully_shard(mp_solo, mesh=hp.init_device_mesh("cpu", (1,), mesh_dim_names=("solo",)), mp_policy=mp_policy)
mp_grads = ms.grad(mse_of(mp_sharded), None, mp_sharded.trainable_params())(Tensor(data[rank]), Tensor(target[rank]))
mp_parts = [[g.asnumpy() for g in ms.grad(mse_of(mp_solo), None, mp_solo.trainable_params())(
    Tensor(data[r]), Tensor(target[r]))] for r in range(4)]
for index, (param, got) in enumerate(zip(mp_sharded.trainable_params(), mp_grads)):
    assert param.dtype == ms.float32 and got.dtype == ms.float32, (param.name, param.dtype, got.dtype)
    terms = np.stack([part[index] for part in mp_parts]) / 4
    rows = terms.shape[1] // 4
    want, scale = terms.sum(0)[rank * rows:(rank + 1) * rows], np.abs(terms).sum(0)[rank * rows:(rank + 1) * rows]
    assert np.all(np.abs(got.asnumpy() - want) <= 3 * 2.0 ** -24 * scale), (param.name, got.asnumpy(), want)
mh.set_context(cpu_bfloat16="mindspore")
print(f"rank {rank}: fully_shard's bfloat16 policy reduces float32 gradients onto float32 pieces like one device")

# fully_shard and Colwise/Rowwise inside MindSpore's DeviceCtx("meta"), as MindFormers 2.0's
# parallelize_gptmodel calls them (host_device.py): each process's new Parameter is its piece of
# the values (it was a meta tensor, and the layout failed: "copy between src:meta and dst:CPU");
# then 3 Adam steps on per-rank batches equal one device's (tolerance as above)
from mindspore_hyper.hyper_parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402

for lay_out in ("fully_shard", "colwise_rowwise"):
    ms.set_seed(5)
    meta_sharded, meta_reference = Mlp(), Mlp()
    for (_, p), (_, q) in zip(meta_sharded.parameters_and_names(), meta_reference.parameters_and_names()):
        q.set_data(Tensor(p.asnumpy()))
    with ms.DeviceCtx("meta"):
        if lay_out == "fully_shard":
            fully_shard(meta_sharded, mesh=dp_mesh)
        else:
            parallelize_module(meta_sharded, dp_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    assert all(p.device == "CPU" for p in meta_sharded.trainable_params()), lay_out
    batch = (Tensor(data[rank]), Tensor(target[rank])) if lay_out == "fully_shard" else \
        (Tensor(data.reshape(8, 8)), Tensor(target.reshape(8, 8)))  # tensor parallel: the same batch on every rank
    adam_steps(meta_sharded, *batch)
    adam_steps(meta_reference, Tensor(data.reshape(8, 8)), Tensor(target.reshape(8, 8)))
    for name, value in laid_out_parameters(meta_sharded).items():
        np.testing.assert_allclose(value.full_tensor().asnumpy(),
                                   dict(meta_reference.parameters_and_names())[name].asnumpy(), atol=1e-5,
                                   err_msg=f"{lay_out}: {name}")
print(f"rank {rank}: fully_shard and Colwise/Rowwise inside DeviceCtx('meta') train like one device")

# uneven Shard (torch.chunk pieces; the collectives pad them): 7 x 3 over dp x tp gives rows 4, 3
# and columns 2, 1; then fully_shard of 7- and 11-row weights over 4 ranks (2,2,2,1 and 3,3,3,2 rows)
odd = np.arange(21, dtype=np.float32).reshape(7, 3)
row_of, col_of = ((0, 4), (4, 7)), ((0, 2), (2, 3))
piece = odd[slice(*row_of[dp]), slice(*col_of[tp])]
u = hp.DTensor.from_local(Tensor(piece), mesh, [Shard(0), Shard(1)], shape=(7, 3), run_check=True)
np.testing.assert_array_equal(u.full_tensor().asnumpy(), odd)
np.testing.assert_array_equal(hp.distribute_tensor(Tensor(odd), mesh, [Shard(0), Shard(1)]).to_local().asnumpy(), piece)
np.testing.assert_array_equal(u.redistribute(mesh, [Shard(1), Shard(0)]).to_local().asnumpy(),
                              odd[slice(*row_of[tp]), slice(*col_of[dp])])
summed = hp.DTensor.from_local(Tensor(odd), mesh, [Partial("sum"), Replicate()]).redistribute(mesh, [Shard(0), Replicate()])
np.testing.assert_array_equal(summed.to_local().asnumpy(), 2 * odd[slice(*row_of[dp])])
w3 = np.linspace(-1, 1, 3 * 5, dtype=np.float32).reshape(3, 5)
np.testing.assert_allclose(((u * 2.0) @ Tensor(w3)).full_tensor().asnumpy(), (2 * odd) @ w3, rtol=1e-5)  # 3-term sums
try:
    hp.DTensor.from_local(Tensor(piece), mesh, [Shard(0), Shard(1)], shape=(8, 3), run_check=True)
    raise AssertionError("from_local accepted local shapes that do not lay out shape=(8, 3)")
except ValueError as error:
    assert "local shapes do not lay out shape=(8, 3)" in str(error), error


class Odd(nn.Cell):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Dense(8, 7), nn.Dense(7, 11)

    def construct(self, x):
        return self.down(ops.tanh(self.up(x)))


ms.set_seed(6)
odd_sharded, odd_reference = Odd(), Odd()
for (_, p), (_, q) in zip(odd_sharded.parameters_and_names(), odd_reference.parameters_and_names()):
    q.set_data(Tensor(p.asnumpy()))
fully_shard(odd_sharded, mesh=dp_mesh)
odd_target = np.random.RandomState(9).randn(4, 2, 11).astype(np.float32)
adam_steps(odd_sharded, Tensor(data[rank]), Tensor(odd_target[rank]))
adam_steps(odd_reference, Tensor(data.reshape(8, 8)), Tensor(odd_target.reshape(8, 11)))
for name, value in laid_out_parameters(odd_sharded).items():
    whole_rows = dict(odd_reference.parameters_and_names())[name].shape[0]
    assert value.to_local().shape[0] == ([2, 2, 2, 1] if whole_rows == 7 else [3, 3, 3, 2])[rank]
    np.testing.assert_allclose(value.full_tensor().asnumpy(), dict(odd_reference.parameters_and_names())[name].asnumpy(),
                               atol=1e-5, err_msg=name)  # as above: Adam steps of ~1e-2, float32 rounding ~1e-7
print(f"rank {rank}: uneven shards (torch.chunk) under msrun equal numpy and one device")

# redistribute onto another mesh over the same devices (upstream's different-mesh case): the 2x2
# mesh's shards gathered to Replicate there, sliced on the 1-D "dp" mesh (and a Partial back);
# exact. Its gradient equals the same move within one mesh on every rank, and rank 0's (the
# source rank of distribute_tensor, which gets the gradient, torch's rule) equals one device's
g64 = np.arange(64, dtype=np.float32).reshape(8, 8)
on_line = hp.distribute_tensor(Tensor(g64), mesh, [Shard(0), Shard(1)]).redistribute(dp_mesh, [Shard(0)])
np.testing.assert_array_equal(on_line.to_local().asnumpy(), g64[2 * rank:2 * rank + 2])
back = hp.DTensor.from_local(Tensor(np.full((2, 4), float(rank), np.float32)), dp_mesh, [Partial("sum")])
np.testing.assert_array_equal(back.redistribute(mesh, [Replicate(), Shard(1)]).to_local().asnumpy(),
                              np.full((2, 2), 6.0, np.float32))
w8 = ms.Parameter(Tensor(np.random.RandomState(3).randn(8, 8).astype(np.float32)), name="w8")
c8 = Tensor(np.random.RandomState(4).randn(8, 8).astype(np.float32))


def moved_loss(across):
    dw = hp.distribute_tensor(w8 * 1.0, mesh, [Shard(0), Shard(1)])
    dw = (dw.redistribute(dp_mesh, [Shard(1)]) if across else dw).redistribute(mesh, [Replicate(), Shard(0)])
    return (ops.tanh(dw) * hp.distribute_tensor(c8, mesh, [Replicate(), Shard(0)])).sum().full_tensor()


loss_across, (grad_across,) = ms.value_and_grad(lambda: moved_loss(True), None, [w8])()
grad_within = ms.value_and_grad(lambda: moved_loss(False), None, [w8])()[1][0]
one_loss, (one_grad,) = ms.value_and_grad(lambda: (ops.tanh(w8) * c8).sum(), None, [w8])()
np.testing.assert_allclose(float(loss_across), float(one_loss), rtol=1e-5)  # 64 float32 terms, another order
np.testing.assert_array_equal(grad_across.asnumpy(), grad_within.asnumpy())  # the same elementwise products
if rank == 0:
    np.testing.assert_allclose(grad_across.asnumpy(), one_grad.asnumpy(), rtol=1e-6, atol=1e-7)  # c * (1 - tanh^2)
print(f"rank {rank}: redistribute onto another mesh of the same devices equals numpy and one device")

# a rank whose torch.chunk piece is empty (3 rows over 4: 1, 1, 1, 0; 2 columns: 1, 1, 0, 0) adds
# zero to a sum, and the backward runs its collectives there too: MindSpore's CPU ReduceSum of 0
# elements returns uninitialised memory, which the Partial sum gave every rank (found here: 3.96
# for 2.17), and an empty piece cut off the graph left that rank out of the backward's gathers (the
# others waited). float32 tanh and sums of <= 6 terms of O(1): ~1e-6 relative
three = np.random.RandomState(5).randn(3, 2).astype(np.float32)
d3 = hp.distribute_tensor(Tensor(three), dp_mesh, [Shard(0)])
assert d3.to_local().shape == ((0, 2) if rank == 3 else (1, 2))
np.testing.assert_allclose(float((ops.tanh(d3) ** 2).sum()), float((np.tanh(three) ** 2).sum()), rtol=1e-5)
np.testing.assert_allclose(d3.sum(axis=0).full_tensor().asnumpy(), three.sum(0), rtol=1e-5, atol=1e-6)
w3 = ms.Parameter(Tensor(three), name="w3")
one_loss, (one_grad,) = ms.value_and_grad(lambda: (ops.tanh(w3) ** 2).sum(), None, [w3])()


def summed_over_pieces():
    return (ops.tanh(hp.distribute_tensor(w3 * 1.0, dp_mesh, [Shard(0)])) ** 2).sum().full_tensor()


def moved_through_pieces():
    d = hp.distribute_tensor(w3 * 1.0, dp_mesh, [Shard(0)]).redistribute(dp_mesh, [Shard(1)])
    return (ops.tanh(d.redistribute(dp_mesh, [Replicate()])) ** 2).sum().full_tensor()


for empty_piece_loss in (summed_over_pieces, moved_through_pieces):
    loss, (grad,) = ms.value_and_grad(empty_piece_loss, None, [w3])()
    np.testing.assert_allclose(float(loss), float(one_loss), rtol=1e-5)
    if rank == 0:  # distribute_tensor's source rank gets the gradient (torch's rule): 2 tanh (1 - tanh^2)
        np.testing.assert_allclose(grad.asnumpy(), one_grad.asnumpy(), rtol=1e-5, atol=1e-7)
print(f"rank {rank}: a rank's empty piece adds zero to sums and runs the backward's collectives")

# fully_shard leaving a rank no rows (3 rows over 4: 1, 1, 1, 0): every process stores one row, rank
# 3 a zero row (padded storage, as FSDP2 pads its shards: MindSpore's optimizers cannot hold a
# Parameter of 0 elements); 3 Adam steps on each rank's own batch equal one device on the 4
# batches (the same tolerance as above: float32 rounding of the 4-way average, ~1e-7)
ms.set_seed(6)
narrow, narrow_reference = nn.Dense(8, 3), nn.Dense(8, 3)
for p, q in zip(narrow.trainable_params(), narrow_reference.trainable_params()):
    q.set_data(Tensor(p.asnumpy()))
fully_shard(narrow, mesh=dp_mesh)
target3 = np.random.RandomState(9).randn(4, 2, 3).astype(np.float32)
narrow_optimizer = adam_steps(narrow, Tensor(data[rank]), Tensor(target3[rank]))
adam_steps(narrow_reference, Tensor(data.reshape(8, 8)), Tensor(target3.reshape(8, 3)))
for name, value in laid_out_parameters(narrow).items():
    assert value.to_local().shape[0] == (0 if rank == 3 else 1), (name, value.to_local().shape)
    np.testing.assert_allclose(value.full_tensor().asnumpy(),
                               dict(narrow_reference.parameters_and_names())[name].asnumpy(), atol=1e-5, err_msg=name)
for p in narrow.trainable_params():  # the stored piece: one row, rank 3's padding still zero after Adam
    assert p.shape[0] == 1 and (rank < 3 or not p.asnumpy().any()), (p.name, p.asnumpy())
# its checkpoint (with the Adam states, padded the same way) holds the real rows only: rows 0, 1, 2
# by ranks 0, 1, 2, rank 3's padding not stored; the saved tensors are one device's weights (read
# whole by a plain Dense: exact against the gathered pieces, 1e-5 against one device as above); a
# fresh fully_shard model whose pieces are all 7 loads them: real rows equal, padding zero again
padded_ckpt = os.environ["HP_CKPT"] + "_padded"
manifest = mh.save_checkpoint(narrow, padded_ckpt, optimizer=narrow_optimizer)
if rank == 0:
    assert manifest.mode == "distributed", manifest.mode  # the runtime's name (the simulation's: "simulation")
    for name in ("weight", "bias", "moment1.weight", "moment2.bias"):
        entry = (manifest.parameters if "." not in name else manifest.optimizer)[name]
        assert [(s.box.start[0], s.box.stop[0], s.writer) for s in entry.shards] == [(0, 1, 0), (1, 2, 1), (2, 3, 2)]
narrow_gathered = {name: v.full_tensor().asnumpy() for name, v in laid_out_parameters(narrow).items()}
narrow_plain = nn.Dense(8, 3)
mh.load_checkpoint(narrow_plain, padded_ckpt)
for name, p in narrow_plain.parameters_and_names():
    np.testing.assert_array_equal(p.asnumpy(), narrow_gathered[name], err_msg=name)
    np.testing.assert_allclose(p.asnumpy(), dict(narrow_reference.parameters_and_names())[name].asnumpy(), atol=1e-5,
                               err_msg=name)
if rank == 0:  # for the simulation's load at 2 devices (test_msrun.py)
    np.savez(padded_ckpt + "_values.npz", **narrow_gathered)
narrow_fresh = nn.Dense(8, 3)
fully_shard(narrow_fresh, mesh=dp_mesh)
fresh_optimizer = nn.Adam(narrow_fresh.trainable_params(), learning_rate=1e-2)
for p in list(narrow_fresh.trainable_params()) + list(fresh_optimizer.parameters_dict().values()):
    p.set_data(Tensor(np.full(p.shape, 7, p.asnumpy().dtype)))  # the stored array, padding included
mh.load_checkpoint(narrow_fresh, padded_ckpt, optimizer=fresh_optimizer)
for name, value in laid_out_parameters(narrow_fresh).items():
    np.testing.assert_array_equal(value.full_tensor().asnumpy(), narrow_gathered[name], err_msg=name)
saved_states, loaded_states = narrow_optimizer.parameters_dict(), fresh_optimizer.parameters_dict()
for p in list(narrow_fresh.trainable_params()) + [loaded_states[n] for n in loaded_states if "moment" in n]:
    assert p.shape[0] == 1 and (rank < 3 or not p.asnumpy().any()), (p.name, p.asnumpy())  # rank 3: padding only
for name, state in saved_states.items():  # the stored arrays, padding (zero) included: equal
    np.testing.assert_array_equal(loaded_states[name].asnumpy(), state.asnumpy(), err_msg=name)
print(f"rank {rank}: fully_shard leaving a rank no rows trains like one device and checkpoints its real rows "
      f"(padded storage)")

# fully_shard of a (5, 4) and a (7, 3) weight (with their biases) over the 4 processes and over the
# 2x2 mesh's "dp" (2 pieces, replicated over "tp"): each process's Parameter, gradient and Adam
# states are its torch.chunk rows as they are, as upstream's fully_shard and FSDP2 show a local
# shard (5 rows over 4: 2, 2, 1, 0; over 2: 3, 2; 7 rows over 4: 2, 2, 2, 1; over 2: 4, 3); rank 3's
# empty piece of the 5-row tensors is one zero row (MindSpore's optimizers cannot hold 0 elements)
# that stays zero and is never saved. Each rank's own batch (over "dp": the "dp" group's batch, the
# same on both "tp" replicas): the gradient (value_and_grad's and loss.backward()'s .grad, the same
# autograd graph: equal) is this rank's rows of one device's on the batches
# concatenated (float32 sums of <= 8 rows reordered: ~1e-6 relative), 3 Adam steps equal one device
# (steps of ~lr = 1e-2, rounding ~1e-7); the state dict's checkpoint holds the pieces, loads into a
# plain model and back into the same layout (copied bytes: exact)
import time  # noqa: E402

from hyper_parallel.core.distributed_checkpoint import load as load_state, save as save_state  # noqa: E402
from mindspore_hyper.hyper_parallel.autograd_compat import (  # noqa: E402
    disable_mindspore_backward_compat, enable_mindspore_backward_compat,
)
from two_weights import TwoWeights  # noqa: E402


def mse_two(model):
    return lambda x, z, y: ((model(x, z) - y) ** 2).mean()


PIECES = {2: {5: [3, 2], 7: [4, 3]}, 4: {5: [2, 2, 1, 0], 7: [2, 2, 2, 1]}}
pieces_started = time.perf_counter()
xs, zs, ys = (np.random.RandomState(20 + i).randn(4, 2, n).astype(np.float32) for i, n in enumerate((4, 3, 12)))
for shards, pieces_mesh, index in ((4, dp_mesh, rank), (2, mesh["dp"], dp)):
    def rows_of(n, shards=shards, index=index):
        sizes = PIECES[shards][n]
        return sum(sizes[:index]), sum(sizes[:index + 1])

    ms.set_seed(14)
    two, two_reference = TwoWeights(), TwoWeights()
    for p, q in zip(two.trainable_params(), two_reference.trainable_params()):
        q.set_data(Tensor(p.asnumpy()))
    fully_shard(two, mesh=pieces_mesh)
    whole_params = dict(two_reference.parameters_and_names())
    for name, p in two.parameters_and_names():
        start, stop = rows_of(whole_params[name].shape[0])
        rest = tuple(whole_params[name].shape[1:])
        assert tuple(p.shape) == (max(stop - start, 1),) + rest, (shards, name, p.shape)  # an empty piece: one row
        assert laid_out_parameters(two)[name].to_local().shape == (stop - start,) + rest, (shards, name)
    two_optimizer = nn.Adam(two.trainable_params(), learning_rate=1e-2)
    reference_optimizer = nn.Adam(two_reference.trainable_params(), learning_rate=1e-2)
    own = [Tensor(a[index]) for a in (xs, zs, ys)]
    joined = [Tensor(a[:shards].reshape(-1, a.shape[-1])) for a in (xs, zs, ys)]
    for step in range(3):
        if step == 0:  # torch-style loss.backward() (MindFormers' Trainer): each .grad is the same piece
            enable_mindspore_backward_compat()
            mse_two(two)(*own).backward()
            backward_grads = [p.grad.asnumpy() for p in two_optimizer.parameters]
            two.zero_grad()
            disable_mindspore_backward_compat()
        grads = ms.value_and_grad(mse_two(two), None, two_optimizer.parameters)(*own)[1]
        reference_grads = ms.value_and_grad(mse_two(two_reference), None, reference_optimizer.parameters)(*joined)[1]
        for p, g, r in zip(two_optimizer.parameters, grads, reference_grads):
            assert g.shape == p.shape, (shards, p.name, g.shape, p.shape)
            start, stop = rows_of(r.shape[0])
            if step == 0:  # the same weights: this rank's rows of one device's gradient (zero for an empty piece)
                np.testing.assert_array_equal(backward_grads.pop(0), g.asnumpy(), err_msg=f"{shards}: {p.name}")
                expected = r.asnumpy()[start:stop] if stop > start else np.zeros(p.shape, np.float32)
                np.testing.assert_allclose(g.asnumpy(), expected, rtol=1e-5, atol=1e-7, err_msg=f"{shards}: {p.name}")
        two_optimizer(grads)
        reference_optimizer(reference_grads)
    states, reference_states = two_optimizer.parameters_dict(), reference_optimizer.parameters_dict()
    for name, state in states.items():  # the Parameters and their moments: this rank's rows of one device's
        expected_state = reference_states[name].asnumpy()
        if name.startswith("moment") or name in whole_params:
            start, stop = rows_of(expected_state.shape[0])
            assert state.shape[0] == max(stop - start, 1), (shards, name, state.shape)
            expected_state = expected_state[start:stop] if stop > start else np.zeros(state.shape, np.float32)
        np.testing.assert_allclose(state.asnumpy(), expected_state, rtol=1e-4, atol=1e-7, err_msg=f"{shards}: {name}")
    for name, value in laid_out_parameters(two).items():
        np.testing.assert_allclose(value.full_tensor().asnumpy(), whole_params[name].asnumpy(), atol=1e-5,
                                   err_msg=f"{shards}: {name}")
    saved_values = {name: p.asnumpy().copy() for name, p in list(two.parameters_and_names()) + list(states.items())}
    two_ckpt = os.environ["HP_CKPT"] + f"_pieces{shards}"
    manifest = save_state({"model": two.parameters_dict(), "optim": states}, checkpoint_id=two_ckpt)
    for name in ("model.five.weight", "model.seven.weight", "model.five.bias", "optim.moment2.five.weight"):
        entry = manifest.parameters[name]
        sizes = PIECES[shards][entry.global_shape[0]]
        bounds = [(sum(sizes[:i]), sum(sizes[:i + 1])) for i in range(shards) if sizes[i]]  # no empty, no padded piece
        assert [(s.box.start[0], s.box.stop[0]) for s in entry.shards] == bounds, (shards, name, entry.shards)
    gathered_two = {name: v.full_tensor().asnumpy() for name, v in laid_out_parameters(two).items()}
    plain_two = TwoWeights()
    plain_optimizer = nn.Adam(plain_two.trainable_params(), learning_rate=1e-2)
    load_state({"model": plain_two.parameters_dict(), "optim": plain_optimizer.parameters_dict()}, checkpoint_id=two_ckpt)
    for name, p in plain_two.parameters_and_names():
        np.testing.assert_array_equal(p.asnumpy(), gathered_two[name], err_msg=f"{shards}: {name}")
    for name, state in plain_optimizer.parameters_dict().items():
        loaded, mine = state.asnumpy(), saved_values[name]
        if name.startswith("moment") or name in whole_params:  # whole: this rank's rows are the real rows it saved
            start, stop = rows_of(loaded.shape[0])
            loaded, mine = loaded[start:stop], mine[:stop - start]
        np.testing.assert_array_equal(loaded, mine, err_msg=f"{shards}: {name}")
    two_back = TwoWeights()
    fully_shard(two_back, mesh=pieces_mesh)
    back_optimizer = nn.Adam(two_back.trainable_params(), learning_rate=1e-2)
    back_states = back_optimizer.parameters_dict()
    for p in list(two_back.trainable_params()) + list(back_states.values()):
        p.set_data(Tensor(np.full(p.shape, 7, p.asnumpy().dtype)))  # stale values, padding included
    load_state({"model": two_back.parameters_dict(), "optim": back_states}, checkpoint_id=two_ckpt)
    for name, p in list(two_back.parameters_and_names()) + list(back_states.items()):  # padding zero again
        np.testing.assert_array_equal(p.asnumpy(), saved_values[name], err_msg=f"{shards}: {name}")
print(f"rank {rank}: fully_shard's (5, 4) and (7, 3) pieces over 4 and 2 are unpadded and equal one device "
      f"({time.perf_counter() - pieces_started:.1f} s)")

# Colwise/Rowwise on features tp = 4 does not divide: 7 hidden features, pieces 2, 2, 2, 1
from mindspore_hyper.hyper_parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # noqa: E402

ms.set_seed(10)
tp4 = hp.init_device_mesh("npu", (4,), mesh_dim_names=("tp_uneven",))  # not the Llama's "tp" report row
tp_sharded, tp_reference = Odd(), Odd()
for (_, p), (_, q) in zip(tp_sharded.parameters_and_names(), tp_reference.parameters_and_names()):
    q.set_data(Tensor(p.asnumpy()))
parallelize_module(tp_sharded, tp4, {"up": ColwiseParallel(), "down": RowwiseParallel()})
assert dict(tp_sharded.parameters_and_names())["up.weight"].shape == ((2, 8) if rank < 3 else (1, 8))
same_x, same_y = Tensor(data.reshape(8, 8)), Tensor(odd_target.reshape(8, 11))  # every rank the same batch
np.testing.assert_allclose(tp_sharded(same_x).asnumpy(), tp_reference(same_x).asnumpy(), rtol=1e-5, atol=1e-6)
adam_steps(tp_sharded, same_x, same_y)
adam_steps(tp_reference, same_x, same_y)
for name, value in laid_out_parameters(tp_sharded).items():  # Adam steps of ~1e-2, float32 rounding ~1e-7
    np.testing.assert_allclose(value.full_tensor().asnumpy(), dict(tp_reference.parameters_and_names())[name].asnumpy(),
                               atol=1e-5, err_msg=name)
try:  # 6 features over 4: pieces 2, 2, 2, 0; an optimizer cannot hold rank 3's empty Parameter
    parallelize_module(nn.Dense(8, 6), tp4, ColwiseParallel())
    raise AssertionError("an empty Parameter piece was accepted under msrun")
except ValueError as error:
    # the refusal names the layer, the dimension and sizes that would work
    assert "Dense parameter 'weight' of shape (6, 8)" in str(error), error
    assert "dimension 0 has 6 elements over 4 devices (torch.chunk pieces of 2); 8 or another multiple of 4 would " \
           "work: ranks [3] would hold an empty torch.chunk piece" in str(error), error
print(f"rank {rank}: Colwise/Rowwise with uneven features train like one device")

# torch-style loss.backward() (MindFormers' Trainer: enable_mindspore_backward_compat) under msrun:
# the collectives are MindSpore custom autograd functions, which run_backward differentiates.
# fully_shard with main_grad and each rank's batch: .grad and .main_grad are value_and_grad's on
# the same model (the same autograd graph: equal; the sense 0.25 scales exactly) and this rank's
# piece of one device's gradient; Colwise/Rowwise gradients, gathered, equal one device's; 3 Adam
# steps on .grad equal one device's (tolerances as for the value_and_grad checks above)
from mindspore_hyper.hyper_parallel.autograd_compat import (  # noqa: E402
    disable_mindspore_backward_compat, enable_mindspore_backward_compat,
)

SENSE = 0.25
enable_mindspore_backward_compat()
ms.set_seed(11)
bw_sharded, bw_reference = Mlp(), Mlp()
for (_, p), (_, q) in zip(bw_sharded.parameters_and_names(), bw_reference.parameters_and_names()):
    q.set_data(Tensor(p.asnumpy()))
fully_shard(bw_sharded, mesh=dp_mesh,
            mp_policy=MixedPrecisionPolicy(reduce_dtype=ms.float32, apply_grad_on_fp32_main_grad=True))
mse_of(bw_sharded)(Tensor(data[rank]), Tensor(target[rank])).backward(Tensor(SENSE, ms.float32))
by_backward = [(p.grad.asnumpy(), p.main_grad.asnumpy()) for p in bw_sharded.trainable_params()]
bw_sharded.zero_grad()
by_value_and_grad = ms.value_and_grad(mse_of(bw_sharded), None, bw_sharded.trainable_params())(
    Tensor(data[rank]), Tensor(target[rank]))[1]
whole_grads = ms.value_and_grad(mse_of(bw_reference), None, bw_reference.trainable_params())(
    Tensor(data.reshape(8, 8)), Tensor(target.reshape(8, 8)))[1]
for param, (grad, main_grad), same, whole_grad in zip(bw_sharded.trainable_params(), by_backward, by_value_and_grad,
                                                      whole_grads):
    np.testing.assert_array_equal(grad, SENSE * same.asnumpy(), err_msg=param.name)
    np.testing.assert_array_equal(main_grad, grad, err_msg=param.name)
    rows = whole_grad.shape[0] // 4
    np.testing.assert_allclose(grad, SENSE * whole_grad.asnumpy()[rank * rows:(rank + 1) * rows], rtol=1e-5,
                               atol=1e-7, err_msg=param.name)

enable_mindspore_backward_compat()  # value_and_grad turned MindSpore's grad flag off
ms.set_seed(12)
tp_backward, tp_one = Odd(), Odd()
for (_, p), (_, q) in zip(tp_backward.parameters_and_names(), tp_one.parameters_and_names()):
    q.set_data(Tensor(p.asnumpy()))
parallelize_module(tp_backward, tp4, {"up": ColwiseParallel(), "down": RowwiseParallel()})
mse_of(tp_backward)(same_x, same_y).backward()
one_grads = dict(zip([n for n, _ in tp_one.parameters_and_names()],
                     ms.value_and_grad(mse_of(tp_one), None, tp_one.trainable_params())(same_x, same_y)[1]))
enable_mindspore_backward_compat()
for name, value in laid_out_parameters(tp_backward).items():
    grad = dict(tp_backward.parameters_and_names())[name].grad
    gathered = hp.DTensor.from_local(grad, tp4, value.placements, shape=value.shape).full_tensor()
    # float32 sums of <= 8 batch rows (and 7 features) in another order: ~1e-6 relative
    np.testing.assert_allclose(gathered.asnumpy(), one_grads[name].asnumpy(), rtol=1e-5, atol=1e-7, err_msg=name)

ms.set_seed(13)
loop_sharded, loop_reference = Mlp(), Mlp()
for (_, p), (_, q) in zip(loop_sharded.parameters_and_names(), loop_reference.parameters_and_names()):
    q.set_data(Tensor(p.asnumpy()))
fully_shard(loop_sharded, mesh=dp_mesh)
loop_optimizer = nn.Adam(loop_sharded.trainable_params(), learning_rate=1e-2)
for _ in range(3):
    mse_of(loop_sharded)(Tensor(data[rank]), Tensor(target[rank])).backward()
    loop_optimizer(tuple(p.grad for p in loop_optimizer.parameters))
    loop_sharded.zero_grad()
disable_mindspore_backward_compat()
adam_steps(loop_reference, Tensor(data.reshape(8, 8)), Tensor(target.reshape(8, 8)))
for name, value in laid_out_parameters(loop_sharded).items():  # Adam steps of ~1e-2, float32 rounding ~1e-7
    np.testing.assert_allclose(value.full_tensor().asnumpy(), dict(loop_reference.parameters_and_names())[name].asnumpy(),
                               atol=1e-5, err_msg=name)
print(f"rank {rank}: loss.backward() equals value_and_grad and one device (fully_shard, main_grad, Colwise/Rowwise, "
      f"3 Adam steps)")

# upstream's distributed checkpoint: each rank writes its pieces; a plain model loads them whole
from hyper_parallel.core.distributed_checkpoint import load, save  # noqa: E402

save({"model": sharded.parameters_dict()}, checkpoint_id=os.environ["HP_CKPT"])
restored = Mlp()
load({"model": restored.parameters_dict()}, checkpoint_id=os.environ["HP_CKPT"])
for name, p in restored.parameters_and_names():
    np.testing.assert_array_equal(p.asnumpy(), laid_out_parameters(sharded)[name].full_tensor().asnumpy(), err_msg=name)
# uneven pieces: the 7- and 11-row model saved from 4 ranks (2,2,2,1 and 3,3,3,2 rows) as a state
# dict and as the Cell itself (mh.save_checkpoint), loaded into fully_shard over the 2-rank "dp"
# sub-mesh (4,3 and 6,5 rows) and into a plain model
import mindspore_hyper as mh  # noqa: E402

save({"model": odd_sharded.parameters_dict()}, checkpoint_id=os.environ["HP_CKPT"] + "_uneven")
mh.save_checkpoint(odd_sharded, os.environ["HP_CKPT"] + "_uneven_cell")
odd_saved = {name: v.full_tensor().asnumpy() for name, v in laid_out_parameters(odd_sharded).items()}
odd_halves, odd_plain = Odd(), Odd()
fully_shard(odd_halves, mesh=mesh["dp"])
load({"model": odd_halves.parameters_dict()}, checkpoint_id=os.environ["HP_CKPT"] + "_uneven")
mh.load_checkpoint(odd_plain, os.environ["HP_CKPT"] + "_uneven_cell")
for name, value in laid_out_parameters(odd_halves).items():
    assert value.to_local().shape[0] == -(-odd_saved[name].shape[0] // 2) - dp * (odd_saved[name].shape[0] % 2)
    np.testing.assert_array_equal(value.full_tensor().asnumpy(), odd_saved[name], err_msg=name)
for name, p in odd_plain.parameters_and_names():
    np.testing.assert_array_equal(p.asnumpy(), odd_saved[name], err_msg=name)
print(f"rank {rank}: distributed checkpoint round trip")

# meshes smaller than the job: upstream's tiling (rank r gets ranks r - r % 2, r - r % 2 + 1) and
# a mesh on ranks 1 and 3 only; collectives stay among the mesh's ranks
tile = hp.init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
base = rank - rank % 2
assert tile.mesh.tolist() == [base, base + 1] and tile.get_coordinate() == [rank % 2], tile.mesh
pair = hp.DTensor.from_local(Tensor(np.full((2,), float(rank), np.float32)), tile, [Partial("sum")])
np.testing.assert_array_equal(pair.full_tensor().asnumpy(), np.full((2,), 2.0 * base + 1, np.float32))
owned = whole + 100 * base  # each pair's own global value; distribute_tensor takes its first rank's
d = hp.distribute_tensor(Tensor(owned if rank % 2 == 0 else np.zeros_like(owned)), tile, [Shard(1)])
np.testing.assert_array_equal(d.to_local().asnumpy(), owned[:, 4 * (rank % 2):4 * (rank % 2 + 1)])
w = np.linspace(-1, 1, 8 * 3, dtype=np.float32).reshape(8, 3)
y = hp.distribute_tensor(Tensor(owned), tile, [Shard(1)]) @ hp.distribute_tensor(Tensor(w), tile, [Shard(0)])
np.testing.assert_allclose(y.full_tensor().asnumpy(), owned @ w, rtol=1e-5)  # float32, 8-term sums of <= 200
odd = hp.DeviceMesh("cpu", [1, 3], mesh_dim_names=("x",))
if rank % 2:
    assert odd.get_coordinate() == [rank // 2]
    odd_sum = hp.DTensor.from_local(Tensor(np.full((2,), float(rank), np.float32)), odd, [Partial("sum")])
    np.testing.assert_array_equal(odd_sum.full_tensor().asnumpy(), np.full((2,), 4.0, np.float32))
else:
    assert odd.get_coordinate() is None  # torch: a rank outside the mesh has no coordinate
    try:
        hp.distribute_tensor(Tensor(whole), odd, [Replicate()])
        raise AssertionError("a DTensor on a mesh this rank is outside of was made")
    except ValueError as error:
        assert f"rank {rank} is not in the DeviceMesh of ranks [1, 3]" in str(error), error
# torch's src_data_rank on a sub-mesh: each "tp" group takes its own first device's value
by_tp = hp.distribute_tensor(Tensor(np.full((2,), float(rank), np.float32)), mesh["tp"], [Replicate()])
np.testing.assert_array_equal(by_tp.to_local().asnumpy(), np.full((2,), float(2 * dp), np.float32))
print(f"rank {rank}: meshes smaller than the job checked")

# Parameter(DTensor) as upstream's loss_repeat_mean writes it: each rank passes its own block of the
# weight; the Parameter holds that block, and shard_module + hsdp train it like one device
from hyper_parallel import ShardingPlan, hsdp, parallelize_value_and_grad, shard_module  # noqa: E402


class RepeatMean(nn.Cell):
    def __init__(self, weight):
        super().__init__()
        self.weight = ms.Parameter(weight, name="weight")

    def construct(self, x):
        return ops.relu(ops.matmul(x, self.weight))


w_whole = np.random.RandomState(10).randn(8, 2).astype(np.float32)
x_whole = np.random.RandomState(11).randn(4, 8).astype(np.float32)
block = hp.DTensor.from_local(Tensor(w_whole[tp * 4:(tp + 1) * 4]), mesh, [Replicate(), Shard(0)])
repeat = RepeatMean(block)
assert tuple(repeat.weight.shape) == (4, 2) and repeat.weight.name == "weight"  # this rank's block
shard_module(repeat, device_mesh=mesh, sharding_plan=ShardingPlan(input_plan={"input": ((Shard(0), Shard(1)),)}))
repeat = hsdp(repeat, shard_size=2, threshold=0)
repeat_ref = RepeatMean(Tensor(w_whole))
x_mine = hp.DTensor.from_local(Tensor(x_whole[dp * 2:(dp + 1) * 2, tp * 4:(tp + 1) * 4]), mesh, [Shard(0), Shard(1)])
for model, grad_of, x in ((repeat, parallelize_value_and_grad, x_mine),
                          (repeat_ref, lambda f, w: ms.value_and_grad(f, None, w), Tensor(x_whole))):
    optimizer = nn.Adam(model.trainable_params(), learning_rate=1e-2)
    step = grad_of(lambda data, model=model: model(data).sum(), optimizer.parameters)
    for _ in range(2):
        optimizer(step(x)[1])
# Adam moves the weight by ~1e-2 per step; the 8-term products differ by float32 rounding (~1e-7)
np.testing.assert_allclose(laid_out_parameters(repeat)["weight"].full_tensor().asnumpy(), repeat_ref.weight.asnumpy(),
                           atol=1e-5)
print(f"rank {rank}: Parameter(DTensor) of each rank's block trains like one device")

# Global-norm clipping of each process's gradient pieces (issue 41 item 2): fully_shard over 4,
# hsdp 2 x 2 (pieces replicated over "replicate": counted once) and Colwise/Rowwise over 4
# (down.bias replicated): clip_grads_by_global_norm on value_and_grad's pieces and upstream's
# clip_grad_norm_ on loss.backward()'s .grad give one device's ops.clip_by_global_norm norm, where
# MindSpore's own clip_by_global_norm on the pieces gives a smaller one; a clipped momentum step
# equals one device's. Gradients are float32 sums of <= 16 terms in another order (~1e-6
# relative; the package sums squares in float64): rtol 1e-5 on the norm, 1e-6 on weights moved
# by lr * 0.05; a doubled or missing piece moves the norm by >= 10%.
from hyper_parallel.core.utils import clip_grad_norm_  # noqa: E402  (upstream's import path)
from mindspore_hyper.hyper_parallel import clip_grads_by_global_norm  # noqa: E402


class ClipMlp(nn.Cell):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Dense(8, 16), nn.Dense(16, 8)

    def construct(self, x, y):
        return ((self.down(ops.tanh(self.up(x))) - y) ** 2).mean()


def clip_laid_out(kind, model):
    """`model` laid out by `kind`, and how its inputs are passed."""
    if kind == "fully_shard":
        clip_mesh = hp.init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
        fully_shard(model.up, mesh=clip_mesh)
        fully_shard(model, mesh=clip_mesh)
        return model, (lambda t: hp.distribute_tensor(t, clip_mesh, [Shard(0)]))
    if kind == "hsdp":
        clip_mesh = hp.init_device_mesh("npu", (2, 2), mesh_dim_names=("replicate", "shard"))
        return hsdp(model, shard_size=2, threshold=0), (lambda t: hp.distribute_tensor(t, clip_mesh, [Shard(0)] * 2))
    # not named "tp": test_msrun.py reads the example Llama's "tp" mesh from the report
    clip_mesh = hp.init_device_mesh("npu", (4,), mesh_dim_names=("clip_tp",))
    parallelize_module(model, clip_mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return model, (lambda t: t)


def clip_norm_of(grads):
    """The global norm as ops.clip_by_global_norm computes it (float32 square sums, AddN, Sqrt)."""
    return float(ops.sqrt(ops.addn([ops.square(g).sum().reshape((1,)) for g in grads])).asnumpy()[0])


clip_x, clip_y = (Tensor(np.random.RandomState(30 + i).randn(4, 8).astype(np.float32)) for i in range(2))
for kind in ("fully_shard", "hsdp", "colwise_rowwise"):
    ms.set_seed(21)
    clip_model, clip_reference = ClipMlp(), ClipMlp()
    for p, q in zip(clip_model.trainable_params(), clip_reference.trainable_params()):
        q.set_data(Tensor(p.asnumpy()))
    clip_model, as_input = clip_laid_out(kind, clip_model)
    ref_opt, opt = (nn.Momentum(n.trainable_params(), 0.1, 0.9) for n in (clip_reference, clip_model))
    ref_grads = ms.value_and_grad(clip_reference, None, ref_opt.parameters)(clip_x, clip_y)[1]
    ref_norm = clip_norm_of(ref_grads)
    pieces = ms.value_and_grad(lambda a, b: clip_model(as_input(a), as_input(b)), None,
                               opt.parameters)(clip_x, clip_y)[1]
    clipped, norm = clip_grads_by_global_norm(opt.parameters, pieces, 0.05)
    assert ref_norm > 0.05 and abs(norm - ref_norm) <= 1e-5 * ref_norm, (kind, norm, ref_norm)
    local_norm = clip_norm_of(pieces)  # what MindSpore's own clip_by_global_norm computes: this process's pieces
    assert local_norm < 0.95 * ref_norm, (kind, local_norm, ref_norm)
    ref_opt(ops.clip_by_global_norm(ref_grads, 0.05))
    opt(clipped)
    for name, value in laid_out_parameters(clip_model).items():
        np.testing.assert_allclose(value.full_tensor().asnumpy(),
                                   dict(clip_reference.parameters_and_names())[name].asnumpy(), rtol=0, atol=1e-6,
                                   err_msg=f"{kind}: {name}")
    if kind == "fully_shard":  # upstream's clip_grad_norm_ on loss.backward()'s .grad, scaled in place
        ref_norm = clip_norm_of(ms.value_and_grad(clip_reference, None, ref_opt.parameters)(clip_x, clip_y)[1])
        enable_mindspore_backward_compat()  # after value_and_grad (it turns MindSpore's grad flag off)
        clip_model.zero_grad()
        clip_model(clip_x, clip_y).backward()  # the same batch on every rank: averaged, one device's gradient
        norm = float(clip_grad_norm_(clip_model, 0.05))
        assert abs(norm - ref_norm) <= 1e-5 * ref_norm, (kind, "backward", norm, ref_norm)
        clipped_norm = float(clip_grad_norm_(clip_model, 1e9))  # the .grad left scaled: norm 0.05 now
        assert abs(clipped_norm - 0.05) <= 1e-5 * 0.05, clipped_norm
        clip_model.zero_grad()
        disable_mindspore_backward_compat()
print(f"rank {rank}: global-norm clipping counts each piece once (fully_shard, hsdp, Colwise/Rowwise) like one device")

# Gradient accumulation without synchronisation (issue 36): fully_shard's
# set_requires_gradient_sync(False) and hsdp's set_requires_grad_sync(False) (enable_grad_accumulation
# =True, over 4 and with shard_size=2), each rank's own micro-batches, k = 2 and 3, then an Adam step:
# equal to one device on all ranks' micro-batches concatenated (summed losses, so the gradients sum;
# fully_shard set to "sum"). While off, fully_shard returns zeros and hsdp this rank's rows of its
# own unsynchronised running sum. Tolerances: float32 sums of <= 12 x 2 x 16 products reordered:
# 1e-5 relative on gradients (size ~10); 1e-6 on weights after one Adam step of lr 1e-2.
class AccNet(nn.Cell):
    def __init__(self, dtype=np.float32):
        super().__init__()
        self.weight = ms.Parameter(Tensor(np.random.RandomState(0).randn(16, 8).astype(dtype)), name="weight")
        self.bias = ms.Parameter(Tensor(np.random.RandomState(1).randn(8).astype(dtype)), name="bias")

    def construct(self, x):
        return ops.tanh(ops.matmul(x, self.weight) + self.bias).sum()


def acc_grads(xs):
    net = AccNet()
    return [g.asnumpy() for g in ms.value_and_grad(net, None, net.trainable_params())(Tensor(np.concatenate(xs)))[1]]


acc_data = np.random.RandomState(21).randn(3, 4, 2, 16).astype(np.float32)  # micro-batch, rank, rows, features
for kind in ("fully_shard", "hsdp", "hsdp_shard_size_2"):
    for k in (2, 3):
        if kind == "fully_shard":
            acc_model = fully_shard(AccNet(), mesh=hp.init_device_mesh("npu", (4,), mesh_dim_names=("acc_dp",)))
            acc_model.set_reduce_op_type("sum")
            set_sync, piece = acc_model.set_requires_gradient_sync, rank
        else:
            hp.init_device_mesh("npu", (4,) if kind == "hsdp" else (2, 2),
                                mesh_dim_names=("acc_dp",) if kind == "hsdp" else ("acc_r", "acc_s"))
            acc_model = hsdp(AccNet(), shard_size=-1 if kind == "hsdp" else 2, threshold=0,
                             enable_grad_accumulation=True)
            acc_model.zero_grads()
            set_sync, piece = acc_model.set_requires_grad_sync, rank if kind == "hsdp" else rank % 2
        acc_opt = nn.Adam(acc_model.trainable_params(), learning_rate=1e-2)
        acc_fn = ms.value_and_grad(acc_model, None, acc_opt.parameters)
        for j in range(k):
            set_sync(j == k - 1)
            acc_out = acc_fn(Tensor(acc_data[j, rank]))[1]
            if j < k - 1:  # unsynchronised: zeros (fully_shard), this rank's own running sum (hsdp)
                own = acc_grads([acc_data[i, rank] for i in range(j + 1)])
                for g, r in zip(acc_out, own):
                    n = g.shape[0]
                    want = np.zeros_like(g.asnumpy()) if kind == "fully_shard" else r[piece * n:(piece + 1) * n]
                    np.testing.assert_allclose(g.asnumpy(), want, rtol=1e-5, atol=1e-5, err_msg=f"{kind} k={k} j={j}")
        everyone = [acc_data[i, r] for i in range(k) for r in range(4)]
        for g, r in zip(acc_out, acc_grads(everyone)):
            n = g.shape[0]
            np.testing.assert_allclose(g.asnumpy(), r[piece * n:(piece + 1) * n], rtol=1e-5, atol=1e-5,
                                       err_msg=f"{kind} k={k} synchronised")
        acc_opt(acc_out)
        acc_ref = AccNet()
        ref_opt = nn.Adam(acc_ref.trainable_params(), learning_rate=1e-2)
        ref_opt(ms.value_and_grad(acc_ref, None, ref_opt.parameters)(Tensor(np.concatenate(everyone)))[1])
        for name, value in laid_out_parameters(acc_model).items():
            np.testing.assert_allclose(value.full_tensor().asnumpy(), dict(acc_ref.parameters_and_names())[name].asnumpy(),
                                       rtol=0, atol=1e-6, err_msg=f"{kind} k={k}: {name}")
print(f"rank {rank}: gradient accumulation without synchronisation (fully_shard, hsdp) equals one device")


# hsdp(reduce_dtype=float32) of float16 Parameters, each rank's own batch: this rank's rows of the
# 4 ranks' float16 gradients added in float32 and rounded to float16 once (upstream's cast, reduce,
# cast back). The values are moderate, so float32 adds the 4 exactly: equal to numpy bit for bit;
# adding them in float16 rounds the partial sums, which differs here (checked on the data).
half_x = [np.random.RandomState(31 + r).randn(3, 16).astype(np.float16) for r in range(4)]
half_each = []
for x in half_x:  # each rank's float16 gradient, computed by MindSpore on one device
    half_net = AccNet(np.float16)
    half_each.append([g.asnumpy() for g in ms.value_and_grad(half_net, None, half_net.trainable_params())(Tensor(x))[1]])
hp.init_device_mesh("npu", (4,), mesh_dim_names=("half_dp",))
half_model = hsdp(AccNet(np.float16), threshold=0, reduce_dtype=ms.float32)
half_out = ms.value_and_grad(half_model, None, half_model.trainable_params())(Tensor(half_x[rank]))[1]
rounded_apart = 0
for i, g in enumerate(half_out):
    exact = np.sum([each[i].astype(np.float64) for each in half_each], axis=0).astype(np.float16)
    in_half = ((half_each[0][i] + half_each[1][i]) + half_each[2][i]) + half_each[3][i]
    rounded_apart += int(np.sum(in_half != exact))
    n = g.shape[0]
    assert g.dtype == ms.float16, g.dtype
    np.testing.assert_array_equal(g.asnumpy(), exact[rank * n:(rank + 1) * n], err_msg=f"reduce_dtype gradient {i}")
assert rounded_apart > 0, "the data does not tell a float32 sum from a float16 one"
print(f"rank {rank}: hsdp(reduce_dtype=float32) sums float16 gradients in float32 ({rounded_apart} elements differ "
      "from a float16 sum)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pipeline_tp_script  # noqa: E402,F401  (2 pipeline ranks x 2 tensor-parallel devices)

sys.path.insert(0, os.environ["HP_EXAMPLES"])
sys.argv = ["hyper_parallel_llama.py", "--tp", "4", "--steps", "2"]
import hyper_parallel_llama  # noqa: E402

hyper_parallel_llama.main()

from mindspore import log as _ms_log  # noqa: E402

# a real MindSpore [WARNING] line: `run --processes` keeps it on the console (test_msrun.py)
_ms_log.warning(f"rank {rank}: a real MindSpore warning reaches the console")
