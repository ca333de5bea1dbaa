"""The dry run of HyperParallel-API work on uneven pieces (torch.chunk: 7 rows over 4 devices
2, 2, 2, 1; 3 rows 1, 1, 1, 0) reports what the numeric simulation reports, exactly, and refuses
what the simulation refuses, by name."""
import pytest
from mindspore import Tensor, ops

from script_reports import api_reports


def test_uneven_pieces_dry_run_like_their_simulation(fresh_session, tmp_path):
    (sim,), (dry,) = (api_reports("hp_uneven_script.py", mode, tmp_path) for mode in ("simulation", "dryrun"))
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
