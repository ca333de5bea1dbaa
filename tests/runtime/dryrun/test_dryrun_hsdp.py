"""The dry run of hsdp steps on plain batches (the gradient scaled by the group size; a float16
model reduced in float32) reports what the numeric simulation reports, exactly."""
from script_reports import api_reports


def test_hsdp_steps_dry_run_like_their_simulation(fresh_session, tmp_path):
    sim, dry = (api_reports("hp_hsdp_script.py", mode, tmp_path) for mode in ("simulation", "dryrun"))
    assert len(sim) == 1 and sim == dry  # every figure: parameters, peak, memory timeline, ops, collectives
    (gathers,) = [c for c in dry[0]["collectives"] if c["kind"] == "AllGather" and c["phase"] == "forward"]
    # each model's 4 Parameters gathered over dp_shard once; a device sends its half of each, the
    # float16 model's in float32 too (reduce_dtype: its gather's backward reduce-scatters float32)
    assert gathers["count"] == 8
    assert gathers["send_bytes_per_device"] == 2 * (32 * 16 + 32 + 16 * 32 + 16) // 2 * 4


def test_gradient_accumulation_without_sync_is_refused_by_the_dry_run(fresh_session):
    """Its running sums are values; the dry run names what it does not model instead of a MindSpore
    error about an uninitialised tensor."""
    import numpy as np
    import pytest
    from mindspore import Tensor, nn

    from mindspore_hyper.hyper_parallel import fully_shard, hsdp, init_device_mesh, parallelize_value_and_grad

    fresh_session.set_context(mode="dryrun", device_num=4)
    init_device_mesh("npu", (4,), mesh_dim_names=("dp",))
    model = hsdp(nn.Dense(16, 16), threshold=0, enable_grad_accumulation=True)
    model.set_requires_grad_sync(False)
    with pytest.raises(NotImplementedError, match=r"dry run: '.*weight'.s gradient is accumulated across backwards "
                                                  r"\(hsdp\(enable_grad_accumulation=True\)"):
        parallelize_value_and_grad(lambda x: model(x).sum(), model.trainable_params())(Tensor(np.ones((8, 16),
                                                                                                  np.float32)))
    deferred = fully_shard(nn.Dense(16, 16))
    deferred.set_requires_gradient_sync(False)
    with pytest.raises(NotImplementedError, match="set_requires_gradient_sync\\(False\\)\\): its running sums"):
        parallelize_value_and_grad(lambda x: deferred(x).sum(), deferred.trainable_params())(Tensor(np.ones((8, 16),
                                                                                                        np.float32)))
