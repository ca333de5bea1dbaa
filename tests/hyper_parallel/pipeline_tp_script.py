"""A pipeline whose stages are tensor-parallel, in upstream's form (its vpp_schedule test: each
pipeline rank is a block of 2 devices): rank r builds the whole model, keeps stage r // 2's
layers, splits them over the 2 devices of its block (`init_device_mesh` of 2 devices in the
larger job: upstream's tiling gives rank r the mesh of ranks r - r % 2, r - r % 2 + 1) with
ColwiseParallel / RowwiseParallel, wraps them in a PipelineStage and trains 2 Adam steps of 1F1B
and one Adam step of GPipe; then again with fully_shard, then hsdp (without and with gradient accumulation), over
the block (1 Adam step each); then stages of one 8 -> 8 layer each, alternately Colwise and Rowwise
with DTensor outputs, so the activations cross the pipeline split as DTensors (Shard(1) after a
Colwise stage: each device sends its local piece to the matching device of the next block, the
placements and global shape beside it; Replicate after a Rowwise one) and the gradients come back
as local pieces (2 Adam steps of 1F1B, then one of GPipe; before them, the blocks above with
Replicate DTensor activations, 1 step); the same alternation over two stages per pipeline rank
(ScheduleInterleaved1F1B, 1 step); stages returning a Partial DTensor (row-parallel with
output_layouts=Partial(): each device's partial sum crosses as it is, Partial on the receiving
side, whose pieces each get the reduced value's gradient back) to a last stage without a laid-out
Parameter (it takes the sender's mesh moved to its own block; 1 step of 1F1B, 1 of GPipe); under msrun, the same
stages returning local tensors (use_local_output=True: each device's own piece crosses as a plain
tensor, 1 step); each rank checks its stages against one device running the same layers.

Run by test_per_rank.py with `mindspore-hyper run --devices 8 --per-rank` (4 pipeline ranks x 2).
Exits non-zero on the first mismatch.

Tolerance: float32 sums of at most 16 terms reassociated by the split and the microbatches:
below 1e-6 relative; rtol 1e-5, atol 1e-6 on gradients, 1e-5 on weights after Adam's steps."""
import os

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops
from mindspore.communication.management import get_group_size, get_rank, init

from hyper_parallel import (
    DTensor, PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B, init_device_mesh, parallelize_module,
)
from hyper_parallel.core.dtensor.placement_types import Partial, Replicate, Shard
from hyper_parallel.core.fully_shard.api import fully_shard
from hyper_parallel.core.hsdp import hsdp
from hyper_parallel.core.tensor_parallel import ColwiseParallel, RowwiseParallel
from pipeline_layers import Block, Head

init()
rank, size = get_rank(), get_group_size()
TP = 2
STAGES = size // TP
stage_index = rank // TP
M, BATCH = 4, 8


class TpBlock(nn.Cell):
    """8 -> 16 -> 8 with tanh: `up` splits its output features, `down` its input features."""

    def __init__(self):
        super().__init__()
        self.up = nn.Dense(8, 16, weight_init="normal", bias_init="normal")
        self.down = nn.Dense(16, 8, weight_init="normal", bias_init="normal")

    def construct(self, x):
        return ops.tanh(self.down(ops.tanh(self.up(x))))


class PartialBlock(nn.Cell):
    """8 -> 16 -> 8 ending in the bias-free `down`: row-parallel with output_layouts=Partial(),
    the stage returns each device's partial product (a Partial DTensor)."""

    def __init__(self):
        super().__init__()
        self.up = nn.Dense(8, 16, weight_init="normal", bias_init="normal")
        self.down = nn.Dense(16, 8, has_bias=False, weight_init="normal")

    def construct(self, x):
        return self.down(ops.tanh(self.up(x)))


class Tanh(nn.Cell):
    """A layer without Parameters (a DTensor input stays one: a Partial one is reduced first)."""

    def construct(self, x):
        return ops.tanh(x)


class GatheredHead(nn.Cell):
    """The loss head with no layout: a DTensor input's global value, then Head."""

    def __init__(self):
        super().__init__()
        self.head = Head()

    def construct(self, x):
        return self.head(x.full_tensor() if isinstance(x, DTensor) else x)


def build(chunks=1):
    ms.set_seed(0)  # every rank and the reference build the same initial values
    return nn.SequentialCell([TpBlock() for _ in range(STAGES * chunks)] + [Head()])


def build_blocks(chunks=1):
    ms.set_seed(0)
    return nn.SequentialCell([Block() for _ in range(STAGES * chunks)] + [Head()])


def build_partial(chunks=1):
    """PartialBlocks, then (the last stage) Tanh and the head, neither laid out."""
    ms.set_seed(0)
    return nn.SequentialCell([PartialBlock() for _ in range(STAGES * chunks - 1)] + [Tanh(), GatheredHead()])


class Received(nn.Cell):
    """A stage's layers, recording the placements of each input it gets (None: a plain Tensor)."""

    def __init__(self, layers):
        super().__init__()
        self.layers = layers
        self.seen = set()

    def construct(self, x):
        self.seen.add(tuple(x.placements) if isinstance(x, DTensor) else None)
        return self.layers(x)


def piece(param, value, mesh):
    """This rank's piece of the reference `value` of `param`: the whole value in simulation (a
    laid-out Parameter stays global there), this process's piece under msrun (split along the
    first dimension that differs)."""
    if tuple(param.shape) == value.shape:
        return value
    dim = next(d for d, (a, b) in enumerate(zip(param.shape, value.shape)) if a != b)
    return np.split(value, TP, axis=dim)[mesh.get_local_rank()]


def train(style, steps, what, make=build, record=False, chunks=1, gpipe=False):
    """Cut the model `make(chunks)` builds into STAGES * chunks stages (the last also holding the
    final Cell), lay each of this rank's stages (stage_index + c * STAGES) out on its block's mesh
    by `style(cell, mesh, stage)`, train `steps` Adam steps of 1F1B (ScheduleInterleaved1F1B with
    several chunks; then, with `gpipe`, one Adam step of GPipe) against one device; with `record`,
    returns the placements of the inputs each of its stages received, by stage."""
    model, reference = make(chunks), make(chunks)
    virtual = STAGES * chunks
    mesh = init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
    assert mesh.get_coordinate() == [rank % TP], mesh.get_coordinate()
    stages, cells, params = [], {}, []
    for s in range(stage_index, virtual, STAGES):
        mine = nn.SequentialCell([model[s]] + ([model[virtual]] if s == virtual - 1 else []))
        style(mine, mesh, s)
        cells[s] = Received(mine) if record else mine
        stages.append(PipelineStage(cells[s], s, virtual))
        if chunks > 1:  # each stage's Cell names its Parameters alike: unique names for the rank's one optimizer
            for p in mine.trainable_params():
                p.name = f"stage{s}.{p.name}"
        params += mine.trainable_params()
    stage = stages[-1]  # the rank's last stage: the model's last on the last pipeline rank
    opt = nn.Adam(params, learning_rate=0.05)
    ref_params = reference.trainable_params()
    ref_opt = nn.Adam(ref_params, learning_rate=0.05)
    mine_ids = {id(p) for p in params}  # the model's Cells hold the stage's (laid-out) Parameters too
    ref_mine = [q for p, q in zip(model.trainable_params(), ref_params) if id(p) in mine_ids]
    assert len(ref_mine) == len(params), (len(ref_mine), len(params))

    def reference_step(x):
        """One device: the sum of the microbatches' losses (M times the whole batch's mean loss)."""
        return ms.value_and_grad(lambda x: reference(x) * M, None, ref_params)(x)

    def check(outputs, loss, grads, label):
        if stage.is_last_stage:
            assert len(outputs) == M, (label, len(outputs))
            np.testing.assert_allclose(sum(float(o.asnumpy()) for o in outputs), float(loss.asnumpy()), rtol=1e-5,
                                       atol=1e-6, err_msg=label)
        else:
            assert outputs == [], label
        by_id = {id(q): g for q, g in zip(ref_params, grads)}
        for p, q in zip(params, ref_mine):
            np.testing.assert_allclose(p.grad.asnumpy(), piece(p, by_id[id(q)].asnumpy(), mesh), rtol=1e-5,
                                       atol=1e-6, err_msg=f"{label}: {p.name}")

    schedule = ScheduleInterleaved1F1B(stages, M) if chunks > 1 else Schedule1F1B(stages[0], M)
    name = type(schedule).__name__[len("Schedule"):]
    for step in range(steps):
        x = Tensor(np.random.RandomState(step).randn(BATCH, 8).astype(np.float32))
        outputs = schedule.run(x) if stage_index == 0 else schedule.run()
        loss, grads = reference_step(x)
        check(outputs, loss, grads, f"{what} {name} step {step}")
        opt(tuple(p.grad for p in params))
        ref_opt(grads)
        for mine in cells.values():
            if hasattr(mine, "zero_grads"):
                mine.zero_grads()  # hsdp's Cells: upstream's way to clear accumulated gradients
                assert all(p.grad is None for p in mine.trainable_params())
        for p in params:
            p.grad = None
    for p, q in zip(params, ref_mine):
        np.testing.assert_allclose(p.asnumpy(), piece(p, q.asnumpy(), mesh), rtol=1e-5, atol=1e-5, err_msg=p.name)
    print(f"rank {rank}: {what} pipeline {name} trains {steps} Adam steps like one device", flush=True)
    if gpipe:  # the same stages (and activations) under GPipe: losses, gradients, one Adam step
        x = Tensor(np.random.RandomState(7).randn(BATCH, 8).astype(np.float32))
        schedule = ScheduleGPipe(stages[0], M)
        outputs = schedule.run(x) if stage_index == 0 else schedule.run()
        loss, grads = reference_step(x)
        check(outputs, loss, grads, f"{what} GPipe")
        opt(tuple(p.grad for p in params))
        ref_opt(grads)
        for p, q in zip(params, ref_mine):
            np.testing.assert_allclose(p.asnumpy(), piece(p, q.asnumpy(), mesh), rtol=1e-5, atol=1e-5,
                                       err_msg=f"{what} GPipe: {p.name}")
            p.grad = None
        print(f"rank {rank}: {what} pipeline GPipe equals one device (losses, gradients, an Adam step)", flush=True)
    return {s: cell.seen for s, cell in cells.items()} if record else None


train(lambda cell, mesh, s: parallelize_module(cell, mesh, {"0.up": ColwiseParallel(), "0.down": RowwiseParallel()}),
      2, "tensor-parallel (and GPipe)", gpipe=True)
# every rank of a block passes the same batch: fully_shard's average over the block is that batch's gradient
train(lambda cell, mesh, s: fully_shard(cell, mesh=mesh), 1, "fully_shard")
# hsdp sums the block's gradients (upstream's vpp_schedule uses it); grad_scale=1/TP makes that one device's
train(lambda cell, mesh, s: hsdp(cell, shard_size=TP, grad_scale=1 / TP), 1, "hsdp")
# upstream's vpp_schedule form: positional shard_size, threshold, level, enable_grad_accumulation=True
# (accumulated over the microbatches, synchronised at the last: the same sum)
train(lambda cell, mesh, s: hsdp(cell, TP, 0, "level1", True, grad_scale=1 / TP), 1, "hsdp accumulating")


def alternating(cell, mesh, s, chunks=1):
    """Even stages column-parallel, odd ones row-parallel taking Shard(-1); every stage but the
    last returns a DTensor (the last, ending in the loss head, a local tensor)."""
    last = s == STAGES * chunks - 1
    style = (ColwiseParallel(use_local_output=False) if s % 2 == 0 else
             RowwiseParallel(input_layouts=Shard(-1), use_local_output=last))
    parallelize_module(cell, mesh, {"0.dense": style})


def crossing(s):
    """The placements stage s of the alternation receives (None: plain inputs, stage 0)."""
    return None if s == 0 else (Shard(1),) if s % 2 else (Replicate(),)


# the blocks above with the down projection's output kept a DTensor: Replicate activations cross
last = stage_index == STAGES - 1
seen = train(lambda cell, mesh, s: parallelize_module(cell, mesh, {"0.up": ColwiseParallel(), "0.down": RowwiseParallel(
    use_local_output=last)}), 1, "Replicate DTensor activations", record=True)
assert seen == {stage_index: {None if stage_index == 0 else (Replicate(),)}}, (stage_index, seen)
assert STAGES % 2 == 0, STAGES  # the last stage is a Rowwise one
seen = train(alternating, 2, "DTensor activations", make=build_blocks, record=True, gpipe=True)
assert seen == {stage_index: {crossing(stage_index)}}, (stage_index, seen)
print(f"rank {rank}: DTensor activations (placements {crossing(stage_index)}) cross the pipeline like one device",
      flush=True)
# two stages per pipeline rank (stage_index and stage_index + STAGES): activations cross both ways round
seen = train(lambda cell, mesh, s: alternating(cell, mesh, s, chunks=2), 1, "interleaved DTensor activations",
             make=build_blocks, record=True, chunks=2)
assert seen == {s: {crossing(s)} for s in (stage_index, stage_index + STAGES)}, (stage_index, seen)


def partial_out(cell, mesh, s):
    """Every stage but the last: up column-parallel, down row-parallel returning the Partial DTensor;
    the last stage (Tanh and the head) is not laid out."""
    if s < STAGES - 1:
        parallelize_module(cell, mesh, {"0.up": ColwiseParallel(), "0.down": RowwiseParallel(
            output_layouts=Partial(), use_local_output=False)})


seen = train(partial_out, 1, "Partial DTensor activations", make=build_partial, record=True, gpipe=True)
assert seen == {stage_index: {None if stage_index == 0 else (Partial(),)}}, (stage_index, seen)
print(f"rank {rank}: a Partial activation crosses to a stage without a laid-out Parameter like one device", flush=True)

if "MS_ROLE" in os.environ:  # msrun: local outputs (a rank-local view of a sharded output) cross as plain tensors
    def alternating_local(cell, mesh, s):
        style = ColwiseParallel() if s % 2 == 0 else RowwiseParallel(input_layouts=Shard(-1))
        parallelize_module(cell, mesh, {"0.dense": style})

    seen = train(alternating_local, 1, "local activations", make=build_blocks, record=True)
    assert seen == {stage_index: {None}}, (stage_index, seen)
