"""HyperOffload in a dry run: the device-tier figures of an offloaded dry-run model equal the
numeric simulation's offloaded run byte for byte (per device: parameter and workspace bytes
materialized at once, blocks pinned on the tier at once), from shapes only; the shape store lays
out blocks as the C++ store does; what the dry run does not model is refused, named."""
import os
import sys

import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from mindspore_hyper.offload import OffloadPolicy, OffloadStore, WorkingSetError, hyper_offload

from sim_models import DenseStack, TinyLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "examples"))
from models import GPT  # noqa: E402
from train_transformer import megatron_strategy  # noqa: E402

pytestmark = pytest.mark.usefixtures("pynative")

BS = 8192
DIM = 64
FIGURES = ("per_device_peak_materialized_bytes", "per_device_peak_pinned_bytes")
ADAM = lambda ps: nn.Adam(ps, learning_rate=0.01)  # noqa: E731
SGD = lambda ps: nn.SGD(ps, learning_rate=0.01, momentum=0.9)  # noqa: E731
# no host rule (weight decay): updated through the optimizer workspaces after the backward
ADAMW = lambda ps: nn.AdamWeightDecay(ps, learning_rate=1e-3, weight_decay=0.01)  # noqa: E731


def dense_stack(mh):
    """DenseStack(dim 64) on data 2 x tensor 4, Megatron's column/row pairs, ZeRO-1 over data."""
    strategy = mh.Layout((2, 4), ("data", "tensor"))(tensor_map=(), optimizer_state="data")
    for i in (0, 2):
        strategy.override(f"layers.{i}.*", "tensor").override(f"layers.{i + 1}.weight", None, "tensor")
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((16, DIM)).astype(np.float32))
    y = Tensor(rng.standard_normal((16, 1)).astype(np.float32))
    loss_of = lambda par: lambda a, b: ops.reduce_mean((par(a) - b) ** 2)  # noqa: E731
    return (lambda: DenseStack(dim=DIM)), strategy, (x, y), loss_of


def gpt(mh):
    """The examples' GPT (hidden 32, 2 blocks) on data 2 x tensor 2 (Megatron, ZeRO-1)."""
    ids = Tensor(np.random.default_rng(0).integers(0, 128, (4, 8)).astype(np.int32))
    return (lambda: GPT(vocab=128, hidden=32, heads=4, layers=2, seq=8)), megatron_strategy(4), (ids, ids), \
        (lambda par: lambda a, b: par(a, b))


def tiny_lm(mh):
    """A Llama-like block on data 2 x tensor 2 (q, k, v column-parallel on one input: branches)."""
    strategy = mh.Layout((2, 2), ("data", "tensor"))(tensor_map=())
    for name in ("q", "k", "v"):
        strategy.override(f"block.attn.{name}.*", "tensor")
    strategy.override("block.attn.proj.weight", None, "tensor")
    strategy.override("block.mlp.up.*", "tensor").override("block.mlp.down.weight", None, "tensor")
    strategy.override("head.weight", "tensor")
    ids = Tensor(np.random.default_rng(0).integers(0, 64, (4, 8)).astype(np.int32))
    return TinyLM, strategy, (ids, ids), (lambda par: lambda a, b: par(a, b))


def offloaded_stats(mh, mode, case, cells, optimizer, device_blocks, block_size=BS, steps=2, tmp=None):
    make_model, strategy, inputs, loss_of = case(mh)
    mh.set_context(mode=mode, device_num=strategy.mesh.size)
    par = mh.auto_parallelize(make_model(), strategy)
    off = hyper_offload(par, OffloadPolicy(cells=cells), optimizer=optimizer, block_size=block_size,
                        device_memory=device_blocks * block_size, host_memory=64 * block_size * strategy.mesh.size,
                        offload_dir=tmp, prefetch_depth=2)
    try:
        step = off.train_step(loss_of(par))
        for _ in range(steps):  # the first step records the uses; later ones materialize ahead
            step(*inputs)
        return off.stats()
    finally:
        off.remove()
        off.close()


@pytest.mark.parametrize("case,cells,optimizer,device_blocks,block_size", [
    (dense_stack, ["layers.*"], ADAM, 3, BS),
    (dense_stack, ["layers.*"], ADAM, 8, BS),
    (gpt, ["blocks.*.attn", "blocks.*.mlp"], SGD, 40, 2048),
    (tiny_lm, ["block.attn.q", "block.attn.k", "block.attn.v", "block.attn.proj", "block.mlp.*", "head"], SGD, 18,
     1024),
    # the workspaces and the update's pins raise both peaks above Adam's (33 984 and 36 864 bytes)
    (gpt, ["embed", "blocks.*", "head"], ADAMW, 24, 4096),
], ids=["dense, tier of 3 blocks", "dense, tier of 8 blocks (materialized ahead)", "gpt attn+mlp units, sgd",
        "llama-like q/k/v branch units", "gpt embed+blocks+head, adamw (no host rule: workspaces)"])
def test_dryrun_offload_equals_simulation(pynative, tmp_path, case, cells, optimizer, device_blocks, block_size):
    sim = offloaded_stats(pynative, "simulation", case, cells, optimizer, device_blocks, block_size, tmp=str(tmp_path))
    dry = offloaded_stats(pynative, "dryrun", case, cells, optimizer, device_blocks, block_size)
    for key in FIGURES:
        assert dry[key] == sim[key], key
    assert all(b > 0 for b in dry["per_device_peak_pinned_bytes"])
    if optimizer is ADAMW:
        assert dry["per_device_peak_materialized_bytes"][0] > 33984 and dry["per_device_peak_pinned_bytes"][0] > 36864


def test_dryrun_offload_figures_follow_the_tier(pynative):
    """Per device, DenseStack's units hold 4 * (64*16 + 16) bytes (column-parallel: 16 weight rows
    and 16 bias elements) and 4 * (64*16 + 64) (row-parallel: 16 weight columns, the whole bias),
    each in one block of 8 KiB. Half the tier is for the unit in use and the next units
    materialized ahead (from the second step): a tier of 3 blocks leaves 1 (no unit ahead), so the
    peak is the larger unit in its one block; a tier of 8 leaves 4, so all four units are
    materialized at once."""
    column, row = 4 * (64 * 16 + 16), 4 * (64 * 16 + 64)
    small = offloaded_stats(pynative, "dryrun", dense_stack, ["layers.*"], ADAM, 3)
    assert small["per_device_peak_materialized_bytes"] == [row] * 8
    assert small["per_device_peak_pinned_bytes"] == [BS] * 8
    large = offloaded_stats(pynative, "dryrun", dense_stack, ["layers.*"], ADAM, 8)
    assert large["per_device_peak_materialized_bytes"] == [2 * (column + row)] * 8
    assert large["per_device_peak_pinned_bytes"] == [4 * BS] * 8


def test_working_set_refusal_is_the_simulations(pynative, tmp_path):
    messages = []
    for mode in ("simulation", "dryrun"):
        make_model, strategy, _, _ = dense_stack(pynative)
        pynative.set_context(mode=mode, device_num=8)
        par = pynative.auto_parallelize(make_model(), strategy)
        with pytest.raises(WorkingSetError) as error:
            hyper_offload(par, OffloadPolicy(cells=["layers.*"]), optimizer=ADAM, block_size=BS // 4,
                          device_memory=BS // 4, host_memory=48 * BS, offload_dir=str(tmp_path))
        messages.append(str(error.value))
    assert messages[0] == messages[1] and "on device 0" in messages[0]


def _dry_model(mh):
    make_model, strategy, _, _ = dense_stack(mh)
    mh.set_context(mode="dryrun", device_num=8)
    return mh.auto_parallelize(make_model(), strategy)


def test_dryrun_refuses_activation_swap(pynative):
    with pytest.raises(NotImplementedError, match=r"activation_cells=\['layers.1'\] is not modelled"):
        hyper_offload(_dry_model(pynative), OffloadPolicy(cells=["layers.*"], activation_cells=["layers.1"]),
                      optimizer=ADAM, block_size=BS, device_memory=8 * BS)


def test_dryrun_refuses_moe_layers(pynative):
    """The expert cache's decisions follow the routed tokens (values): refused, named."""
    import moe_training  # examples/

    pynative.set_context(mode="dryrun", device_num=8)
    model = pynative.auto_parallelize(moe_training.MoEClassifier(), moe_training.strategy(8))
    with pytest.raises(NotImplementedError, match=r"a model with MoE layers \(the expert cache's hits"):
        hyper_offload(model, OffloadPolicy(), optimizer=ADAM, block_size=BS, device_memory=8 * BS)


def test_dryrun_refuses_a_store_and_a_plain_network(pynative, tmp_path):
    par = _dry_model(pynative)
    store = OffloadStore(block_size=BS, device_memory=4 * BS, host_memory=8 * BS, offload_dir=str(tmp_path))
    try:
        with pytest.raises(ValueError, match=r"store: a dry run makes its own shape-only stores"):
            hyper_offload(par, OffloadPolicy(cells=["layers.*"]), optimizer=ADAM, store=store)
    finally:
        store.close()
    with pytest.raises(NotImplementedError, match=r"hyper_offload in a dry run of a DenseStack"):
        hyper_offload(DenseStack(dim=DIM), OffloadPolicy(cells=["layers.*"]), optimizer=ADAM)
    off = hyper_offload(par, OffloadPolicy(cells=["layers.*"]), optimizer=ADAM, block_size=BS, device_memory=8 * BS)
    with pytest.raises(NotImplementedError, match=r"train_step\(loss_fn\) only"):
        off.value_and_grad(lambda a, b: par(a))
    off.remove()


def test_shape_store_lays_out_blocks_as_the_store_does(tmp_path):
    """The same puts (whole blocks, several blocks, small tensors packed at 64-byte alignment, a
    pack closed, an empty tensor) give the same blocks, numbered in allocation order, in the C++
    store and in the shape store."""
    from mindspore_hyper.offload.shape_store import ShapeStore

    bs = 1024
    real = OffloadStore(block_size=bs, device_memory=4 * bs, host_memory=64 * bs, offload_dir=str(tmp_path))
    shape_only = ShapeStore(block_size=bs, device_memory=4 * bs)
    sizes = [(256,), (100,), (3,), (70,), "close", (600,), (0,), (1,), (10, 30), (17,)]  # float32 elements
    try:
        got = {"real": [], "shape": []}
        for size in sizes:
            if size == "close":
                real.close_pack()
                shape_only.close_pack()
                continue
            got["real"].append(real.put(np.zeros(size, np.float32)).blocks)
            got["shape"].append(shape_only.put(size, np.float32).blocks)
        first = min(b for blocks in got["real"] for b in blocks)
        assert [tuple(b - first for b in blocks) for blocks in got["real"]] == got["shape"]
        # 1 KiB: a block of its own; 400, 12 and 280 B packed into one; 2400 B: three blocks; 0 B: none
        assert got["shape"][:6] == [(0,), (1,), (1,), (1,), (2, 3, 4), ()]
    finally:
        real.close()


def test_shape_store_pins_and_refuses_like_the_tier():
    from mindspore_hyper.offload.shape_store import ShapeStore
    from mindspore_hyper.offload.store import CapacityError

    store = ShapeStore(block_size=BS, device_memory=2 * BS)
    store.acquire([0, 1])
    store.acquire([1])  # a second pin of a pinned block takes no slot
    with pytest.raises(CapacityError, match="would need 3 pinned blocks, the tier holds 2"):
        store.acquire([2])
    store.release([1])
    store.release([0, 1])
    store.acquire([2])
    assert store.stats()["pinned"] == {"blocks": 1, "peak_blocks": 2, "peak_bytes": 2 * BS}
    with pytest.raises(ValueError, match=r"device_memory=4\.0KiB holds no cache block of cache_block_size=8\.0KiB"):
        ShapeStore(block_size=BS, device_memory=BS // 2)
    with pytest.raises(ValueError, match="worker_nice must be in 0..19, got 20"):
        ShapeStore(block_size=BS, device_memory=BS, worker_nice=20)
