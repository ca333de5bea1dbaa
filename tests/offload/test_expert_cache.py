"""Hot-expert cache over the offload store: values intact, routing-statistics priorities give
fewer cold fetches than plain LRU on skewed routing."""
import numpy as np
import pytest

from mindspore_hyper.offload.expert_cache import HotExpertCache


def _trace(steps, experts, seed=0):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, experts + 1)
    p = p[rng.permutation(experts)] / p.sum()
    return [rng.choice(experts, size=24, p=p) for _ in range(steps)]


def test_fetch_returns_the_weights_and_counts_cold_fetches():
    weights = [np.arange(1000, dtype=np.float32) + 1000 * e for e in range(6)]
    cache = HotExpertCache(weights, capacity=2, policy="lru")
    try:
        for e in (0, 1, 0, 2, 0, 5):
            np.testing.assert_array_equal(cache.fetch(e), weights[e])
        # 0 cold, 1 cold, 0 hit, 2 cold (evicts 1), 0 hit, 5 cold
        assert cache.cold_fetches == 4 and cache.fetches == 6
        assert cache.resident(0) and cache.resident(5) and not cache.resident(1)
    finally:
        cache.close()


def test_routing_priorities_beat_lru_on_skewed_routing():
    experts = 32
    weights = [np.full(2048, e, np.float32) for e in range(experts)]
    trace = _trace(25, experts)
    cold = {}
    for policy in ("lru", "routing"):
        cache = HotExpertCache(weights, capacity=8, policy=policy)
        try:
            per_step = []
            for used in trace:
                per_step.append(cache.step(used)["cold_fetches"])
                cache.observe(np.bincount(used, minlength=experts))
            cold[policy] = sum(per_step[5:])
            np.testing.assert_array_equal(cache.fetch(3), weights[3])
        finally:
            cache.close()
    assert cold["routing"] < cold["lru"], cold


def test_bad_arguments():
    w = [np.zeros(8, np.float32)] * 3
    with pytest.raises(ValueError, match="policy='mru'; expected 'routing' or 'lru'"):
        HotExpertCache(w, 1, policy="mru")
    with pytest.raises(ValueError, match=r"capacity=4 must be in 1..3 experts"):
        HotExpertCache(w, 4)
    with pytest.raises(ValueError, match="experts have different sizes"):
        HotExpertCache([np.zeros(8, np.float32), np.zeros(4, np.float32)], 1)
