"""Pipeline schedules with DTensor inputs and DTensor activations (upstream's vpp_schedule
pattern): `run(x)` with a DTensor `x` cuts each device's rows into the microbatches, keeping the
placements; stages on a mesh take and return DTensors; every pipeline rank's schedule runs in
this process (`run_ranks_in_process`) against one device running the same layers on the same
microbatches.

Tolerances: the pipeline runs the same float32 ops as one device on the same rows; values differ
only by the order of sums (per-device partial sums of a batch of 2 rows, gradients summed over 4
microbatches in another order). Reassociating a sum of n <= 8 float32 terms of magnitude O(1)
moves it by at most about n * 2**-24 ~ 5e-7, so rtol=1e-5 / atol=1e-6 keeps a ~10x margin and
still catches any wrong or missing term (a microbatch's gradient is O(1e-2) or more).
"""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn, ops

from mindspore_hyper.hyper_parallel import (
    ColwiseParallel, DeviceMesh, DTensor, Partial, PipelineStage, Replicate, RowwiseParallel, Schedule1F1B,
    ScheduleInterleaved1F1B, Shard, distribute_module, distribute_tensor, init_device_mesh, parallelize_module,
)
from mindspore_hyper.hyper_parallel.pipeline_activations import (
    WireLayout, WireRoute, from_wire, received_mesh, to_wire, wire_meta,
)
from mindspore_hyper.hyper_parallel.pipeline_microbatches import split_inputs
from mindspore_hyper.hyper_parallel.pipeline_schedule import run_ranks_in_process
from mindspore_hyper.pipeline.stage_transport import header_of
from pipeline_layers import Block, Head

RTOL, ATOL = 1e-5, 1e-6
STAGES, M, BATCH = 4, 4, 8


class Seen(nn.Cell):
    """A stage Cell that records the placements of the input it gets (None: a plain Tensor)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.seen = []

    def construct(self, x):
        self.seen.append(x.placements if isinstance(x, DTensor) else None)
        return self.inner(x)


def make_pair(seed=0):
    """The pipeline's layers and a one-device copy holding the same values."""
    ms.set_seed(seed)
    layers = list(nn.CellList([Block() for _ in range(STAGES - 1)] + [Head()]))
    twin = list(nn.CellList([Block() for _ in range(STAGES - 1)] + [Head()]))
    for a, b in zip(layers, twin):
        for p, q in zip(a.trainable_params(), b.trainable_params()):
            q.set_data(Tensor(p.asnumpy()))
    return layers, twin


def batch(seed=0):
    return Tensor(np.random.RandomState(seed).randn(BATCH, 8).astype(np.float32))


def schedules(cells, chunks):
    """One schedule per pipeline rank: rank r holds stages r, r + p, ... (1F1B: one each)."""
    ranks = STAGES // chunks
    out = []
    for r in range(ranks):
        stages = [PipelineStage(cells[s], s, STAGES) for s in range(r, STAGES, ranks)]
        out.append(ScheduleInterleaved1F1B(stages, M) if chunks > 1 else Schedule1F1B(stages[0], M))
    return out


def one_device(layers, x, rows_of):
    """One device on the same microbatches (`rows_of(m)`: microbatch m's rows of `x`): each
    microbatch's output and the gradient of their sum (upstream seeds each output with ones)."""
    params = [p for layer in layers for p in layer.trainable_params()]

    def forward(part):
        h = part
        for layer in layers:
            h = layer(h)
        return h

    def step(x):
        total = 0
        for m in range(M):
            total = total + forward(ops.gather(x, Tensor(rows_of(m), ms.int32), 0))
        return total

    _, grads = ms.value_and_grad(step, None, params)(x)
    outputs = [float(forward(ops.gather(x, Tensor(rows_of(m), ms.int32), 0)).asnumpy()) for m in range(M)]
    return outputs, grads


def check_against_one_device(layers, twin, outputs, rows_of, x):
    expected, grads = one_device(twin, x, rows_of)
    np.testing.assert_allclose([float(o.asnumpy()) for o in outputs], expected, rtol=RTOL, atol=ATOL)
    params = [p for layer in layers for p in layer.trainable_params()]
    for p, g in zip(params, grads):
        np.testing.assert_allclose(p.grad.asnumpy(), g.asnumpy(), rtol=RTOL, atol=ATOL, err_msg=p.name)


def test_a_dtensor_input_is_cut_per_device_keeping_its_placements(fresh_session):
    fresh_session.set_context(device_num=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    x = batch()
    sharded = split_inputs((distribute_tensor(x, mesh, (Shard(0),)),), M, None)
    for m, (part,) in enumerate(sharded):  # device 0 holds rows 0-3, device 1 rows 4-7: row m of each
        assert part.placements == (Shard(0),) and part.shape == (2, 8)
        np.testing.assert_array_equal(part.asnumpy(), x.asnumpy()[[m, 4 + m]])
    replicated = split_inputs((distribute_tensor(x, mesh, (Replicate(),)),), M, None)
    for m, (part,) in enumerate(replicated):  # unsharded batch: the global tensor's consecutive rows
        assert part.placements == (Replicate(),)
        np.testing.assert_array_equal(part.asnumpy(), x.asnumpy()[2 * m:2 * m + 2])
    uneven = distribute_tensor(Tensor(np.ones((7, 8), np.float32)), mesh, (Shard(0),))  # 4 + 3 rows
    with pytest.raises(ValueError, match=r"micro_batch_num=2 does not divide input 0's batch dimension 0 on every "
                                         r"device.*\{1: 3\} on ranks \[1\]"):
        split_inputs((uneven,), 2, None)


@pytest.mark.parametrize("chunks", [1, 2], ids=["1F1B", "interleaved"])
def test_data_parallel_stages_take_and_return_dtensors_like_one_device(fresh_session, chunks):
    """The batch Shard(0) over "dp" (upstream's vpp_schedule input), each stage's Parameters
    replicated on the mesh: every stage gets and returns a Shard(0) DTensor."""
    fresh_session.set_context(device_num=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    layers, twin = make_pair()
    cells = [Seen(distribute_module(layer, mesh)) for layer in layers]
    x = batch()
    outputs = run_ranks_in_process(schedules(cells, chunks), distribute_tensor(x, mesh, (Shard(0),)))
    assert all(isinstance(o, DTensor) for o in outputs) and len(outputs) == M
    assert all(cell.seen[0] == (Shard(0),) for cell in cells)  # the forward's input, first microbatch
    check_against_one_device(layers, twin, outputs, lambda m: [m, 4 + m], x)


@pytest.mark.parametrize("chunks", [1, 2], ids=["1F1B", "interleaved"])
def test_tensor_parallel_stages_pass_split_activations_like_one_device(fresh_session, chunks):
    """Stages alternate Colwise and Rowwise with DTensor outputs, so every other activation
    crosses the pipeline split along its features (Shard(-1)) and is taken as such."""
    fresh_session.set_context(device_num=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    layers, twin = make_pair(seed=3)
    for s, layer in enumerate(layers[:-1]):
        style = (ColwiseParallel(use_local_output=False) if s % 2 == 0 else
                 RowwiseParallel(input_layouts=Shard(-1), use_local_output=False))
        parallelize_module(layer, mesh, {"dense": style})
    distribute_module(layers[-1], mesh)
    cells = [Seen(layer) for layer in layers]
    x = batch()
    outputs = run_ranks_in_process(schedules(cells, chunks), distribute_tensor(x, mesh, (Replicate(),)))
    assert [cell.seen[0] for cell in cells] == [(Replicate(),), (Shard(1),), (Replicate(),), (Shard(1),)]
    check_against_one_device(layers, twin, outputs, lambda m: [2 * m, 2 * m + 1], x)


class Project(nn.Cell):
    """8 -> 8 without bias: row-parallel with a Partial output, its stage returns the Partial DTensor."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(8, 8, has_bias=False, weight_init="normal")

    def construct(self, x):
        return self.dense(x)


class Act(nn.Cell):
    """A stage without Parameters: tanh of what it gets (a DTensor stays one)."""

    def construct(self, x):
        return ops.tanh(x)


@pytest.mark.parametrize("chunks", [1, 2], ids=["1F1B", "interleaved"])
def test_a_partial_activation_and_a_stage_without_parameters_like_one_device(fresh_session, chunks):
    """Stage 1 (row-parallel, output_layouts=Partial()) returns a Partial DTensor, which stage 2,
    without Parameters (so on the sender's mesh), takes as a Partial DTensor; its tanh reduces it.
    Loss and every gradient equal one device: the Partial's pieces each get the reduced value's
    gradient back."""
    fresh_session.set_context(device_num=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    ms.set_seed(5)
    kinds = (Block, Project, Act, Head)
    layers, twin = [k() for k in kinds], [k() for k in kinds]
    for a, b in zip(layers, twin):
        for p, q in zip(a.trainable_params(), b.trainable_params()):
            q.set_data(Tensor(p.asnumpy()))
    parallelize_module(layers[0], mesh, {"dense": ColwiseParallel(use_local_output=False)})
    parallelize_module(layers[1], mesh, {"dense": RowwiseParallel(input_layouts=Shard(-1), output_layouts=Partial(),
                                                                  use_local_output=False)})
    distribute_module(layers[3], mesh)
    cells = [Seen(layer) for layer in layers]
    x = batch(2)
    outputs = run_ranks_in_process(schedules(cells, chunks), distribute_tensor(x, mesh, (Replicate(),)))
    assert [cell.seen[0] for cell in cells] == [(Replicate(),), (Shard(1),), (Partial(),), (Replicate(),)]
    check_against_one_device(layers, twin, outputs, lambda m: [2 * m, 2 * m + 1], x)


def local_route():
    route = WireRoute()
    route.local_pieces, route.rank = True, 0  # as a schedule sets them under msrun (one process per device)
    return route


def test_a_dtensor_activation_travels_as_its_local_piece_with_its_layout(fresh_session):
    """Under msrun each device sends its local piece, its layout in a header of ints beside it
    (the 4-process msrun job checks the whole path: pipeline_tp_script.py); on a mesh of one
    device the piece is the whole value, so the receiving side's DTensor must equal it exactly."""
    fresh_session.set_context(device_num=1)
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    value = np.random.RandomState(0).randn(2, 6).astype(np.float32)
    wire = to_wire(distribute_tensor(Tensor(value), mesh, (Shard(-1),)), 0, local_route())
    # mesh (1,), shape (2, 6), Shard(1), ranks from offset 0 (consecutive), the name "tp"
    assert not isinstance(wire, DTensor) and header_of(wire) == (1, 1, 2, 2, 6, 1, 1, 0, 0, 2, ord("t"), ord("p"))
    assert wire_meta(wire) == WireLayout((Shard(1),), (1,), (2, 6), rank_offsets=(0,), mesh_dim_names=("tp",))
    received = from_wire(wire, wire_meta(wire), mesh, 1, 0)
    assert received.placements == (Shard(1),) and tuple(received.shape) == (2, 6)
    np.testing.assert_array_equal(received.full_tensor().asnumpy(), value)
    replicated = to_wire(distribute_tensor(Tensor(value), mesh, (Replicate(),)), 0, local_route())
    assert wire_meta(replicated).placements == (Replicate(),)
    plain = Tensor(value)
    assert to_wire(plain, 0, local_route()) is plain and wire_meta(plain) is None


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
def test_a_partial_activation_travels_as_its_piece_and_stays_partial(fresh_session, op):
    """A Partial piece travels as it is (upstream's stages send the local tensor with its layout,
    Partial included): the receiver's DTensor is Partial with the same reduce op, so its value is
    the reduction of the pieces (on one device, the piece itself)."""
    fresh_session.set_context(device_num=1)
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    value = np.random.RandomState(1).randn(2, 6).astype(np.float32)
    wire = to_wire(DTensor.from_local(Tensor(value), mesh, (Partial(op),)), 0, local_route())
    assert header_of(wire)[5:7] == (2, ("sum", "avg", "max", "min").index(op))
    received = from_wire(wire, wire_meta(wire), mesh, 1, 0)
    assert received.placements == (Partial(op),)
    np.testing.assert_array_equal(received.full_tensor().asnumpy(), value)


def test_a_stage_without_parameters_takes_the_senders_mesh_on_its_own_block(fresh_session):
    """With one process or thread per rank, the header carries the sender's mesh (ranks relative
    to the sending rank, names); a stage without a laid-out Parameter takes that mesh moved by the
    receiving rank minus the sending one (the same position of the next block)."""
    fresh_session.set_context(device_num=4)
    mesh = DeviceMesh("cpu", [[0, 2], [1, 3]], mesh_dim_names=("dp", "tp"))  # not consecutive: every rank listed
    wire = to_wire(distribute_tensor(batch(), mesh, (Replicate(), Replicate())), 0, local_route())
    meta = wire_meta(wire)
    assert meta.rank_offsets == (0, 2, 1, 3) and meta.mesh_dim_names == ("dp", "tp") and meta.mesh_shape == (2, 2)
    moved = received_mesh(meta, 4)
    assert moved.mesh.tolist() == [[4, 6], [5, 7]] and moved.mesh_dim_names == ("dp", "tp")
    one = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",), rank_list=[0])
    wire = to_wire(DTensor.from_local(batch(), one, (Partial(),)), 0, local_route())
    received = from_wire(wire, wire_meta(wire), None, 1, 0)  # no stage mesh: the sender's, at rank 0
    assert received.placements == (Partial(),) and received.device_mesh == one
    np.testing.assert_array_equal(received.full_tensor().asnumpy(), batch().asnumpy())


def test_a_local_output_differing_per_device_is_refused_in_simulation(fresh_session):
    """A style's use_local_output=True view of a sharded output is rank-local: each device's own
    tensor (under msrun the one it sends: pipeline_tp_script.py); one process holding several
    devices cannot send it as one tensor."""
    fresh_session.set_context(device_num=2)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    pieces = distribute_tensor(batch(), mesh, (Shard(1),)).to_local()
    for route in (WireRoute(), local_route()):
        with pytest.raises(ValueError, match=r"PipelineStage 0: its Cell returned a local tensor that differs per "
                                             r"device .* return the DTensor \(use_local_output=False\)"):
            to_wire(pieces, 0, route)


def test_dtensor_activations_that_cannot_travel_between_processes_are_refused(fresh_session):
    fresh_session.set_context(device_num=1)
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    wire = to_wire(distribute_tensor(batch(), mesh, (Shard(0),)), 0, local_route())
    square = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    with pytest.raises(ValueError, match=r"PipelineStage 2: it receives a DTensor laid out on a mesh of shape \(1,\) "
                                         r".*its own mesh .* has shape \(1, 1\)"):
        from_wire(wire, wire_meta(wire), square, 2, 0)
    # 3 (mesh) + 3 (shape) + 4 (placements) + 2 (ranks) + 2 x 31 (names): 74 ints
    long_names = init_device_mesh("cpu", (1, 1), mesh_dim_names=("a" * 30, "b" * 30))
    with pytest.raises(ValueError, match=r"PipelineStage 0: its DTensor output's layout .* needs 74 header ints; at "
                                         r"most 63 travel"):
        to_wire(distribute_tensor(batch(), long_names, (Shard(0), Replicate())), 0, local_route())
