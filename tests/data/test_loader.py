"""The sharded, resumable data loader (mindspore_hyper.data): packing against numpy, the seeded
order, each rank's rows against the model's own split, a 4 -> 2 data-parallel resume through the
package's checkpoint counting every sample, mindspore.dataset sources, and the errors."""
from types import SimpleNamespace

import numpy as np
import pytest

from mindspore_hyper import Layout
from mindspore_hyper.data import DataShard, ShardedLoader, TokenFile

SAMPLES = 22  # not a multiple of the batches below: steps cross epoch boundaries


def token_file(tmp_path, n=1000, vocab=5000, seed=0):
    tokens = np.random.RandomState(seed).randint(0, vocab, n).astype(np.uint16)
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    return path, tokens


def id_columns(n=SAMPLES):
    """(x, y): row i of x starts with its id i."""
    x = np.zeros((n, 4), np.float32)
    x[:, 0] = np.arange(n)
    return x, np.arange(n, dtype=np.float32).reshape(n, 1) * 0.01


def test_token_file_packs_seq_len_plus_one_windows(tmp_path):
    path, tokens = token_file(tmp_path)
    data = TokenFile(path, seq_len=16)
    assert len(data) == (len(tokens) - 1) // 16 == 62
    for i in (0, 1, 30, 61):
        inputs, labels = data[i]
        np.testing.assert_array_equal(inputs, tokens[i * 16:i * 16 + 16])
        np.testing.assert_array_equal(labels, tokens[i * 16 + 1:i * 16 + 17])
        assert inputs.dtype == np.int32
    loader = ShardedLoader(data, 8, shuffle=False, output="numpy")
    assert loader.tokens_per_batch == 8 * 16
    for step in range(9):  # 72 samples: through the end of epoch 0 (62) into epoch 1
        inputs, labels = next(loader)
        positions = np.arange(step * 8, step * 8 + 8) % 62
        want = np.stack([tokens[p * 16:p * 16 + 17] for p in positions]).astype(np.int32)
        np.testing.assert_array_equal(inputs, want[:, :-1])
        np.testing.assert_array_equal(labels, want[:, 1:])


def test_order_is_seeded_and_each_epoch_a_permutation():
    def run(seed, steps):
        loader = ShardedLoader(id_columns(), 4, seed=seed, output="numpy")
        return np.concatenate([next(loader)[0][:, 0] for _ in range(steps)]).astype(int)

    first = run(7, 11)  # 44 samples = 2 epochs of 22
    np.testing.assert_array_equal(first, run(7, 11))
    assert not np.array_equal(first, run(8, 11))
    for epoch in (first[:SAMPLES], first[SAMPLES:]):
        assert sorted(epoch) == list(range(SAMPLES))
    assert not np.array_equal(first[:SAMPLES], first[SAMPLES:])  # reshuffled per epoch


def test_num_epochs_stops_before_a_batch_past_the_end():
    loader = ShardedLoader(id_columns(), 4, num_epochs=1, output="numpy")
    assert len(list(loader)) == SAMPLES // 4


def test_rank_rows_are_the_models_split_and_tile_the_global_batch():
    mesh = Layout((2, 2), ("data", "tensor"))
    strategy = mesh(tensor_map=())
    global_loader = ShardedLoader(id_columns(), 8, seed=3, output="numpy")
    parts = []
    for rank in mesh.ranks:
        model = SimpleNamespace(strategy=strategy, mesh=mesh, local_ranks=(rank,))  # one msrun process
        shard = DataShard.of_model(model)
        assert (shard.size, shard.index) == (2, mesh.coords(rank)[0])
        layout, _ = strategy.input_layout((8, 4))
        assert shard.rows(8, "rank") == layout.rank_slices(rank, (8, 4))[0]  # the rows the model cuts
        loader = ShardedLoader(id_columns(), 8, model=model, part="rank", seed=3, output="numpy")
        parts.append(next(loader)[0])
        assert parts[-1].shape == (4, 4)
    whole = next(global_loader)[0]
    np.testing.assert_array_equal(np.concatenate([parts[0], parts[2]]), whole)  # data coordinates 0, 1
    np.testing.assert_array_equal(parts[0], parts[1])  # tensor replicas read the same rows
    simulated = SimpleNamespace(strategy=strategy, mesh=mesh, local_ranks=mesh.ranks)
    assert DataShard.of_model(simulated).index is None  # one process holds every rank: the global batch


def _parallel(devices):
    import mindspore as ms
    from mindspore import nn

    import mindspore_hyper as mh

    mh.reset_context()
    mh.set_context(mode="simulation", device_num=devices)
    ms.set_seed(0)
    net = nn.WithLossCell(nn.Dense(4, 1), nn.MSELoss())
    par = mh.auto_parallelize(net, Layout((devices,), ("data",))(tensor_map=()))
    return par, nn.SGD(par.optimizer_parameters(), learning_rate=0.01)


def test_resume_at_another_data_parallel_size_repeats_and_skips_nothing(tmp_path, pynative):
    import mindspore_hyper as mh
    from mindspore_hyper.checkpoint import CheckpointError

    seen = []
    par, opt = _parallel(4)
    loader = ShardedLoader(id_columns(), 8, model=par, seed=5)
    assert loader.shard.size == 4 and loader.rows == slice(0, 8)  # simulation: the global batch
    for _ in range(3):
        x, y = next(loader)
        seen.append(x.asnumpy()[:, 0])
        par.train_step(opt, x, y)
    mh.save_checkpoint(par, tmp_path / "ckpt", opt, extra_state={"data": loader})
    next(loader)  # consumed after the save: not part of the saved position

    par2, opt2 = _parallel(2)
    resumed = ShardedLoader(id_columns(), 8, model=par2, seed=5)
    report = mh.load_checkpoint(par2, tmp_path / "ckpt", opt2, extra_state={"data": resumed})
    assert report.extra_state["data"]["consumed"] == 24 and report.extra_state["data"]["dp_size"] == 4
    assert resumed.consumed == 24 and resumed.shard.size == 2
    for _ in range(8):  # 3 + 8 steps of 8 = 88 samples = 4 epochs of 22
        x, y = next(resumed)
        seen.append(x.asnumpy()[:, 0])
        par2.train_step(opt2, x, y)
    ids = np.concatenate(seen).astype(int)
    counts = np.bincount(ids, minlength=SAMPLES)
    assert counts.tolist() == [4] * SAMPLES
    straight = ShardedLoader(id_columns(), 8, seed=5, output="numpy")  # the same order uninterrupted, one rank
    np.testing.assert_array_equal(ids, np.concatenate([next(straight)[0][:, 0] for _ in range(11)]).astype(int))

    other = ShardedLoader(id_columns(SAMPLES + 1), 8, model=par2, seed=5)
    with pytest.raises(CheckpointError, match=r"extra_state\['data'\]: state.dataset"):
        mh.load_checkpoint(par2, tmp_path / "ckpt", opt2, extra_state={"data": other})
    assert other.consumed == 0
    with pytest.raises(CheckpointError, match=r"extra_state: \['position'\] not saved .* holds \['data'\]"):
        mh.load_checkpoint(par2, tmp_path / "ckpt", opt2, extra_state={"position": other})
    with pytest.raises(CheckpointError, match=r"extra_state\['bad'\]: not JSON data"):
        mh.save_checkpoint(par2, tmp_path / "ckpt", opt2, extra_state={"bad": object()})


def test_mindspore_dataset_sources_resume_exactly():
    import mindspore.dataset as ds

    x, y = id_columns()
    rows = [(x[i], y[i]) for i in range(SAMPLES)]
    random_access = ShardedLoader(ds.GeneratorDataset(rows, ["x", "y"], shuffle=False), 4, seed=1, output="numpy")
    assert random_access.source.random_access and random_access.shuffle
    reference = ShardedLoader((x, y), 4, seed=1, output="numpy")
    np.testing.assert_array_equal(next(random_access)[0], next(reference)[0])

    def pipeline():
        return ds.GeneratorDataset(rows, ["x", "y"], shuffle=False).map(lambda v: v * 2, input_columns=["y"])

    stream = ShardedLoader(pipeline(), 8, output="numpy")
    assert not stream.source.random_access and not stream.shuffle
    batches = [next(stream) for _ in range(2)]
    np.testing.assert_array_equal(batches[0][0][:, 0], np.arange(8))
    np.testing.assert_allclose(batches[0][1], y[:8] * 2)
    state = stream.state_dict()
    expected = [next(stream)[0][:, 0] for _ in range(2)]  # positions 16..31: across the epoch end
    resumed = ShardedLoader(pipeline(), 8, dp_size=2, dp_rank=1, part="rank", output="numpy")
    resumed.load_state_dict(state)
    got = [next(resumed)[0][:, 0] for _ in range(2)]
    np.testing.assert_array_equal(got, [e[4:] for e in expected])  # rank 1's half of each global batch
    np.testing.assert_array_equal(np.concatenate(expected), np.arange(16, 32) % SAMPLES)


def test_errors_name_the_field(tmp_path):
    import mindspore.dataset as ds

    path, tokens = token_file(tmp_path, n=100)
    with pytest.raises(ValueError, match=r"seq_len=100: a sample needs seq_len \+ 1 = 101 tokens .* holds only 100"):
        TokenFile(path, seq_len=100)
    with pytest.raises(ValueError, match=r"global_batch=6: not divisible by the data-parallel size 4"):
        ShardedLoader(TokenFile(path, 8), 6, dp_size=4)
    mesh = Layout((4, 2), ("data", "tensor"))
    model = SimpleNamespace(strategy=mesh(tensor_map=()), mesh=mesh, local_ranks=(0,))
    with pytest.raises(ValueError, match=r"global_batch=6: .* size 4 \(mesh axis 'data'\)"):
        ShardedLoader(TokenFile(path, 8), 6, model=model)
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"123")
    with pytest.raises(ValueError, match=r"3 bytes is not a positive whole number of uint16"):
        TokenFile(odd, 1)

    state = ShardedLoader(TokenFile(path, 8), 4).state_dict()
    with pytest.raises(ValueError, match=r"state.dataset: .*'seq_len': 8.*'seq_len': 9"):
        ShardedLoader(TokenFile(path, 9), 4).load_state_dict(state)
    (tmp_path / "other").mkdir()
    other_path, _ = token_file(tmp_path / "other", n=100, seed=1)
    with pytest.raises(ValueError, match=r"state.dataset: .*crc32"):
        ShardedLoader(TokenFile(other_path, 8), 4).load_state_dict(state)
    with pytest.raises(ValueError, match=r"state.seed: .*seed=0, this loader has seed=2"):
        ShardedLoader(TokenFile(path, 8), 4, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"state.consumed: expected an int >= 0, got -1"):
        ShardedLoader(TokenFile(path, 8), 4).load_state_dict({**state, "consumed": -1})
    with pytest.raises(ValueError, match=r"state.format"):
        ShardedLoader(TokenFile(path, 8), 4).load_state_dict({"consumed": 3})

    pipeline = ds.GeneratorDataset([(np.zeros(2),)] * 4, ["x"], shuffle=False).map(lambda v: v, input_columns=["x"])
    with pytest.raises(ValueError, match=r"shuffle=True: a streamed mindspore.dataset pipeline"):
        ShardedLoader(pipeline, 2, shuffle=True)
    with pytest.raises(ValueError, match=r"source: the mindspore.dataset pipeline is batched"):
        ShardedLoader(pipeline.batch(2), 2)
    with pytest.raises(TypeError, match=r"source: expected a TokenFile"):
        ShardedLoader(42, 2)
    with pytest.raises(ValueError, match=r"part='local': expected one of"):
        ShardedLoader(TokenFile(path, 8), 4, part="local")
