"""The dry run of HyperParallel-API work on uneven pieces (torch.chunk: 7 rows over 4 devices
2, 2, 2, 1; 3 rows 1, 1, 1, 0) reports what the numeric simulation reports, exactly, and refuses
what the simulation refuses, by name."""
import gc
import json
import os

import pytest
from mindspore import Tensor, ops

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def fresh_session(pynative):
    from mindspore_hyper.hyper_parallel.session import reset_session

    reset_session()
    yield pynative
    reset_session()


def _report(mode, tmp_path):
    from mindspore_hyper.hyper_parallel.script_runner import run_script
    from mindspore_hyper.hyper_parallel.session import reset_session

    reset_session()
    gc.collect()  # models of earlier tests in this process would join the report while alive
    path = tmp_path / f"{mode}.json"
    assert run_script(os.path.join(HERE, "hp_uneven_script.py"), [], 4, str(path), mode=mode) == 0
    return [m for m in json.loads(path.read_text())["meshes"] if m["source"] == "HyperParallel API"]


def test_uneven_pieces_dry_run_like_their_simulation(fresh_session, tmp_path):
    (sim,), (dry,) = _report("simulation", tmp_path), _report("dryrun", tmp_path)
    assert sim == dry  # every figure: parameters, peak, memory timeline, ops, collectives
    # device 0 holds the largest pieces: 2 rows of up (5 + 1 wide), 1 row of down (7 + 1), float32
    assert dry["parameter_bytes_per_device"] == (2 * 5 + 2 + 1 * 7 + 1) * 4
    kinds = {(c["kind"], c["phase"]) for c in dry["collectives"]}
    assert {("AllGather", "forward"), ("AllToAll", "forward"), ("ReduceScatter", "forward")} <= kinds


@pytest.mark.parametrize("mode", ["simulation", "dryrun"])
def test_ops_that_need_equal_pieces_are_refused_in_both_modes(fresh_session, mode):
    import numpy as np

    from mindspore_hyper.dtensor.dispatch import DTensorOpError
    from mindspore_hyper.hyper_parallel import Shard, distribute_tensor, init_device_mesh

    fresh_session.set_context(mode=mode, device_num=4)
    mesh = init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
    d = distribute_tensor(Tensor(np.ones((7, 3), np.float32)), mesh, [Shard(0)])
    with pytest.raises(DTensorOpError, match=r"Concat: input 0 .* dimension 0 split into uneven pieces over 4"):
        ops.concat([d, d], 1)
