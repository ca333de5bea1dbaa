"""Offloaded training equals resident training (5 steps, SGD and Adam, PyNative CPU), the device
tier's tracked peak stays within its budget, activations swap through the store, and a model
whose sub-Cell cannot fit is refused before running."""
import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn, ops

from mindspore.graph.api import _pynative_executor

from mindspore_hyper import _core, set_context, reset_context
from test_prefetch_scheduler import os_threads
from mindspore_hyper.offload.updates import UnitUpdates
from mindspore_hyper.offload import (OffloadedModel, OffloadPolicy, OffloadStore, WorkingSetError,
                                     hyper_offload, maybe_offload)

from sim_models import DenseStack

pytestmark = pytest.mark.usefixtures("pynative")

BS = 8192
DIM = 32


def copy_params(src, dst):
    """`dst` (a fresh network of `src`'s class) with `src`'s parameter values."""
    for p_dst, p_src in zip(dst.get_parameters(), src.get_parameters()):
        p_dst.set_data(Tensor(p_src.asnumpy().copy()))
    return dst


def copy_model(src, n_layers=4, dim=DIM):
    return copy_params(src, DenseStack(n_layers, dim))


def data(dim=DIM):
    rng = np.random.default_rng(0)
    return (Tensor(rng.standard_normal((16, dim)).astype(np.float32)),
            Tensor(rng.standard_normal((16, 1)).astype(np.float32)))


OPTIMIZERS = {
    "sgd": lambda ps: nn.SGD(ps, learning_rate=0.05, momentum=0.9),
    "adam": lambda ps: nn.Adam(ps, learning_rate=0.01),
    # no host rule (weight decay): updated after the backward by the optimizer Cell itself
    "adamw": lambda ps: nn.AdamWeightDecay(ps, learning_rate=0.002, weight_decay=0.01),
}
HOST_RULE = {"sgd": True, "adam": True, "adamw": False}


def assert_update_path(off, opt_name, updates):
    """`updates` group updates ran, on the host during the backward where the optimizer has a
    host rule, else by the optimizer Cell after it."""
    expected = {"host": updates, "optimizer": 0} if HOST_RULE[opt_name] else {"host": 0, "optimizer": updates}
    assert off.stats()["group_updates"] == expected


def reference_run(model, make_opt, x, y, steps=5):
    opt = make_opt(model.trainable_params())
    loss_fn = lambda a, b: ops.reduce_mean((model(a) - b) ** 2)
    grad_fn = ms.value_and_grad(loss_fn, None, model.trainable_params())
    losses = []
    for _ in range(steps):
        loss, grads = grad_fn(x, y)
        opt(grads)
        losses.append(float(loss.asnumpy()))
    return losses, {p.name: p.asnumpy() for p in model.trainable_params()}


def assert_matches_reference(off, losses, ref_losses, ref_params):
    """Losses and every parameter's final value equal resident training's."""
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6, atol=1e-7)
    values = off.parameter_values()
    for name, ref in ref_params.items():
        np.testing.assert_allclose(values[name], ref, rtol=1e-6, atol=1e-7, err_msg=name)


def make_store(tmp_path, device_blocks=4, host_blocks=6, depth=2):
    return OffloadStore(block_size=BS, device_memory=device_blocks * BS, host_memory=host_blocks * BS,
                        offload_dir=str(tmp_path), prefetch_depth=depth)


@pytest.mark.parametrize("opt_name", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("swap_activations", [False, True])
def test_offloaded_training_matches_resident(tmp_path, opt_name, swap_activations):
    make_opt = OPTIMIZERS[opt_name]
    x, y = data()
    base = DenseStack()
    ref_losses, ref_params = reference_run(copy_model(base), make_opt, x, y)

    model = copy_model(base)
    store = make_store(tmp_path)
    pending = (_core.fence_pending(), _core.mailbox_pending())
    policy = OffloadPolicy(cells=["layers.*"], activation_cells=["layers.1", "layers.2"] if swap_activations else ())
    off = hyper_offload(model, policy, optimizer=make_opt, store=store)
    assert [g.name for g in off.units] == ["layers.0", "layers.1", "layers.2", "layers.3"]
    # Between uses the offloaded Parameters hold one-element placeholders: values live in the store.
    assert model.layers[0].weight.shape == (1,)
    step = off.train_step(lambda a, b: ops.reduce_mean((model(a) - b) ** 2))
    losses = [float(step(x, y).asnumpy()) for _ in range(5)]

    assert_matches_reference(off, losses, ref_losses, ref_params)
    assert_update_path(off, opt_name, 5 * 4)
    _pynative_executor.sync()
    assert (_core.fence_pending(), _core.mailbox_pending()) == pending  # every fence and copy consumed

    stats = off.stats()
    budget = store.device_memory
    assert 0 < stats["device"]["peak_bytes"] <= budget
    assert stats["device"]["peak_blocks"] <= stats["device"]["capacity_blocks"]
    assert 0 < stats["peak_materialized_param_bytes"] <= budget
    # The offloaded state is larger than the device tier, so it really moves through the tiers.
    total_blocks = len({b for g in off.units for b in g.devices[0].update_blocks})
    assert total_blocks > stats["device"]["capacity_blocks"]
    assert stats["bytes_moved"]["host->device"] > 0 and stats["bytes_moved"]["host->disk"] > 0
    pf = stats["prefetch"]
    assert pf["trace_valid"] and pf["hits"] + pf["late"] > 0
    if swap_activations:
        assert len(off.activations.refs) > 0
    off.remove()
    for name, ref in ref_params.items():
        np.testing.assert_allclose({p.name: p.asnumpy() for p in model.trainable_params()}[name], ref,
                                   rtol=1e-6, atol=1e-7)
    store.close()


def test_refuses_cell_larger_than_device_tier(tmp_path):
    model = DenseStack(n_layers=2, dim=64)  # a 64x64 float32 weight is 16KB: 2+ blocks of 8KB
    before = {p.name: p.asnumpy().copy() for p in model.trainable_params()}
    store = make_store(tmp_path, device_blocks=2)
    with pytest.raises(WorkingSetError, match=r"Cell 'layers.0' cannot run offloaded: its working set is \d+ "
                                              r"blocks of 8.0KiB .* but the device tier holds 2 blocks"):
        hyper_offload(model, OffloadPolicy(cells=["layers.*"]), optimizer=OPTIMIZERS["sgd"], store=store)
    for p in model.trainable_params():  # refused before running: model untouched
        np.testing.assert_array_equal(p.asnumpy(), before[p.name])
    store.close()


def test_device_tier_below_one_block_names_both_flags(tmp_path):
    """Issue 42: the C++ store's StoreError came out as a bare traceback."""
    with pytest.raises(ValueError, match=r"device_memory=512\.0KiB holds no cache block of "
                                         r"cache_block_size=1\.0MiB: raise device_memory .* or lower cache_block_size"):
        OffloadStore(block_size=1 << 20, device_memory=512 << 10, host_memory=4 << 20, offload_dir=str(tmp_path))


def test_enabled_through_context(tmp_path):
    model = DenseStack(n_layers=2)
    reset_context()
    assert maybe_offload(model, optimizer=OPTIMIZERS["sgd"]) is None
    set_context(hyper_offload=True, device_memory=4 * BS, host_memory=8 * BS, offload_dir=str(tmp_path),
                prefetch_depth=2, offload_worker_nice=5)
    try:
        before = set(os_threads())
        off = maybe_offload(model, OffloadPolicy(cells=["layers.*"]), optimizer=OPTIMIZERS["sgd"], block_size=BS)
        assert off is not None and off.store.device_memory == 4 * BS and off.store.prefetch_depth == 2
        x, y = data()
        loss = off.train_step(lambda a, b: ops.reduce_mean((model(a) - b) ** 2))(x, y)
        assert np.isfinite(float(loss.asnumpy()))
        assert_update_path(off, "sgd", 2)
        assert off.stats()["update_wait_ns"] > 0  # the step waited for its last host updates
        # the I/O workers and the host-update threads (and writers, where used) run at the flag's nice
        new = [(name, nice) for tid, (name, nice) in os_threads().items()
               if tid not in before and name.startswith("mshyper")]
        assert {"mshyper-io", "mshyper-update"} <= {name for name, _ in new}
        assert {nice for _, nice in new} == {5}, new
        assert _core.current_thread_nice() == 0  # the training thread keeps its priority
        off.store.close()
    finally:
        reset_context()


def test_synchronous_writes_give_the_same_result(tmp_path):
    x, y = data()
    base = DenseStack(n_layers=3)
    ref_losses, ref_params = reference_run(copy_model(base, 3), OPTIMIZERS["adam"], x, y, steps=3)
    model = copy_model(base, 3)
    store = make_store(tmp_path)
    off = hyper_offload(model, OffloadPolicy(cells=["layers.*"]), optimizer=OPTIMIZERS["adam"], store=store,
                        async_writes=False)
    step = off.train_step(lambda a, b: ops.reduce_mean((model(a) - b) ** 2))
    losses = [float(step(x, y).asnumpy()) for _ in range(3)]
    assert_matches_reference(off, losses, ref_losses, ref_params)
    store.close()


def test_value_and_grad_then_apply_gradients(tmp_path):
    """The two-call API: gradients returned to the caller, then applied by the optimizer Cells
    after the backward (no host updates)."""
    x, y = data()
    base = DenseStack(n_layers=3)
    ref_losses, ref_params = reference_run(copy_model(base, 3), OPTIMIZERS["adam"], x, y, steps=3)
    model = copy_model(base, 3)
    store = make_store(tmp_path)
    off = hyper_offload(model, OffloadPolicy(cells=["layers.*"]), optimizer=OPTIMIZERS["adam"], store=store)
    grad_fn = off.value_and_grad(lambda a, b: ops.reduce_mean((model(a) - b) ** 2))
    losses = []
    for _ in range(3):
        loss, grads = grad_fn(x, y)
        assert [tuple(g.shape) for g in grads] == [tuple(p.shape) for p in
                                                   copy_model(base, 3).trainable_params()][:6] + [(1, DIM), (1,)]
        off.apply_gradients(grads)
        losses.append(float(loss.asnumpy()))
    assert_matches_reference(off, losses, ref_losses, ref_params)
    assert off.stats()["group_updates"] == {"host": 0, "optimizer": 3 * 3}
    with pytest.raises(ValueError, match="expected 8 gradients, got 7"):
        off.apply_gradients(grads[:-1])
    store.close()


class Mix(nn.Cell):
    """Two inputs, a Dense and a bare Parameter."""

    def __init__(self, dim=DIM):
        super().__init__()
        self.a = nn.Dense(dim, dim)
        self.b = ms.Parameter(Tensor(np.linspace(-1, 1, dim).astype(np.float32)), name="b")

    def construct(self, u, v):
        return self.a(u) * v + self.b


class SharedNet(nn.Cell):
    """An offloaded Cell called twice per step and one with two inputs (one of them reused)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.CellList([nn.Dense(DIM, DIM) for _ in range(3)])
        self.mix = Mix()
        self.head = nn.Dense(DIM, 1)

    def construct(self, x):
        h0 = ops.tanh(self.layers[0](x))
        h1 = ops.tanh(self.layers[1](h0))
        h2 = ops.tanh(self.layers[1](h1))  # layers.1 again
        h3 = self.mix(h2, h0)
        return self.head(ops.tanh(self.layers[2](h3)))


def test_shared_and_multi_input_cells_match_resident(tmp_path):
    x, y = data()
    base = SharedNet()

    def copy():
        return copy_params(base, SharedNet())

    ref_losses, ref_params = reference_run(copy(), OPTIMIZERS["adam"], x, y, steps=4)
    model = copy()
    store = make_store(tmp_path, device_blocks=4, host_blocks=6)
    off = hyper_offload(model, OffloadPolicy(cells=["layers.*", "mix"]), optimizer=OPTIMIZERS["adam"], store=store)
    step = off.train_step(lambda a, b: ops.reduce_mean((model(a) - b) ** 2))
    losses = [float(step(x, y).asnumpy()) for _ in range(4)]
    assert_matches_reference(off, losses, ref_losses, ref_params)
    # every group updated in the backward: the hooks of layers.1 (called twice) ran once per step
    assert_update_path(off, "adam", 4 * 4)
    assert all(g.resident_depth == 0 for g in off.units)
    assert model.mix.b.shape == (1,)  # scrubbed between steps
    stats = off.stats()
    assert 0 < stats["device"]["peak_bytes"] <= store.device_memory
    assert stats["prefetch"]["trace_invalidations"] == 0
    store.close()


class Skip(nn.Cell):
    """A Dense whose bias is used only on some steps (set `use_bias`)."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(DIM, DIM)
        self.use_bias = True

    def construct(self, x):
        y = ops.matmul(x, self.dense.weight.T)
        return y + self.dense.bias if self.use_bias else y


class SkipNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.layers = nn.CellList([nn.Dense(DIM, DIM), Skip(), nn.Dense(DIM, 1)])

    def construct(self, x):
        x = ops.tanh(self.layers[0](x))
        return self.layers[2](ops.tanh(self.layers[1](x)))


@pytest.mark.parametrize("hook_missing", [False, True])
def test_parameter_unused_in_some_steps(tmp_path, monkeypatch, hook_missing):
    """A parameter unused in a step gets a zero gradient through its hook (MindSpore runs it), so
    its group is still updated in the backward. Should a hook not run (hook_missing: simulated
    by dropping it), that group is updated after the backward from the returned gradients, and
    the copy of the other parameter's gradient already launched is dropped, not leaked."""
    x, y = data()
    base = SkipNet()

    def copy():
        return copy_params(base, SkipNet())

    uses = [True, False, True, False]
    ref = copy()
    opt = OPTIMIZERS["sgd"](ref.trainable_params())
    grad_fn = ms.value_and_grad(lambda a, b: ops.reduce_mean((ref(a) - b) ** 2), None, ref.trainable_params())
    ref_losses = []
    for use in uses:
        ref.layers[1].use_bias = use
        loss, grads = grad_fn(x, y)
        opt(grads)
        ref_losses.append(float(loss.asnumpy()))
    ref_params = {p.name: p.asnumpy() for p in ref.trainable_params()}

    model = copy()
    store = make_store(tmp_path)
    pending = (_core.fence_pending(), _core.mailbox_pending())
    off = hyper_offload(model, OffloadPolicy(cells=["layers.*"]), optimizer=OPTIMIZERS["sgd"], store=store)
    if hook_missing:
        deliver = UnitUpdates.on_param_grad

        def drop_unused_bias_hook(self, g, i, grad):
            if not (g.name == "layers.1" and i == 1 and not model.layers[1].use_bias):
                deliver(self, g, i, grad)
        monkeypatch.setattr(UnitUpdates, "on_param_grad", drop_unused_bias_hook)
    step = off.train_step(lambda a, b: ops.reduce_mean((model(a) - b) ** 2))
    losses = []
    for use in uses:
        model.layers[1].use_bias = use
        losses.append(float(step(x, y).asnumpy()))
    assert_matches_reference(off, losses, ref_losses, ref_params)
    skipped = uses.count(False) if hook_missing else 0
    assert off.stats()["group_updates"] == {"host": 3 * 4 - skipped, "optimizer": skipped}
    _pynative_executor.sync()
    assert (_core.fence_pending(), _core.mailbox_pending()) == pending
    store.close()


class FailingBackward(nn.Cell):
    """Identity whose backward raises (a failure late in the backward, after the layers')."""

    def construct(self, x):
        return x * 1.0

    def bprop(self, x, out, dout):
        raise ValueError("injected backward failure")


class FailingNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.pre = nn.Dense(DIM, DIM)
        self.fail = FailingBackward()
        self.layers = nn.CellList([nn.Dense(DIM, DIM) for _ in range(3)])

    def construct(self, x):
        x = self.fail(self.pre(x))
        for layer in self.layers:
            x = ops.tanh(layer(x))
        return x.sum(axis=1, keepdims=True)


def test_backward_failure_after_host_updates_says_which_groups_were_updated(tmp_path):
    x, y = data()
    model = FailingNet()
    store = make_store(tmp_path)
    off = hyper_offload(model, OffloadPolicy(cells=["layers.*"]), optimizer=OPTIMIZERS["adam"], store=store)
    step = off.train_step(lambda a, b: ops.reduce_mean((model(a) - b) ** 2))
    with pytest.raises(RuntimeError, match=r"the backward failed after 3 of 3 offloaded groups were updated during "
                                           r"it \(layers.0, layers.1, layers.2\)") as info:
        step(x, y)
    assert "injected backward failure" in repr(info.value.__cause__)
    assert all(g.resident_depth == 0 for g in off.units)
    store.close()
