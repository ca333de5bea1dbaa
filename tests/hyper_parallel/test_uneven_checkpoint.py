"""Checkpoints of unevenly sharded Parameters (torch.chunk pieces, `shard.chunking`): a
fully_shard model with a 7-row weight (pieces 2, 2, 2, 1 over 4 devices) and a 3-row one (1, 1,
1, 0: the last device's piece is empty) saved with its Adam states through
`distributed_checkpoint.save` and `mh.save_checkpoint`, loaded at other layouts and world sizes
(one device, an uneven fully_shard over 3 devices, an even Rowwise split over 5). Values are
copied bytes, so every comparison is exact."""
import os

import numpy as np
import pytest
import mindspore as ms
from mindspore import Tensor, nn

import mindspore_hyper as mh
from mindspore_hyper.checkpoint import CheckpointError
from mindspore_hyper.checkpoint.mindspore_strategy import save_strategy_file
from mindspore_hyper.hyper_parallel import (
    Replicate, RowwiseParallel, init_device_mesh, laid_out_parameters, parallelize_module,
)
from mindspore_hyper.hyper_parallel.checkpoint import StateDict, load, save
from mindspore_hyper.hyper_parallel.fully_shard import fully_shard
from mindspore_hyper.hyper_parallel.session import reset_session

from test_uneven_shards import Small  # 7 and 3 output rows: neither divides by 4 devices


X = Tensor(np.random.RandomState(0).randn(4, 5).astype(np.float32))


def _trained_fully_sharded(devices):
    """A Small fully sharded over `devices` simulated devices after one Adam step (so its
    moments are not zeros), with its optimizer."""
    mh.set_context(device_num=devices)
    ms.set_seed(0)
    model = Small()
    fully_shard(model, mesh=init_device_mesh("npu", (devices,), mesh_dim_names=("dp",)))
    optimizer = nn.Adam(model.trainable_params(), learning_rate=1e-2)
    grad_fn = ms.value_and_grad(lambda x: (model(x) ** 2).mean(), None, optimizer.parameters)
    optimizer(grad_fn(X)[1])
    return model, optimizer


def _state(model, optimizer):
    return {"model": model.parameters_dict(), "optim": optimizer.parameters_dict()}


def _values(model, optimizer):
    return {f"{section}.{name}": p.asnumpy().copy() for section, params in _state(model, optimizer).items()
            for name, p in params.items()}


def _assert_loaded(model, optimizer, saved):
    got = _values(model, optimizer)
    assert got.keys() == saved.keys()
    for name, value in saved.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def _fresh(devices):
    reset_session()
    mh.set_context(device_num=devices)
    model = Small()
    return model, nn.Adam(model.trainable_params(), learning_rate=1e-2)


@pytest.fixture
def saved(fresh_session, tmp_path):
    """The fully sharded model's values and output, and its checkpoint (4 devices)."""
    model, optimizer = _trained_fully_sharded(4)
    manifest = save(_state(model, optimizer), checkpoint_id=tmp_path / "ckpt")
    return _values(model, optimizer), model(X).asnumpy(), manifest, tmp_path / "ckpt"


def test_the_manifest_stores_uneven_pieces_and_no_empty_ones(saved):
    _, _, manifest, path = saved
    boxes = {name: [(s.box.start[0], s.box.stop[0]) for s in e.shards] for name, e in manifest.parameters.items()
             if e.global_shape}
    assert boxes["model.up.weight"] == [(0, 2), (2, 4), (4, 6), (6, 7)]  # torch.chunk: 2, 2, 2, 1
    assert boxes["model.down.weight"] == [(0, 1), (1, 2), (2, 3)]  # 1, 1, 1, 0: rank 3's empty piece is not stored
    assert boxes["optim.moment1.down.bias"] == [(0, 1), (1, 2), (2, 3)]  # the states follow their parameter
    assert [s.writer for s in manifest.parameters["model.down.weight"].shards] == [0, 1, 2]
    # MindSpore's strategy format splits every shard of a dimension to one size: not written
    assert manifest.mindspore_strategy is None
    assert not os.path.exists(path / "step_000000" / "strategy.ckpt")


def test_loads_into_one_device_and_into_fully_shard_over_three_devices(saved):
    values, output, _, path = saved
    model, optimizer = _fresh(1)
    load(_state(model, optimizer), checkpoint_id=path)
    _assert_loaded(model, optimizer, values)
    model, optimizer = _fresh(3)  # 7 rows over 3: 3, 3, 1 (uneven); 3 rows: 1, 1, 1
    fully_shard(model, mesh=init_device_mesh("npu", (3,), mesh_dim_names=("dp",)))
    load(_state(model, optimizer), checkpoint_id=path)
    _assert_loaded(model, optimizer, values)
    # the pieces the layout cuts from the loaded values compute what the saved model computed
    # (the same float32 ops on the same values: equal)
    np.testing.assert_array_equal(model(X).asnumpy(), output)


def test_round_trip_through_an_even_layout_on_five_devices(saved, tmp_path):
    values, output, _, path = saved
    model, optimizer = _fresh(5)  # up.weight's 5 columns split over 5 devices: even
    parallelize_module(model, init_device_mesh("npu", (5,), mesh_dim_names=("tp",)),
                       {"up": RowwiseParallel(input_layouts=Replicate())})
    assert laid_out_parameters(model)["up.weight"].to_local().local_shard(4).shape == (7, 1)
    load(_state(model, optimizer), checkpoint_id=path)
    _assert_loaded(model, optimizer, values)
    # Rowwise sums up's 5 per-device products in another order than one device's matmul: float32
    # reordering of a 5-term sum moves it by at most 5 eps x the sum of its terms' magnitudes;
    # tanh's slope is <= 1 and down adds each error times |its weight|
    x, w_up, w_down = X.asnumpy(), values["model.up.weight"], values["model.down.weight"]
    eps = np.finfo(np.float32).eps
    bound = 5 * eps * (np.abs(x) @ np.abs(w_up).T + np.abs(values["model.up.bias"])) @ np.abs(w_down).T
    np.testing.assert_allclose(model(X).asnumpy(), output, rtol=0, atol=float(bound.max()) + 8 * eps)
    manifest = save(_state(model, optimizer), checkpoint_id=tmp_path / "even")  # and back: even -> uneven
    assert manifest.mindspore_strategy == "strategy.ckpt"
    model, optimizer = _fresh(4)
    fully_shard(model, mesh=init_device_mesh("npu", (4,), mesh_dim_names=("dp",)))
    load(_state(model, optimizer), checkpoint_id=tmp_path / "even")
    _assert_loaded(model, optimizer, values)


def test_mh_save_checkpoint_of_the_fully_sharded_cell(saved, tmp_path):
    """`mh.save_checkpoint` / `load_checkpoint` of the Cell itself: its Parameters are stored by
    the API's layouts (each rank its pieces, as under msrun), its Adam states by theirs."""
    values, output, _, _ = saved
    reset_session()
    model, optimizer = _trained_fully_sharded(4)
    manifest = mh.save_checkpoint(model, tmp_path / "cell", optimizer=optimizer)
    assert manifest.mode == "simulation" and manifest.mesh.device_matrix == (4,)
    assert [s.box.stop[0] for s in manifest.parameters["down.weight"].shards] == [1, 2, 3]
    assert [s.box.stop[0] for s in manifest.optimizer["moment2.up.weight"].shards] == [2, 4, 6, 7]
    plain, plain_optimizer = _fresh(1)
    mh.load_checkpoint(plain, tmp_path / "cell", optimizer=plain_optimizer)
    _assert_loaded(plain, plain_optimizer, values)
    model, optimizer = _fresh(4)
    fully_shard(model, mesh=init_device_mesh("npu", (4,), mesh_dim_names=("dp",)))
    mh.load_checkpoint(model, tmp_path / "cell", optimizer=optimizer)
    _assert_loaded(model, optimizer, values)
    np.testing.assert_array_equal(model(X).asnumpy(), output)


def test_mindspore_strategy_file_of_uneven_layouts_is_refused(fresh_session, tmp_path):
    model, optimizer = _trained_fully_sharded(4)
    with pytest.raises(CheckpointError, match=r"model\.up\.weight.*uneven pieces.*only even splits"):
        save_strategy_file(StateDict({"model": model.parameters_dict()}), str(tmp_path / "s.ckpt"))
