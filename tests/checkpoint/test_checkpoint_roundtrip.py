"""Save and load in one process: a plain Cell (one device) and simulated meshes of 2 and 8
devices under other strategies, with Adam states (ZeRO-1 sliced); replicas written once;
MindSpore reads every per-rank file; a region is read with no byte outside the checksummed
chunks that hold it."""

import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, nn

import mindspore_hyper as mh
from mindspore_hyper import Layout, auto_parallelize
from mindspore_hyper.checkpoint import Manifest
from mindspore_hyper.checkpoint.load import read_region
from mindspore_hyper.checkpoint.regions import rank_box
from mindspore_hyper.checkpoint.safetensors_file import RangeReader
from ckpt_models import adam, batches, global_values, gpt, megatron, step_dir

CHUNK = 512  # small checksum chunks, so that reading a region reads little beyond it


@pytest.fixture(scope="module")
def sim8(tmp_path_factory):
    """A GPT trained two Adam steps on 8 simulated devices (data 2 x tensor 4, ZeRO-1), saved
    with its optimizer: (directory, global values)."""
    directory = tmp_path_factory.mktemp("sim8")
    mh.reset_context()
    mh.set_context(device_num=8)
    ms.set_seed(1)
    model = gpt()
    par = auto_parallelize(model, megatron(2, 4, zero=True))
    optimizer = adam(par.optimizer_parameters())
    for batch in batches(0, 2):
        par.train_step(optimizer, *batch)
    mh.save_checkpoint(par, directory, optimizer=optimizer, chunk_bytes=CHUNK)
    mh.reset_context()
    return directory, global_values(model, optimizer)


def assert_values(actual, expected):
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


def test_sim8_to_single_device_with_optimizer(sim8):
    directory, saved = sim8
    single = gpt()
    optimizer = adam(single.trainable_params())
    report = mh.load_checkpoint(single, directory, optimizer=optimizer)
    assert_values(global_values(single, optimizer), saved)
    assert report.tensors == len(saved) and report.step == 0
    assert report.data_bytes == report.needed_bytes == report.read_bytes == sum(v.nbytes for v in saved.values())


def test_sim8_to_sim2_other_strategy_then_training_matches_single_device(sim8, clean_context):
    directory, saved = sim8
    mh.set_context(device_num=2)
    model = gpt()
    par = auto_parallelize(model, megatron(1, 2, zero=False))
    optimizer = adam(par.optimizer_parameters())
    mh.load_checkpoint(par, directory, optimizer=optimizer)
    assert_values(global_values(model, optimizer), saved)
    ref = gpt()
    ref_opt = adam(ref.trainable_params())
    mh.load_checkpoint(ref, directory, optimizer=ref_opt)
    step = ms.value_and_grad(ref, None, ref_opt.parameters)
    ids, labels = batches(2, 1)[0]
    loss, grads = step(ids, labels)
    ref_opt(grads)
    np.testing.assert_allclose(par.train_step(optimizer, ids, labels).asnumpy(), loss.asnumpy(), rtol=1e-5)


def test_single_device_to_sim8(tmp_path, clean_context):
    ms.set_seed(3)
    single = gpt()
    manifest = mh.save_checkpoint(single, tmp_path / "single")
    assert manifest.mode == "single" and manifest.mesh.device_matrix == (1,)
    assert list(manifest.files) == ["rank_0/checkpoint_rank0.safetensors"] and manifest.optimizer is None
    assert manifest.step == 0 and (tmp_path / "single" / "step_000000" / "commit.json").is_file()
    mh.set_context(device_num=8)
    ms.set_seed(4)
    model = gpt()
    par = auto_parallelize(model, megatron(2, 4, zero=True))
    mh.load_checkpoint(par, tmp_path / "single")
    assert_values(global_values(model), global_values(single))


def test_replicated_regions_are_written_once_by_the_lowest_rank(tmp_path, clean_context):
    mh.set_context(device_num=8)
    model = gpt()
    par = auto_parallelize(model, megatron(2, 4, zero=False))
    manifest = mh.save_checkpoint(par, tmp_path)
    # data replicas (rank r and r + 4) write nothing: only ranks 0-3 have files
    assert sorted(f.rank for f in manifest.files.values()) == [0, 1, 2, 3]
    qkv = manifest.parameters["blocks.0.attn.qkv.weight"]
    assert qkv.tensor_map == ("tensor", None) and qkv.ms_tensor_map == (0, -1)
    assert [(s.writer, s.replicas) for s in qkv.shards] == [(r, (r, r + 4)) for r in range(4)]
    norm = manifest.parameters["ln_f.gamma"]
    assert [(s.writer, s.replicas, s.file) for s in norm.shards] == [
        (0, tuple(range(8)), "rank_0/checkpoint_rank0.safetensors")]
    # the files hold every element exactly once, and MindSpore loads each of them
    stored = 0
    for path in manifest.files:
        for name, value in ms.load_checkpoint(str(step_dir(tmp_path) / path), format="safetensors").items():
            stored += value.asnumpy().nbytes
    assert stored == sum(p.asnumpy().nbytes for p in model.get_parameters())
    assert (step_dir(tmp_path) / "strategy.ckpt").is_file() and manifest.mindspore_strategy == "strategy.ckpt"


def test_a_region_reads_only_the_chunks_that_hold_it(sim8):
    """What a process of a data 2 x tensor 2 job needs of the tensor-parallel weight saved on
    data 2 x tensor 4: its bytes, read in whole checksummed chunks and no others."""
    directory, saved = sim8
    manifest = Manifest.read(str(directory))
    entry = manifest.parameters["blocks.0.fc1.weight"]  # (256, 64), rows split over tensor=4: 4 x 16 KB
    target = Layout((2, 2), ("data", "tensor"))
    for layout, extra in ((target("tensor", None), 0), (target(None, "tensor"), 1), (target("tensor", "data"), 1)):
        for rank in target.ranks:
            region = rank_box(layout, rank, entry.global_shape)
            with RangeReader() as reader:
                value = read_region(reader, str(step_dir(directory)), entry, region, manifest.chunk_bytes)
            np.testing.assert_array_equal(value, saved["blocks.0.fc1.weight"][region.within(
                rank_box(target(None, None), 0, entry.global_shape))])
            assert reader.data_bytes == value.nbytes == region.volume * 4 < entry.nbytes
            # rows of 256 bytes: a half-row region (columns split) reads the whole rows, i.e. the
            # 512-byte chunks holding them; a row-aligned region reads just its chunks
            assert reader.read_bytes == value.nbytes * (1 + extra), (layout, rank, reader.read_bytes)


def test_a_save_with_another_world_size_is_a_new_step(tmp_path, clean_context):
    mh.set_context(device_num=8)
    model = gpt()
    mh.save_checkpoint(auto_parallelize(model, megatron(1, 8, zero=False)), tmp_path)
    assert len(list(tmp_path.glob("step_000000/rank_*/*.safetensors"))) == 8
    mh.set_context(device_num=2)
    manifest = mh.save_checkpoint(auto_parallelize(gpt(), megatron(1, 2, zero=False)), tmp_path, keep_last=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000001"]
    assert sorted(str(p.relative_to(tmp_path / "step_000001"))
                  for p in tmp_path.glob("step_000001/rank_*/*.safetensors")) == sorted(manifest.files)
    assert Manifest.read(str(tmp_path)).mesh.device_matrix == (1, 2)


class Mixed(nn.Cell):
    """Parameters of several dtypes, one of them 0-d."""

    def __init__(self, seed):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.half = Parameter(Tensor(rng.standard_normal((3, 5)).astype(np.float16)), name="half")
        self.brain = Parameter(Tensor(rng.standard_normal((4,)).astype(np.float32), ms.bfloat16), name="brain")
        self.counts = Parameter(Tensor(rng.integers(0, 9, (2, 2)).astype(np.int64)), name="counts",
                                requires_grad=False)
        self.flag = Parameter(Tensor(np.array(True)), name="flag", requires_grad=False)
        self.scale = Parameter(Tensor(np.float64(rng.standard_normal())), name="scale")


def test_dtypes_and_0d_tensors_round_trip(tmp_path):
    source, target = Mixed(0), Mixed(1)
    mh.save_checkpoint(source, tmp_path)
    mh.load_checkpoint(target, tmp_path)
    for (name, p), q in zip(source.parameters_and_names(), target.get_parameters()):
        assert q.dtype == p.dtype and q.shape == p.shape, name
        np.testing.assert_array_equal(q.asnumpy(), p.asnumpy(), err_msg=name)
    stored = ms.load_checkpoint(str(step_dir(tmp_path) / "rank_0" / "checkpoint_rank0.safetensors"),
                                format="safetensors")
    assert stored["brain"].dtype == ms.bfloat16 and stored["counts"].dtype == ms.int64
