"""Every refusal names what is wrong, and a refused load changes no Parameter: no committed step,
missing files, a model that does not fit (all missing/extra names and shape/dtype mismatches at
once), corrupt files (a flipped data byte, a truncated file, a file of another save, bad headers)
and manifests (checksum, fields, names leading outside the directory), optimizer mismatches, bad
arguments."""
import json
import os
import shutil

import numpy as np
import pytest
import mindspore as ms
from mindspore import Parameter, Tensor, nn

import mindspore_hyper as mh
from mindspore_hyper import auto_parallelize
from mindspore_hyper import _core
from mindspore_hyper.checkpoint import CheckpointError
from ckpt_models import GPT, adam, global_values, gpt, megatron, step_dir


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A 4-device simulated GPT (data 2 x tensor 2) saved with Adam: (directory, values)."""
    directory = tmp_path_factory.mktemp("saved")
    mh.reset_context()
    mh.set_context(device_num=4)
    ms.set_seed(1)
    model = gpt()
    par = auto_parallelize(model, megatron(2, 2, zero=True))
    optimizer = adam(par.optimizer_parameters())
    mh.save_checkpoint(par, directory, optimizer=optimizer)
    mh.reset_context()
    return directory, global_values(model, optimizer)


@pytest.fixture
def copy(saved, tmp_path):
    """A private copy of the saved checkpoint's step directory, to break."""
    target = tmp_path / "copy"
    shutil.copytree(step_dir(saved[0]), target)
    return target


def rewrite_manifest(step, manifest: dict):
    """Replace the step's manifest and record its checksum in the commit record (a manifest that
    is wrong but not corrupt)."""
    data = json.dumps(manifest).encode()
    (step / "manifest.json").write_bytes(data)
    record = json.loads((step / "commit.json").read_text())
    record["files"]["manifest.json"] = {"bytes": len(data), "crc32c": int(_core.crc32c(data))}
    (step / "commit.json").write_text(json.dumps(record))


def unchanged_after(fn, model, optimizer=None):
    """Run `fn` (which must raise CheckpointError) and check no Parameter changed; the error."""
    before = global_values(model, optimizer)
    with pytest.raises(CheckpointError) as info:
        fn()
    after = global_values(model, optimizer)
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    return str(info.value)


def test_no_checkpoint_there(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        mh.load_checkpoint(gpt(), tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="holds no committed checkpoint"):
        mh.load_checkpoint(gpt(), tmp_path)


def test_missing_files_are_named(copy):
    os.remove(copy / "rank_1" / "checkpoint_rank1.safetensors")
    model = gpt()
    message = unchanged_after(lambda: mh.load_checkpoint(model, copy), model)
    assert "missing file(s) ['rank_1/checkpoint_rank1.safetensors']" in message


def test_model_mismatch_names_every_missing_and_extra_parameter_and_shape(saved):
    bigger = GPT(vocab=128, hidden=64, heads=4, layers=3, seq=16)
    message = unchanged_after(lambda: mh.load_checkpoint(bigger, saved[0]), bigger)
    missing = sorted(n for n, _ in bigger.parameters_and_names() if n.startswith("blocks.2."))
    assert f"parameters of the model missing from the checkpoint: {missing}" in message
    wider = GPT(vocab=256, hidden=64, heads=4, layers=1, seq=16)
    message = unchanged_after(lambda: mh.load_checkpoint(wider, saved[0]), wider)
    extra = sorted(n for n in saved[1] if n.startswith("blocks.1."))
    assert f"parameters in the checkpoint but not in the model: {extra}" in message
    assert "shape mismatch of 'embed.embedding_table': checkpoint (128, 64), model (256, 64)" in message
    assert "shape mismatch of 'head.weight': checkpoint (128, 64), model (256, 64)" in message


def test_dtype_mismatch_is_refused(saved):
    model = gpt()
    model.ln_f.gamma.set_dtype(ms.float16)
    message = unchanged_after(lambda: mh.load_checkpoint(model, saved[0]), model)
    assert "dtype mismatch of 'ln_f.gamma': checkpoint Float32, model Float16" in message


def test_optimizer_mismatches(saved, tmp_path):
    model = gpt()
    sgd = nn.SGD(model.trainable_params(), learning_rate=0.1, momentum=0.9)
    message = unchanged_after(lambda: mh.load_checkpoint(model, saved[0], optimizer=sgd), model, sgd)
    # another optimizer class: which optimizer each side has, not hundreds of state names
    n = len(model.trainable_params())
    assert (f"the checkpoint's optimizer is Adam (states global_step, learning_rate, beta1_power, beta2_power, "
            f"moment1 x {n}, moment2 x {n}), the optimizer given is SGD (states global_step, learning_rate, "
            f"momentum, accum x {n}, stat x {n})" in message), message
    assert "build the optimizer the checkpoint was saved with (Adam), or load without optimizer=" in message
    assert "missing from the checkpoint" not in message and "accum.blocks.0" not in message
    mh.save_checkpoint(model, tmp_path)
    optimizer = adam(model.trainable_params())
    message = unchanged_after(lambda: mh.load_checkpoint(model, tmp_path, optimizer=optimizer), model, optimizer)
    assert "the checkpoint holds no optimizer states" in message
    with pytest.raises(CheckpointError, match="optimizer: it updates Parameter 'x', which is not a parameter"):
        mh.save_checkpoint(gpt(), tmp_path, optimizer=nn.Adam([Parameter(Tensor(np.ones(2, np.float32)), "x")]))
    twin = adam(gpt().trainable_params())  # same names, other Parameters
    with pytest.raises(CheckpointError, match="'embed.embedding_table', which is not a parameter of the model"):
        mh.load_checkpoint(model, saved[0], optimizer=twin)


def test_a_flipped_data_byte_fails_its_checksum(copy):
    path = copy / "rank_1" / "checkpoint_rank1.safetensors"
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[:8], "little")
    begin, end = json.loads(data[8:8 + length])["head.weight"]["data_offsets"]
    data[8 + length + (begin + end) // 2] ^= 0x10  # one bit in the middle of the tensor's bytes
    path.write_bytes(bytes(data))
    model = gpt()
    message = unchanged_after(lambda: mh.load_checkpoint(model, copy), model)
    assert "rank_1/checkpoint_rank1.safetensors: corrupt checkpoint file: tensor 'head.weight', bytes [0, 16384): " \
           "CRC32C" in message, message


def test_a_file_of_another_save_is_named(saved, copy, tmp_path):
    """A rank file of the same shapes and sizes but from another save is refused, naming it."""
    mh.set_context(device_num=4)
    model = gpt()
    par = auto_parallelize(model, megatron(2, 2, zero=True))
    mh.save_checkpoint(par, tmp_path / "other", optimizer=adam(par.optimizer_parameters()))
    mh.reset_context()
    other = step_dir(tmp_path / "other")
    for name in ("rank_1/checkpoint_rank1.safetensors", "rank_3/checkpoint_rank3.safetensors"):
        assert (other / name).stat().st_size == (copy / name).stat().st_size
        shutil.copyfile(other / name, copy / name)
    target = gpt()
    optimizer = adam(target.trainable_params())
    message = unchanged_after(lambda: mh.load_checkpoint(target, copy, optimizer=optimizer), target, optimizer)
    other_id = json.loads((other / "commit.json").read_text())["save_id"]
    assert ("file(s) from another save than this step's" in message
            and f"rank_1/checkpoint_rank1.safetensors (save '{other_id}', step '0')" in message
            and f"rank_3/checkpoint_rank3.safetensors (save '{other_id}', step '0')" in message), message


def test_truncated_file_is_corrupt(copy):
    path = copy / "rank_0" / "checkpoint_rank0.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    model = gpt()
    message = unchanged_after(lambda: mh.load_checkpoint(model, copy), model)
    assert f"rank_0/checkpoint_rank0.safetensors has {len(data) - 100} bytes, the manifest says {len(data)}" in message


def rewrite_header(path, change):
    """Apply `change` to the parsed JSON header of a safetensors file, keeping the file's size."""
    data = bytearray(path.read_bytes())
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + length])
    change(header)
    text = json.dumps(header, separators=(",", ":"))
    assert len(text) <= length
    data[8:8 + length] = text.ljust(length).encode()
    path.write_bytes(bytes(data))


def test_a_tensor_missing_from_its_file_fails_before_any_parameter_changes(copy):
    """The last parameter's shard is gone from its file: every region read before it must not
    reach the Parameters."""
    rewrite_header(copy / "rank_1" / "checkpoint_rank1.safetensors", lambda h: h.pop("head.weight"))
    model = gpt()
    message = unchanged_after(lambda: mh.load_checkpoint(model, copy), model)
    assert ("rank_1/checkpoint_rank1.safetensors: corrupt checkpoint file: no tensor 'head.weight', which the "
            "manifest places there") in message


def test_corrupt_headers_are_named(copy):
    path = copy / "rank_1" / "checkpoint_rank1.safetensors"
    original = path.read_bytes()
    size = len(original) - 8 - int.from_bytes(original[:8], "little")
    cases = [
        (lambda h: h["head.weight"].update(data_offsets=[0, 0]),
         "tensor 'head.weight': data_offsets [0, 0] hold 0 bytes, but shape [64, 64] of F32 needs 16384"),
        (lambda h: h["head.weight"].update(data_offsets=[0, 10 * size]),
         f"tensor 'head.weight': data_offsets [0, {10 * size}] point outside the file's {size} data bytes"),
        (lambda h: h["head.weight"].update(dtype="F8"), "tensor 'head.weight': dtype 'F8' is not one of"),
        (lambda h: h["head.weight"].update(dtype="F16", data_offsets=[0, 8192], shape=[64, 64]),
         "corrupt checkpoint file: tensor 'head.weight' is F16 (64, 64), the manifest says Float32 (64, 64)"),
    ]
    model = gpt()
    for change, expected in cases:
        path.write_bytes(original)
        rewrite_header(path, change)
        message = unchanged_after(lambda: mh.load_checkpoint(model, copy), model)
        assert "rank_1/checkpoint_rank1.safetensors: corrupt" in message and expected in message, message
    data = bytearray(original)
    data[8] = ord("#")
    path.write_bytes(bytes(data))
    assert "the header is not JSON" in unchanged_after(lambda: mh.load_checkpoint(model, copy), model)
    path.write_bytes((10 ** 12).to_bytes(8, "little") + original[8:])
    assert "header length 1000000000000 does not fit" in unchanged_after(lambda: mh.load_checkpoint(model, copy),
                                                                           model)


def test_manifest_fields_are_checked(copy):
    path = copy / "manifest.json"
    good = json.loads(path.read_text())
    cases = [
        (lambda m: m.pop("mesh"), "mesh: missing"),
        (lambda m: m.update(version=99), "version: expected 2, got 99"),
        (lambda m: m["checksum"].update(chunk_bytes=0), "checksum.chunk_bytes: expected a positive int"),
        (lambda m: m["parameters"]["head.weight"]["shards"][0].update(crc32c=[]),
         "parameters['head.weight'].shards[0].crc32c: expected 1 ints (one per 1048576 bytes of 16384), got 0"),
        (lambda m: m["files"].update({"../../etc/passwd": {"rank": 0, "bytes": 1}}),
         "files['../../etc/passwd']: '../../etc/passwd' is not a relative path inside the checkpoint directory"),
        (lambda m: m["files"].update({"/etc/passwd": {"rank": 0, "bytes": 1}}),
         "files['/etc/passwd']: '/etc/passwd' is not a relative path inside the checkpoint directory"),
        (lambda m: m.update(mindspore_strategy="a/../../strategy.ckpt"),
         "mindspore_strategy: 'a/../../strategy.ckpt' is not a relative path"),
        (lambda m: m["parameters"]["ln_f.gamma"].update(dtype="Float7"), "parameters['ln_f.gamma'].dtype: 'Float7'"),
        (lambda m: m["parameters"]["head.weight"]["shards"].pop(), "parameters['head.weight'].shards: the shards "
                                                                   "cover 4096 of the 8192 elements"),
        (lambda m: m["parameters"]["head.weight"]["shards"][0].update(box=[[0, 64], [0, 65]]),
         "parameters['head.weight'].shards[0].box: Box[0:64, 0:65] is empty or outside the global shape [128, 64]"),
        (lambda m: m["parameters"]["head.weight"]["shards"][0].update(file="elsewhere"),
         "parameters['head.weight'].shards[0].file: 'elsewhere' is not listed in files"),
    ]
    model = gpt()
    for change, expected in cases:
        broken = json.loads(json.dumps(good))
        change(broken)
        rewrite_manifest(copy, broken)
        message = unchanged_after(lambda: mh.load_checkpoint(model, copy), model)
        assert f"manifest.json: {expected}" in message, message
    rewrite_manifest(copy, good)
    (copy / "manifest.json").write_bytes(b"{not json")
    assert "not a readable JSON manifest" not in unchanged_after(lambda: mh.load_checkpoint(model, copy), model)


def test_a_changed_manifest_or_commit_record_is_refused(copy):
    """The commit record's checksum catches any change to the manifest; a damaged record is named."""
    model = gpt()
    data = bytearray((copy / "manifest.json").read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / "manifest.json").write_bytes(bytes(data))
    message = unchanged_after(lambda: mh.load_checkpoint(model, copy), model)
    assert "manifest.json: corrupt checkpoint file:" in message and "the commit record says" in message, message
    (copy / "commit.json").write_text("{}")
    message = unchanged_after(lambda: mh.load_checkpoint(model, copy), model)
    assert "commit.json: corrupt commit record: format" in message, message


def test_a_symlink_leading_outside_the_step_is_refused(copy, tmp_path):
    outside = tmp_path / "outside.safetensors"
    shutil.move(copy / "rank_1" / "checkpoint_rank1.safetensors", outside)
    os.symlink(outside, copy / "rank_1" / "checkpoint_rank1.safetensors")
    model = gpt()
    message = unchanged_after(lambda: mh.load_checkpoint(model, copy), model)
    assert "file(s) ['rank_1/checkpoint_rank1.safetensors'] lead outside the step directory" in message


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="directory: expected a path, got int"):
        mh.save_checkpoint(gpt(), 3)
    with pytest.raises(CheckpointError, match="directory: expected a path, got NoneType"):
        mh.load_checkpoint(gpt(), None)
    with pytest.raises(CheckpointError, match="model: expected a ParallelModel .* got dict"):
        mh.save_checkpoint({}, tmp_path)
    with pytest.raises(CheckpointError, match="optimizer: expected an nn.Optimizer, got list"):
        mh.save_checkpoint(gpt(), tmp_path, optimizer=[])
    for kwargs, expected in (({"step": -1}, "step: expected an int >= 0 or None, got -1"),
                             ({"step": True}, "step: expected an int >= 0 or None, got True"),
                             ({"keep_last": 0}, "keep_last: expected an int >= 1 or None, got 0"),
                             ({"chunk_bytes": 0}, "chunk_bytes: expected an int >= 1, got 0"),
                             ({"blocking": "no"}, "blocking: expected a bool, got 'no'")):
        with pytest.raises(CheckpointError, match=expected):
            mh.save_checkpoint(gpt(), tmp_path, **kwargs)
    with pytest.raises(CheckpointError, match="step: expected an int >= 0 or None, got '3'"):
        mh.load_checkpoint(gpt(), tmp_path, step="3")
    assert list(tmp_path.iterdir()) == []  # refused before anything was written
