"""Tuners run real offloaded training steps for each candidate and return the best with data."""
import io

import numpy as np
import pytest

from mindspore import Tensor, nn, ops

from mindspore_hyper.offload import (OffloadPolicy, OffloadStore, hyper_offload, tune_block_size,
                                     tune_prefetch_depth)

from sim_models import DenseStack

pytestmark = pytest.mark.usefixtures("pynative")


def build(tmp_path, block_size, device_blocks=4, dim=32):
    model = DenseStack(dim=dim)
    store = OffloadStore(block_size=block_size, device_memory=device_blocks * block_size,
                         host_memory=6 * block_size, offload_dir=str(tmp_path), prefetch_depth=2)
    off = hyper_offload(model, OffloadPolicy(cells=["layers.*"]),
                        optimizer=lambda ps: nn.SGD(ps, learning_rate=0.01), store=store)
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((8, dim)).astype(np.float32))
    y = Tensor(rng.standard_normal((8, 1)).astype(np.float32))
    step = off.train_step(lambda a, b: ops.reduce_mean((model(a) - b) ** 2))
    return (lambda: step(x, y)), store


def test_tune_prefetch_depth(tmp_path):
    # 64x64 float32 weights of 16KB: each layer's parameters take 2 blocks (weight, packed bias),
    # so the 4 layers do not fit the 6 device blocks at once (its update's 5 blocks do).
    run_step, store = build(tmp_path, 16384, device_blocks=6, dim=64)
    out = io.StringIO()
    result = tune_prefetch_depth(run_step, store, candidates=(0, 1, 2), steps=2, warmup=1, stream=out)
    assert set(result.measurements) == {0, 1, 2}
    assert result.best in (0, 1, 2) and store.prefetch_depth == result.best
    best = result.measurements[result.best]["step_s"]
    assert all(best <= m["step_s"] for m in result.measurements.values())
    # depth 0 = no prefetch: nothing issued, every block not already on the device is a miss
    assert result.measurements[0]["issued"] == 0 and result.measurements[2]["issued"] > 0
    assert result.measurements[2]["misses"] < result.measurements[0]["misses"]
    assert "tune prefetch_depth" in out.getvalue() and "9/9" in out.getvalue()  # progress bar
    assert "<- best" in result.table()
    store.close()


def test_tune_block_size_skips_candidates_that_do_not_fit(tmp_path):
    out = io.StringIO()
    # A 32x32 float32 weight is 4KB; with 1KB blocks and 4 device blocks a layer cannot fit.
    result = tune_block_size(lambda bs: build(tmp_path, bs), candidates=(1024, 8192, 16384), steps=1,
                             warmup=1, stream=out)
    assert "error" in result.measurements[1024] and "cannot run offloaded" in result.measurements[1024]["error"]
    assert result.best in (8192, 16384)
    assert all("step_s" in result.measurements[b] for b in (8192, 16384))
    assert "tune cache_block_size" in out.getvalue()
