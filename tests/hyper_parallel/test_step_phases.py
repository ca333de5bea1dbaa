"""The step's memory series of a HyperParallel-API mesh, its phases marked from the script's own
calls (hyper_parallel/step_phases.py): equal in simulation and dry run (tensor parallel,
fully_shard, and the ContextParallel style with its collectives and peak), with gradient accumulation (two backwards before the update) and without an
optimizer call; none without a backward."""
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops

import pytest
from mindspore import Parameter

from mindspore_hyper.hyper_parallel import (ColwiseParallel, ContextParallel, DTensor, RowwiseParallel, Shard,
                                            distribute_module, distribute_tensor, fully_shard, init_device_mesh,
                                            parallelize_module)
from mindspore_hyper.hyper_parallel.report import session_report
from mindspore_hyper.hyper_parallel.session import reset_session


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Dense(8, 16), nn.Dense(16, 8)

    def construct(self, x):
        return self.down(ops.relu(self.up(x)))


def _api_meshes(report):
    """The report's HyperParallel-API meshes (reset_session cleared the earlier ones): models other
    tests in this process left alive add their own entries."""
    return [m for m in report["meshes"] if m.get("source") == "HyperParallel API"]


def _api_mesh(mh, mode, backwards=1, update=True):
    """One step of the TP-2 MLP in `mode`: `backwards` forward+backward passes, then (if `update`)
    the optimizer; returns the mesh's report entry."""
    reset_session()
    mh.set_context(mode=mode, device_num=2)
    model = MLP()
    parallelize_module(model, init_device_mesh("npu", (2,), mesh_dim_names=("tp",)),
                       {"up": ColwiseParallel(), "down": RowwiseParallel()})
    optimizer = nn.SGD(model.trainable_params(), 1e-2)
    grad_fn = ms.value_and_grad(lambda x: (model(x) ** 2).mean(), None, optimizer.parameters)
    for _ in range(backwards):
        _, grads = grad_fn(Tensor(np.ones((4, 8), np.float32)))
    if update:
        optimizer(grads)
    (entry,) = _api_meshes(session_report(mode, 2))
    return entry


FORWARD = ["MatMul", "BiasAdd", "ReLU", "MatMul", "BiasAdd"]  # up, relu, down
# tp=2: up (16, 8) by rows + bias 16 -> 8 x 8 + 8 floats; down (8, 16) by columns 8 x 8 floats + bias 8
PARAMS = 4 * (8 * 8 + 8 + 8 * 8 + 8)


def test_one_step_equals_between_simulation_and_dry_run(fresh_session):
    sim, dry = (_api_mesh(fresh_session, mode)["step_memory"] for mode in ("simulation", "dryrun"))
    assert sim == dry
    assert [row[:2] for row in dry["timeline"]] == [["forward", op] for op in FORWARD] + \
        [["backward", op] for op in reversed(FORWARD)] + [["optimizer", "update"]]
    assert dry["timeline"][-1] == ["optimizer", "update", 0, PARAMS]
    # MindSpore's nn.SGD keeps two states of each parameter's shape (accum.*, stat.*), laid out like
    # it: the step peak is parameters + 2 x parameters + the series' peak
    peak = max(row[2] + row[3] for row in dry["timeline"])
    # both devices hold equal figures: one row for the group of devices 0 and 1
    assert dry["optimizer"] == "SGD" and [(row["devices"], row["step_peak"]) for row in dry["per_device"]] == \
        [("0-1 (2)", 3 * PARAMS + peak)]


def test_two_backwards_before_the_update_are_micro_batches_of_one_step(fresh_session):
    """The script accumulates: every gradient is alive from the first backward on, so through the
    second forward (the series covers the last micro-batch, as ParallelModel's does)."""
    sim, dry = (_api_mesh(fresh_session, mode, backwards=2)["step_memory"] for mode in ("simulation", "dryrun"))
    assert sim == dry
    forward = [row for row in dry["timeline"] if row[0] == "forward"]
    assert [row[1] for row in forward] == FORWARD and {row[3] for row in forward} == {PARAMS}
    one = _api_mesh(fresh_session, "dryrun")["step_memory"]
    assert [row[2] for row in forward] == [row[2] for row in one["timeline"] if row[0] == "forward"]


def test_a_backward_without_update_and_no_backward(fresh_session):
    dry = _api_mesh(fresh_session, "dryrun", update=False)["step_memory"]
    assert dry["optimizer"] is None and dry["timeline"][-1] == ["optimizer", "update", 0, PARAMS]
    assert _api_mesh(fresh_session, "dryrun", backwards=0, update=False)["step_memory"] is None


def test_fully_shard_gradients_live_at_the_shard_size(fresh_session):
    """fully_shard over 4 devices: the ops read all-gathered weights, but each gradient lives until
    the update reduce-scattered to the Parameter's piece (a quarter of its rows)."""
    entries = []
    for mode in ("simulation", "dryrun"):
        reset_session()
        fresh_session.set_context(mode=mode, device_num=4)
        model = MLP()
        mesh = init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
        for cell in (model.up, model.down, model):
            fully_shard(cell, mesh=mesh)
        optimizer = nn.Adam(model.trainable_params(), 1e-3)
        grad_fn = ms.value_and_grad(lambda x: (model(x) ** 2).mean(), None, optimizer.parameters)
        _, grads = grad_fn(distribute_tensor(Tensor(np.ones((8, 8), np.float32)), mesh, (Shard(0),)))
        optimizer(grads)
        (entry,) = _api_meshes(session_report(mode, 4))
        entries.append(entry)
    sim, dry = entries
    assert sim["step_memory"] == dry["step_memory"]
    # up (16, 8) + 16 and down (8, 16) + 8 floats, rows split over 4 devices: 16/4 and 8/4 rows each
    shard = 4 * (4 * 8 + 4 + 2 * 16 + 2)
    assert dry["parameter_bytes_per_device"] == shard
    assert dry["step_memory"]["timeline"][-1] == ["optimizer", "update", 0, shard]


B, S, H, D = 2, 8, 4, 3  # batch, sequence, heads, head size (BSHD)


class CausalCore(nn.Cell):
    """softmax(q k^T / sqrt(D) + causal mask) v on BSHD inputs (written for one device)."""

    def construct(self, q, k, v):
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
        scores = ops.matmul(q, k.transpose(0, 1, 3, 2)) / np.sqrt(D)
        mask = Tensor(np.triu(np.full((S, S), -1e9, np.float32), 1))
        return ops.matmul(ops.softmax(scores + mask, -1), v).transpose(0, 2, 1, 3)


class ScaledAttention(nn.Cell):
    def __init__(self, mesh):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (Parameter(Tensor(np.ones((H, D), np.float32)), name=n)
                                              for n in ("wq", "wk", "wv", "wo"))
        self.core, self.mesh = CausalCore(), mesh

    def construct(self, q, k, v):
        out = DTensor.from_local(self.core(q * self.wq, k * self.wk, v * self.wv), self.mesh, (Shard(1),))
        return ((out * self.wo) ** 2).mean().full_tensor()


@pytest.mark.parametrize("degree, moved", [(None, "AllToAll"), (1, "AllGather")], ids=["ulysses", "gathered-kv"])
def test_context_parallel_style_dry_runs_like_its_simulation(fresh_session, degree, moved):
    """ContextParallel on a 4-device cp mesh, one Adam step: the dry run's laid-out parameters,
    peak, collectives (forward and backward, with causes), ops and step series equal the simulation's."""
    entries = []
    for mode in ("simulation", "dryrun"):
        reset_session()
        fresh_session.set_context(mode=mode, device_num=4)
        mesh = init_device_mesh("npu", (4,), mesh_dim_names=("cp",))
        model = ScaledAttention(mesh)
        distribute_module(model, mesh)
        ContextParallel(ulysses_degree=degree).apply(model.core, mesh)
        optimizer = nn.Adam(model.trainable_params(), 1e-3)
        _, grads = ms.value_and_grad(model, None, optimizer.parameters)(
            *[distribute_tensor(Tensor(np.ones((B, S, H, D), np.float32)), mesh, (Shard(1),)) for _ in "qkv"])
        optimizer(grads)
        (entry,) = _api_meshes(session_report(mode, 4))
        entries.append(entry)
    sim, dry = entries
    for key in ("parameter_bytes_per_device", "peak_bytes_per_device", "collectives", "compute", "ops",
                "step_memory"):
        assert sim[key] == dry[key], key
    assert any(c["kind"] == moved and any(cause.startswith("ContextParallel") for cause in c["causes"])
               for c in dry["collectives"])
    assert any(c["phase"] == "backward" for c in dry["collectives"])
    assert dry["step_memory"]["timeline"][-1] == ["optimizer", "update", 0, 4 * 4 * H * D]  # 4 replicated weights
