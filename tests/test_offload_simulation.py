"""HyperOffload composes with the simulation: an offloaded model run on 8 simulated devices
(data 2 x tensor 4) trains like the resident single-device model."""
import numpy as np
import pytest
from mindspore import ops

from mindspore_hyper.offload import OffloadPolicy, hyper_offload
from mindspore_hyper.shard import Layout
from mindspore_hyper.sim import simulate

from test_offload_training import MLP, OPTIMIZERS, copy_model, data, make_store, reference_run


@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_offloaded_simulated_training_matches_resident(tmp_path, opt_name, clean_context):
    clean_context.set_context(device_num=8)
    x, y = data()
    base = MLP()
    ref_losses, ref_params = reference_run(copy_model(base), OPTIMIZERS[opt_name], x, y)

    model = copy_model(base)
    strategy = Layout((2, 4), ("data", "tensor"))(tensor_map=(), optimizer_state="data")
    strategy.override("layers.0.*", "tensor").override("layers.1.weight", None, "tensor")  # column + row
    sim = simulate(model, strategy)
    store = make_store(tmp_path)
    off = hyper_offload(model, OffloadPolicy(cells=["layers.*"]), optimizer=OPTIMIZERS[opt_name], store=store)
    step = off.train_step(lambda a, b: ops.reduce_mean((sim(a) - b) ** 2))
    losses = [float(step(x, y).asnumpy()) for _ in range(5)]

    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=1e-6)
    values = off.parameter_values()
    for name, ref in ref_params.items():  # relative error in the 2-norm, as in test_sim_training
        rel = np.linalg.norm(values[name].astype(np.float64) - ref) / np.linalg.norm(ref)
        assert rel <= 1e-5, f"{name}: relative error {rel:.2e} after 5 steps"
    stats = off.stats()
    assert 0 < stats["device"]["peak_bytes"] <= store.device_memory
    report = sim.report()
    assert report.fallbacks == {}  # the hook ops MindSpore inserts for offload keep the sharding
    assert report.comm["AllReduce"]["tensor"]["count"] == 1  # the row-parallel layer really ran sharded
    off.remove()
    store.close()
