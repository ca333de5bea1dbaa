"""MindSpore 2.10 caches a wrong Softmax backward after one over an axis of size 1; the package
rebuilds it (mindspore_hyper/softmax_backward_cache.py). Each case runs in a fresh process
(softmax_cache_case.py): the cache is per process and every test of this suite's workers has
already built it.

- clean: the guard first, then a softmax over one key: a later softmax gradient equals numpy's;
  the attention Cell's gradients on one device are the reference.
- poison: the softmax over one key first. MindSpore's later rank-5 softmax gradients are then
  wrong (measured; were MindSpore fixed, the guard must stay silent); `auto_parallelize` repairs
  the cache and says so, and the attention Cell simulated on 4 devices (its softmax runs on
  5-D stacked shards) has the clean process's one-device gradients. Without the guard its query
  and key gradients came out 1.0-2.2 times off (measured when the guard was written).
"""
import json
import subprocess
import sys

import numpy as np
import pytest

from paths import REPO_ROOT

CASE = REPO_ROOT / "tests" / "runtime" / "simulation" / "softmax_cache_case.py"
FLOAT32_EPS = float(np.finfo(np.float32).eps)


def run_case(case, out):
    done = subprocess.run([sys.executable, str(CASE), case, str(out)], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.with_suffix(".json").read_text()), dict(np.load(str(out) + ".npz"))


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("softmax_cache")
    return {case: run_case(case, root / case) for case in ("clean", "poison")}


def test_guarded_first_a_softmax_over_one_key_leaves_later_gradients_right(cases):
    record, _ = cases["clean"]
    assert record["size_one_gradient"] == 0.0  # softmax over one element is 1 whatever the input
    assert record["warnings"] == []
    assert record["error_after"] <= 8 * FLOAT32_EPS  # values and weights of size <= 2: a few roundings


def test_a_wrong_cached_backward_is_repaired_named_and_the_simulation_equals_one_device(cases):
    record, simulated = cases["poison"]
    _, reference = cases["clean"]
    mindspore_wrong = record["error_before"] > 1e-3  # a wrong backward is off by about 0.1-0.5 here
    assert len(record["warnings"]) == (1 if mindspore_wrong else 0), record
    if mindspore_wrong:
        assert "float32 rank 5 dim -1" in record["warnings"][0] and "were wrong" in record["warnings"][0]
    assert record["error_after"] <= 8 * FLOAT32_EPS
    assert sorted(simulated) == sorted(reference)
    floor = 1e-3 * max(float(np.abs(g).max()) for g in reference.values())  # the key bias's gradient is 0 exactly
    for name, want in reference.items():
        # 4 devices sum the batch's gradient in another order than one device: float32 rounding of O(1) sums
        err = float(np.abs(simulated[name] - want).max()) / max(float(np.abs(want).max()), floor)
        assert err <= 1e-5, (name, err)


def test_clearing_mindspores_caches_builds_the_backwards_again(monkeypatch):
    """`autodiff.reset_after_failure` clears MindSpore's PyNative caches (the guard's backwards
    with them): the next ensure call builds them again; otherwise one call per process builds."""
    from mindspore_hyper import softmax_backward_cache as cache
    from mindspore_hyper.autodiff import reset_after_failure

    builds = []
    with monkeypatch.context() as patch:
        patch.setattr(cache, "_build_and_check", lambda dtypes: builds.append(tuple(dtypes)) or [])
        cache.forget()
        cache.ensure_softmax_backward()
        cache.ensure_softmax_backward()
        assert len(builds) == 1
        reset_after_failure()
        cache.ensure_softmax_backward()
        assert len(builds) == 2
    cache.forget()
    cache.ensure_softmax_backward()  # the real backwards again, for this worker's later tests
    assert cache._build_and_check(["float32"]) == []


def test_the_model_names_the_dtypes_to_build():
    """auto_parallelize builds float32 and the model's other dtypes: float64 parameters, a Cell's
    to_float(float16); bfloat16 (no CPU Softmax kernel in MindSpore 2.10) is not built."""
    import mindspore as ms
    from mindspore import nn
    from mindspore_hyper.softmax_backward_cache import model_dtypes

    mixed = nn.SequentialCell([nn.Dense(2, 2), nn.Dense(2, 2).to_float(ms.float16)])
    wide = nn.Dense(2, 2)
    wide.weight.set_dtype(ms.float64)
    assert model_dtypes(mixed) == {"float32", "float16"}
    assert model_dtypes(wide) == {"float32", "float64"}
    assert model_dtypes(nn.Dense(2, 2).to_float(ms.bfloat16)) == {"float32"}
