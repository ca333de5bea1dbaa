"""HyperOffload's figures in the parallel model's report (`report().offload`, the `--json`
report's `offload`) and the memory per device: equal in a dry run and the simulation; the
simulation's measured copies and prefetches beside them; and the dry run's backward order (the
forward's uses in reverse) compared with the order MindSpore's backward really ran."""
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from mindspore_hyper.hyper_parallel.report import format_report, session_report
from mindspore_hyper.offload import OffloadPolicy, hyper_offload
from mindspore_hyper.offload.backward_order import BackwardOrder

from sim_models import DenseStack
from test_offload_dryrun import ADAM, ADAMW, BS, SGD, dense_stack, gpt, tiny_lm
from test_offload_training import SharedNet, data

pytestmark = pytest.mark.usefixtures("pynative")

MODELLED = ("stored_bytes", "stored_blocks", "host_tier_bytes", "disk_tier_bytes", "device_tier_peak_pinned_bytes",
            "peak_materialized_bytes", "device_loads_bytes")


def offloaded_run(mh, mode, case, cells, optimizer, device_blocks, host_blocks, block_size=BS, tmp=None):
    """Two offloaded training steps of `case` in `mode`; returns the parallel model's report, the
    run's `--json` entry of that model, and the offloaded model (removed and closed)."""
    make_model, strategy, inputs, loss_of = case(mh)
    mh.set_context(mode=mode, device_num=strategy.mesh.size)
    par = mh.auto_parallelize(make_model(), strategy)
    off = hyper_offload(par, OffloadPolicy(cells=cells), optimizer=optimizer, block_size=block_size,
                        device_memory=device_blocks * block_size,
                        host_memory=host_blocks * block_size * strategy.mesh.size, offload_dir=tmp, prefetch_depth=2)
    try:
        step = off.train_step(loss_of(par))
        for _ in range(2):
            step(*inputs)
        report = par.report()
        entry = next(m for m in session_report(mode, strategy.mesh.size)["meshes"]
                     if m.get("offload") and m["source"].startswith(type(par.network).__name__ + " ("))
        stores = [s.stats() for s in off.stores]
        return report, entry, stores, par
    finally:
        off.remove()
        off.close()


@pytest.mark.parametrize("case,cells,optimizer,device_blocks,host_blocks,block_size", [
    (dense_stack, ["layers.*"], ADAM, 3, 4, BS),  # 8 blocks per device, a host pool of 4: 4 rest on disk
    (gpt, ["embed", "blocks.*", "head"], ADAMW, 24, 64, 4096),  # workspaces after the backward
], ids=["dense, host pool of 4 blocks", "gpt embed+blocks+head, adamw"])
def test_offload_section_equal_in_simulation_and_dry_run(pynative, tmp_path, case, cells, optimizer, device_blocks,
                                                         host_blocks, block_size):
    sim, sim_entry, sim_stores, _ = offloaded_run(pynative, "simulation", case, cells, optimizer, device_blocks,
                                                  host_blocks, block_size, str(tmp_path))
    dry, dry_entry, _, _ = offloaded_run(pynative, "dryrun", case, cells, optimizer, device_blocks, host_blocks,
                                         block_size)
    assert sim.offload["per_device"] == dry.offload["per_device"]
    assert sim_entry["offload"]["per_device"] == dry_entry["offload"]["per_device"]
    assert sim_entry["offload"]["offloaded_per_device"] == dry_entry["offload"]["offloaded_per_device"]
    for rank, row in sim.offload["per_device"].items():
        assert set(row) == set(MODELLED)
        # the shape store's layout against the C++ store's own count of the blocks it allocated
        assert row["stored_blocks"] == sim_stores[rank]["blocks"]
        assert row["device_loads_bytes"] >= row["device_tier_peak_pinned_bytes"] > 0
        # the memory rows (activations with the Cell backward hooks' tensors: see the test below)
        assert sim.memory[rank] == dry.memory[rank]
        # the offloaded parameters count as the device tier's pinned peak
        assert sim.memory[rank]["offload_device_tier"] == row["device_tier_peak_pinned_bytes"]
    measured = sim.offload["measured_per_device"]
    assert dry.offload["measured_per_device"] is None and dry_entry["offload"]["measured_per_device"] is None
    assert all(m["bytes_to_device"] > 0 for m in measured.values())  # the tier cannot keep every block
    if case is dense_stack:
        # each device keeps of its 64-wide layers' shards only the head: Dense(64, 1) replicated,
        # 65 float32 parameters (and as many gradient elements)
        assert [m["parameters"] for m in dry.memory.values()] == [4 * 65] * 8
        assert [m["gradients"] for m in dry.memory.values()] == [4 * 65] * 8
        row = dry.offload["per_device"][0]
        assert row["stored_blocks"] == 8 and (row["host_tier_bytes"], row["disk_tier_bytes"]) == (4 * BS, 4 * BS)
        # the host pool is never over its 4 blocks in the simulation either, and those blocks stay in
        # memory: each is on the host tier or, when the last write went to its device copy (which
        # drops the unpinned host copy), on the device tier; which of the two depends on the
        # prefetch workers' timing (measured: host 3 + device 3 on some devices, 4 + 2 on others)
        assert all(m["host_tier_bytes"] <= 4 * BS <= m["host_tier_bytes"] + m["device_tier_bytes"]
                   for m in measured.values()), {r: (m["host_tier_bytes"], m["device_tier_bytes"])
                                                 for r, m in measured.items()}


def test_offload_lowers_the_memory_rows_by_the_offloaded_parameters(pynative, tmp_path):
    """The same model's report without offload, against the dry run's with every layer of the
    Dense stack offloaded: parameters, gradients and optimizer states drop by exactly the strategy
    table's bytes of the offloaded parameters; the device tier's pinned peak is added."""
    report, _, _, par = offloaded_run(pynative, "dryrun", dense_stack, ["layers.*"], ADAM, 3, 64)
    offloaded = [row for row in par.table if row.name.startswith("layers.")]
    plain = par.report()  # the offload removed: the whole model on the device again
    for rank, m in report.memory.items():
        held = [row for row in offloaded if rank in row.devices]
        assert m["parameters"] == plain.memory[rank]["parameters"] - sum(r.param_bytes for r in held)
        assert m["optimizer_states"] == plain.memory[rank]["optimizer_states"] - sum(r.optimizer_bytes for r in held)
        assert m["offload_device_tier"] == BS and "offload_device_tier" not in plain.memory[rank]
    assert plain.offload is None


def test_dry_run_report_says_the_backward_order_is_assumed(pynative):
    report, entry, _, _ = offloaded_run(pynative, "dryrun", dense_stack, ["layers.*"], ADAM, 8, 64)
    order = report.offload["backward_order"]
    assert order == {"modelled": ["layers.3", "layers.2", "layers.1", "layers.0"], "observed": None, "matches": None}
    text = str(report)
    assert "backward order of the offload units: assumed, the forward's uses in reverse" in text
    assert "measured copies and prefetches: none in a dry run" in text
    run_text = format_report({"mode": "dryrun", "devices": 8, "meshes": [entry]})
    assert "offload stores 41.62 KiB (host tier 64.00 KiB, disk tier 0 B)" in run_text
    assert "assumed, the forward's uses in reverse" in run_text


def test_report_with_an_optimizer_is_refused_for_an_offloaded_model(pynative):
    make_model, strategy, inputs, loss_of = dense_stack(pynative)
    pynative.set_context(mode="dryrun", device_num=8)
    par = pynative.auto_parallelize(make_model(), strategy)
    off = hyper_offload(par, OffloadPolicy(cells=["layers.*"]), optimizer=ADAM, block_size=BS, device_memory=8 * BS)
    off.train_step(loss_of(par))(*inputs)
    with pytest.raises(ValueError, match=r"report\(optimizer\): the model's offloaded units are updated by"):
        par.report(nn.Adam(par.optimizer_parameters(), 1e-3))
    off.remove()


# -- the backward's order, observed --------------------------------------------------------------

class Encoder(nn.Cell):
    """MindSpore's own nn.TransformerEncoderLayer (post- or pre-norm) and a Dense head."""

    def __init__(self, norm_first):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, norm_first=norm_first)
        self.head = nn.Dense(32, 1)

    def construct(self, x):
        return self.head(self.layer(x))


ENCODER_CELLS = ["layer.self_attn", "layer.norm1", "layer.dense1", "layer.dense2", "layer.norm2", "head"]


def _encoder_data():
    rng = np.random.default_rng(0)
    return (Tensor(rng.standard_normal((2, 8, 32)).astype(np.float32)),
            Tensor(rng.standard_normal((2, 8, 1)).astype(np.float32)))


def _observed_order(mh, tmp, network, cells, inputs, loss, mesh=None):
    """The backward order of the second of two offloaded steps: on one device, or simulated on
    `mesh` (a Strategy: every Cell's backward then watched by MindSpore's Cell hooks)."""
    model = network
    if mesh is not None:
        mh.set_context(mode="simulation", device_num=mesh.mesh.size)
        model = mh.auto_parallelize(network, mesh)
    off = hyper_offload(model, OffloadPolicy(cells=cells), optimizer=SGD, block_size=4096,
                        device_memory=64 * 4096, host_memory=256 * 4096, offload_dir=tmp)
    try:
        step = off.train_step(lambda *a: loss(model, *a))
        for _ in range(2):
            step(*inputs)
        return off.backward_order()
    finally:
        off.remove()
        off.close()


def _mse(model, x, y):
    return ops.reduce_mean((model(x) - y) ** 2)


def _case(name, mh):
    """(network, cells, inputs, loss, strategy or None) of each model the check runs over."""
    if name in ("dense stack (one device)", "shared and two-input cells (one device)"):
        net = DenseStack() if name.startswith("dense") else SharedNet()
        return net, (["layers.*"] if name.startswith("dense") else ["layers.*", "mix"]), data(), _mse, None
    if name.startswith("nn.TransformerEncoderLayer"):
        strategy = mh.Layout((2,), ("data",))(tensor_map=()) if "simulation" in name else None
        return Encoder("pre-norm" in name), ENCODER_CELLS, _encoder_data(), _mse, strategy
    case, cells = {"dense stack, data 2 x tensor 4": (dense_stack, ["layers.*"]),
                   "gpt attention units, data 2 x tensor 2": (gpt, ["blocks.*.attn", "blocks.*.mlp"]),
                   "gpt embed+blocks+head": (gpt, ["embed", "blocks.*", "head"]),
                   "llama-like q/k/v branches": (tiny_lm, ["block.attn.q", "block.attn.k", "block.attn.v",
                                                            "block.attn.proj", "block.mlp.*", "head"])}[name]
    make_model, strategy, inputs, loss_of = case(mh)
    return make_model(), cells, inputs, (lambda model, *a: loss_of(model)(*a)), strategy


@pytest.mark.parametrize("name", [
    "dense stack (one device)", "shared and two-input cells (one device)", "dense stack, data 2 x tensor 4",
    "gpt attention units, data 2 x tensor 2", "gpt embed+blocks+head", "llama-like q/k/v branches",
    "nn.TransformerEncoderLayer post-norm (one device)", "nn.TransformerEncoderLayer pre-norm (simulation)"])
def test_observed_backward_order_is_the_modelled_one(pynative, tmp_path, name):
    network, cells, inputs, loss, strategy = _case(name, pynative)
    order = _observed_order(pynative, str(tmp_path), network, cells, inputs, loss, strategy)
    assert order.forward and order.observed == order.modelled and order.matches
    assert "observed, " in order.text() and "NOT" not in order.text()


class UnusedBranch(nn.Cell):
    """A unit whose forward output never reaches the loss: its backward never runs, while the dry
    run's model (the forward's uses in reverse) gives it one."""

    def __init__(self):
        super().__init__()
        self.a, self.side, self.b = nn.Dense(32, 32), nn.Dense(32, 32), nn.Dense(32, 1)

    def construct(self, x):
        h = ops.tanh(self.a(x))
        self.side(h)  # computed and dropped
        return self.b(h)


def test_a_backward_other_than_the_model_is_reported(pynative, tmp_path):
    order = _observed_order(pynative, str(tmp_path), UnusedBranch(), ["a", "side", "b"], data(), _mse)
    assert order.forward == ("a", "side", "b") and order.observed == ("b", "a")
    assert order.matches is False and order.first_difference() == 1
    assert "NOT the reverse of the forward's uses (b, side, a; use 1: a instead of side)" in order.text()


def test_backward_order_value():
    order = BackwardOrder(("x", "y"), None)
    assert order.modelled == ("y", "x") and order.matches is None and order.first_difference() is None
    assert BackwardOrder(("x", "y"), ("y",)).first_difference() == 1
    assert BackwardOrder(("x", "y"), ("y", "x")).to_dict() == {"modelled": ["y", "x"], "observed": ["y", "x"],
                                                               "matches": True}


# -- memory per device with offload on ------------------------------------------------------------

def _encoder(mh):
    """MindSpore's own nn.TransformerEncoderLayer (pre-norm) and a Dense head, data 2."""
    x, y = _encoder_data()
    return (lambda: Encoder(True)), mh.Layout((2,), ("data",))(tensor_map=()), (x, y), \
        (lambda par: lambda a, b: _mse(par, a, b))


# each use of an offload unit in the forward: one CellBackwardHook over its tensor inputs, two over
# its tensor outputs (the Cell backward hook's, then the backward pre-hook's: `watch_cell_backward`)
_HOOK_OPS_PER_USE = 3


@pytest.mark.parametrize("case,cells,optimizer,device_blocks,host_blocks,block_size", [
    (dense_stack, ["layers.*"], ADAM, 3, 4, BS),
    (gpt, ["blocks.*.attn", "blocks.*.mlp"], SGD, 40, 64, 2048),
    (gpt, ["embed", "blocks.*", "head"], ADAMW, 24, 64, 4096),
    (_encoder, ENCODER_CELLS, SGD, 64, 256, 4096),
], ids=["dense stack", "gpt attention and mlp units", "gpt embed+blocks+head", "nn.TransformerEncoderLayer"])
def test_memory_per_device_equal_in_simulation_and_dry_run(pynative, tmp_path, case, cells, optimizer,
                                                           device_blocks, host_blocks, block_size):
    """With offload on, every per-device memory figure of the dry run equals the simulation's:
    the report's rows, the run report's peaks, op at the peak, timeline and step series, which
    include the tensors of the CellBackwardHook ops around each offload unit's call."""
    sim, sim_entry, _, _ = offloaded_run(pynative, "simulation", case, cells, optimizer, device_blocks, host_blocks,
                                         block_size, str(tmp_path))
    dry, dry_entry, _, _ = offloaded_run(pynative, "dryrun", case, cells, optimizer, device_blocks, host_blocks,
                                         block_size)
    assert sim.memory == dry.memory
    for key in ("memory_per_device", "peak_bytes_per_device", "peak_op", "memory_timeline", "step_memory"):
        assert sim_entry[key] == dry_entry[key], key
    uses = len(dry.offload["backward_order"]["modelled"])
    assert [op for op, _ in dry_entry["memory_timeline"]].count("CellBackwardHook") == _HOOK_OPS_PER_USE * uses


@pytest.mark.parametrize("mode", ["simulation", "dryrun"])
def test_cell_backward_hook_tensors_are_the_units_inputs_once_and_outputs_twice(pynative, tmp_path, mode):
    """The offloaded Dense stack's activation peak exceeds the same model's without offload by
    exactly its units' inputs once and outputs twice, held to the end of the step: per device 8
    rows (batch 16 over data 2) of float32; the units' local widths in/out are 64/16 (column-
    parallel), 16/64 (row-parallel; its partial output), 64/16 and 16/64: 8 * 4 * (160 + 2 * 160)
    = 15 360 bytes."""
    make_model, strategy, inputs, loss_of = dense_stack(pynative)
    pynative.set_context(mode=mode, device_num=8)
    plain = pynative.auto_parallelize(make_model(), strategy)
    plain.runtime.grad(loss_of(plain), None, plain.trainable_params())(*inputs)
    plain_peaks = {rank: m["activations_peak"] for rank, m in plain.report().memory.items()}
    report, _, _, _ = offloaded_run(pynative, mode, dense_stack, ["layers.*"], ADAM, 3, 4, tmp=str(tmp_path))
    assert {rank: m["activations_peak"] - plain_peaks[rank] for rank, m in report.memory.items()} == \
        {rank: 8 * 4 * (160 + 2 * 160) for rank in range(8)}
